"""The shared host pool: page-locked host memory that outlives workers, held
by the supervisor as file descriptors and lent to one worker at a time
(issue 23, target 4; docs/architecture.md, "Shared host pool").

Why: a worker's first dump used to page-lock its staging memory itself
(pinned_pool.py; 1-2 s for 8 GiB on the H100), and every new worker paid it
again. Memory made with cuMemCreate on the host (CU_MEM_LOCATION_TYPE_
HOST_NUMA) and exported as a POSIX file descriptor stays page-locked as long
as any descriptor of it is open, in any process (docs/benchmarks.md: the
creator may exit); another process imports and maps 8 GiB of it in about
0.22 s. So the supervisor, which never touches the GPU, keeps such
descriptors and passes them (SCM_RIGHTS, core/host_pool_wire.py) to the
next worker that needs staging memory. On the emulated backend the memory
is a memfd, so the descriptor passing, the ownership rules and the clean-up
are the same code, tested without a GPU.

Rules:
* off unless $GPUPROXY_HOST_POOL_MB (the most bytes held for all users
  together) is set; a pool not lent for $GPUPROXY_HOST_POOL_KEEP_S (300)
  seconds is closed, so idle memory goes back;
* one pool per client user (the session's uid, as the session table has
  it); a worker gets only the pool of its own session's user: pages a
  worker wrote for one user never reach another user's worker (they are
  not zeroed: they only ever go back to the same user). A session with no
  known user (a remote client without a keyed user) gets none;
* one worker at a time: a pool is lent whole, until that worker returns it
  or exits (its socket closes); another worker of the same user meanwhile
  gets none and uses memory of its own;
* the memory is made by a worker (the supervisor cannot make GPU memory)
  and given: the supervisor only holds, lends and closes descriptors. It
  never maps them; nothing has a name in /dev/shm;
* kept images (restore from host memory, checkpoint/memory_restore.py): a
  worker whose dump left an image's memory in the pool says so ("keep":
  the image's manifest sha256 and where its chunks lie, with a digest of their
  hashes); the note is dropped before anything may write to the pool again
  (the holder's "keep" with none, any lease other than the restore of that
  image, a larger pool replacing it, `discard`, or the pool's close). A
  lease that names the image gets the note with the descriptor; the
  restoring worker checks the digest against the image's manifest and every
  chunk's hash on the device, so a stale note costs only the files' speed.
  The pool is the image's user's (a restore's worker borrows the pool of
  the image's owner, whom the supervisor authorised: daemon.py ctl_restore).

Locking: the supervisor's loop thread only (its sockets are polled with the
workers' control sockets).
"""
from __future__ import annotations

import logging
import os
import socket
import time

from ..core import host_pool_wire as W

log = logging.getLogger("proxyd")
KINDS = ("memfd", "cuda")


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        log.warning("%s=%r is not a number; using %d", name, os.environ.get(name), default)
        return default


class Pool:
    def __init__(self, uid: int, kind: str, fd: int, size: int, lent_to):
        self.uid, self.kind, self.fd, self.size = uid, kind, fd, size
        self.lent_to = lent_to
        self.idle_since = time.monotonic()
        self.kept: dict | None = None      # what an image left here (see the module comment)


class HostPools:
    def __init__(self, limit_bytes: int | None = None, keep_s: float | None = None):
        self.limit = limit_bytes if limit_bytes is not None else _env_int("GPUPROXY_HOST_POOL_MB", 0) << 20
        self.keep_s = keep_s if keep_s is not None else float(_env_int("GPUPROXY_HOST_POOL_KEEP_S", 300))
        self.pools: dict[int, Pool] = {}
        self.chans: dict[object, socket.socket] = {}      # worker -> the supervisor's end

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def held(self) -> int:
        return sum(p.size for p in self.pools.values())

    # ------------------------------------------------------------ workers
    def channel_for(self, wk) -> int | None:
        """A socket pair for a worker about to start: returns the worker's
        end (to pass down; the caller closes it after the start), or None
        when the pool is off."""
        if not self.enabled:
            return None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setblocking(False)
        self.chans[wk] = mine
        return theirs.detach()

    def rebind(self, old_key, wk) -> None:
        """channel_for ran before the Worker object existed: key it by it."""
        if old_key in self.chans:
            self.chans[wk] = self.chans.pop(old_key)

    def fileno(self, wk) -> int | None:
        s = self.chans.get(wk)
        return s.fileno() if s is not None else None

    def worker_gone(self, wk) -> None:
        s = self.chans.pop(wk, None)
        if s is not None:
            s.close()
        for p in self.pools.values():
            if p.lent_to is wk:
                p.lent_to = None
                p.idle_since = time.monotonic()

    def on_message(self, wk, uid: int | None) -> None:
        s = self.chans.get(wk)
        if s is None:
            return
        try:
            msg, fds = W.recv(s)
        except BlockingIOError:
            return
        except OSError as e:
            log.info("host pool: worker %s: %s", getattr(wk, "pid", "?"), e)
            msg, fds = None, []
        if msg is None:
            self.worker_gone(wk)
            return
        try:
            reply = self._handle(wk, uid, msg, fds)
        except Exception as e:       # a worker's message is never worth the supervisor
            log.warning("host pool: message of worker %s refused: %s", getattr(wk, "pid", "?"), e)
            reply = ({"ok": False, "why": f"refused: {e}"}, ())
            for fd in fds:
                _close(fd)
        try:
            W.send(s, *reply)
        except OSError as e:
            log.info("host pool: cannot answer worker %s: %s", getattr(wk, "pid", "?"), e)

    def _handle(self, wk, uid, msg, fds):
        op = msg.get("op")
        if op == "keep":
            for fd in fds:
                _close(fd)
            return self._keep(wk, uid, msg.get("keep")), ()
        if op == "return":
            for fd in fds:
                _close(fd)
            for p in self.pools.values():
                if p.lent_to is wk:
                    p.lent_to = None
                    p.idle_since = time.monotonic()
            return {"ok": True}, ()
        kind, size = msg.get("kind"), msg.get("size")
        if kind not in KINDS or not isinstance(size, int) or size <= 0:
            for fd in fds:
                _close(fd)
            return {"ok": False, "why": "malformed request"}, ()
        if uid is None:
            for fd in fds:
                _close(fd)
            return {"ok": False, "why": "the worker's session has no known user", "may_give": False}, ()
        p = self.pools.get(uid)
        if op == "lease":
            for fd in fds:
                _close(fd)
            image = msg.get("image")
            if image is not None:
                # a restore asks for the memory an image left here, or nothing: the pool's
                # note stays for the restore it belongs to
                if p is None or p.lent_to is not None or p.kind != kind or p.kept is None \
                        or p.kept.get("image") != image:
                    return {"ok": False, "why": "no memory of that image kept", "may_give": False}, ()
                kept, p.kept = p.kept, None
                p.lent_to = wk
                return {"ok": True, "kind": kind, "size": p.size, "kept": kept}, (p.fd,)
            if p is not None and p.lent_to is None and p.kind == kind and p.size >= size:
                if p.kept is not None:
                    log.info("host pool: uid %d: the memory kept of %s goes to a new lease", uid, p.kept.get("image"))
                p.kept = None          # the borrower writes to it
                p.lent_to = wk
                return {"ok": True, "kind": kind, "size": p.size}, (p.fd,)
            if p is not None and p.lent_to is not None:
                return {"ok": False, "why": "this user's pool is lent to another worker", "may_give": False}, ()
            room = self.limit - self.held() + (p.size if p is not None else 0)
            return {"ok": False, "why": "no pool of that size for this user", "may_give": size <= room}, ()
        if op == "give":
            if len(fds) != 1:
                for fd in fds:
                    _close(fd)
                return {"ok": False, "why": "a pool is given as one descriptor"}, ()
            if p is not None and p.lent_to is not None and p.lent_to is not wk:
                _close(fds[0])
                return {"ok": False, "why": "this user's pool is lent to another worker"}, ()
            room = self.limit - self.held() + (p.size if p is not None else 0)
            if size > room:
                _close(fds[0])
                return {"ok": False, "why": f"GPUPROXY_HOST_POOL_MB: {size} bytes do not fit"}, ()
            if p is not None:
                self._drop(p, "replaced by a larger one")
            self.pools[uid] = Pool(uid, kind, fds[0], size, lent_to=wk)
            log.info("host pool: holding %d MiB of %s memory for uid %d", size >> 20, kind, uid)
            return {"ok": True}, ()
        for fd in fds:
            _close(fd)
        return {"ok": False, "why": f"unknown op {op!r}"}, ()

    MAX_KEEP_RUNS = 1024

    def _keep(self, wk, uid, keep) -> dict:
        """The holder's note on what an image left in its pool (None: it is
        about to write to it again)."""
        p = next((x for x in self.pools.values() if x.lent_to is wk), None)
        if p is None or uid is None or p.uid != uid:
            return {"ok": False, "why": "no pool lent to this worker"}
        if keep is None:
            p.kept = None
            return {"ok": True}
        runs = keep.get("runs") if isinstance(keep, dict) else None
        if not (isinstance(keep.get("image"), str) and isinstance(keep.get("digest"), bytes)
                and isinstance(runs, list) and 0 < len(runs) <= self.MAX_KEEP_RUNS
                and all(isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) and x >= 0 for x in r)
                        and r[1] + r[2] <= p.size for r in runs)):
            p.kept = None
            return {"ok": False, "why": "malformed keep note"}
        p.kept = {"image": keep["image"], "digest": keep["digest"], "runs": runs,
                  "bytes": sum(r[2] for r in runs)}
        return {"ok": True}

    def forget(self, uid: int | None = None, image: str | None = None) -> int:
        """Drops the notes of kept images (of uid, of image, or all): their
        restores read the files. The number dropped."""
        n = 0
        for p in self.pools.values():
            if p.kept is not None and (uid is None or p.uid == uid) and (image is None or p.kept["image"] == image):
                p.kept = None
                n += 1
        return n

    # ------------------------------------------------------------ upkeep
    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for p in list(self.pools.values()):
            if p.lent_to is None and now - p.idle_since > self.keep_s:
                self._drop(p, f"not used for {self.keep_s:g} s")

    def _drop(self, p: Pool, why: str) -> None:
        if self.pools.get(p.uid) is p:
            del self.pools[p.uid]
        _close(p.fd)
        log.info("host pool: %d MiB of uid %d closed (%s)", p.size >> 20, p.uid, why)

    def stats(self) -> dict:
        return {"limit": self.limit, "held": self.held(),
                "pools": [{"uid": p.uid, "kind": p.kind, "size": p.size, "lent": p.lent_to is not None,
                           "kept": None if p.kept is None else {"image": p.kept["image"], "bytes": p.kept["bytes"]}}
                          for p in self.pools.values()]}

    def close(self) -> None:
        for p in list(self.pools.values()):
            self._drop(p, "proxyd stops")
        for s in self.chans.values():
            s.close()
        self.chans.clear()


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
