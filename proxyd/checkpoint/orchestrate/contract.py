"""The preemption contract of `proxy-cli run --checkpoint-dir DIR` (issue 25,
docs/cluster.md): what a scheduler's SIGTERM means for a gpuproxy job.

    no complete image in DIR  -> run CMD under the shim
    SIGTERM                   -> whole-process dump of CMD into DIR, exit 143
    a complete image in DIR   -> restore it into this node's proxyd instead of
                                 starting CMD, wait for it, exit with its status
    --checkpoint-every S      -> --leave-running dumps every S seconds
    --keep N                  -> at most N complete images stay

The same on a bare machine, as a container's PID 1 (Kubernetes, podman) and
in a Slurm batch step. The dump and restore themselves are the whole-process
ones of proxy-cli --dump/--restore (proxyd/checkpoint/orchestrate/whole_process.py); this module adds
the directory discipline, the signals, the job's identity and the waiting.

DIR's layout. Each checkpoint is a complete, independent whole-process image
(no parent chain, so any of them can be deleted):

    DIR/.lock              flock'ed by the one `proxy-cli run` using DIR
    DIR/.tmp-<n>/          a dump in progress: never read, removed at start
    DIR/ckpt-<n>/          a complete image; its job.json written last
    DIR/latest -> ckpt-<n> the image a restore uses

A dump is written into .tmp-<n>; its files and the folder are fsync'ed, it is
renamed to ckpt-<n> (atomic within DIR), DIR is fsync'ed, then `latest` is
replaced by a new symlink through rename (atomic). A crash, a SIGKILL after
the grace period or a full disk at any point leaves `latest` on the previous
complete image (or absent): never a half image. `latest` is removed when CMD
ends with status 0 (the job is done: a rerun starts afresh); after a failure
it stays, so a restarted job resumes from its last checkpoint.

The app's standard streams. CMD's stdout and stderr are pipes read by this
process and copied to its own (a Kubernetes log, Slurm's output file, a
terminal). A pipe held outside the dumped tree is what CRIU can hand to the
restored app on another node: the pipes' inodes are recorded in job.json,
and the restore passes new pipes with criu --inherit-fd. stdin is /dev/null.

SIGTERM and the app. Slurm signals every process of a job (proctrack), so
CMD is started with SIGTERM ignored (inherited through exec; an app that
installs its own handler still gets it): it must live until it is dumped.
SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 are passed on to CMD.

Waiting for a restored app. CRIU restores the tree under its old pid; with
--restore-detached criu exits once it runs and the tree is re-parented to
the nearest child subreaper. This process makes itself one
(prctl(PR_SET_CHILD_SUBREAPER), or is PID 1 of a container anyway), so the
restored app becomes its child: it is awaited with a pidfd and waitpid()
gives its real exit status, as for an app it started itself. (An atexit file
written by the shim would miss deaths by signal; polling /proc would lose the
status.)

Fresh pid namespaces. A container's processes have small pids. CRIU restores
the app's threads under their old thread ids, which must be free then; in a
fresh container the restore's own helper processes take the low pids. So
where this process is PID 1 of its namespace, CMD is started above pid 1000
(ns_last_pid, where writable).

Identity. job.json holds CMD's argv and the uid that ran it; an image of
another command or another user is refused with one line before anything is
restored. Across nodes, each node's proxyd must accept the image's seal: give
the nodes one key (GPUPROXY_KEY_DIR on shared storage, docs/security.md).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

JOB_FILE = "job.json"
LATEST = "latest"
CKPT = "ckpt-"
TMP = ".tmp-"
LOCK = ".lock"
JOB_VERSION = 1
EXIT_TERM = 143                       # 128 + SIGTERM: interrupted, not completed
FORWARDED = (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
PR_SET_CHILD_SUBREAPER = 36           # linux/prctl.h
FRESH_NS_PID_FLOOR = 1000


class ContractError(Exception):
    pass


def _whole_process():
    """The whole-process dump/restore (orchestrate/whole_process.py)."""
    from . import whole_process as W
    return W


def _client_cls():
    from ...client import ControlClient, ControlError
    return ControlClient, ControlError


# ---------------------------------------------------------------- DIR

def _seq(name: str, prefix: str) -> int | None:
    m = re.fullmatch(re.escape(prefix) + r"(\d+)", name)
    return int(m.group(1)) if m else None


def images(d: str) -> list[tuple[int, str]]:
    """Complete images in d, oldest first: [(n, path)]."""
    out = []
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    for n in names:
        s = _seq(n, CKPT)
        p = os.path.join(d, n)
        if s is not None and os.path.isfile(os.path.join(p, JOB_FILE)):
            out.append((s, p))
    return sorted(out)


def latest(d: str) -> str | None:
    """The image `latest` names, or None. A `latest` that names anything but
    a complete ckpt-<n> of d is refused (it was not written by this code)."""
    link = os.path.join(d, LATEST)
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ContractError(f"{link} is not a symlink to an image ({e.strerror})") from None
    if "/" in target or _seq(target, CKPT) is None:
        raise ContractError(f"{link} points to {target!r}, not to a ckpt-<n> image of {d}")
    p = os.path.join(d, target)
    if not os.path.isfile(os.path.join(p, JOB_FILE)):
        raise ContractError(f"{link} points to {target}, which is not a complete image (no {JOB_FILE})")
    return p


def _next_seq(d: str) -> int:
    n = 0
    for name in os.listdir(d):
        s = _seq(name, CKPT)
        if s is None:
            s = _seq(name, TMP)
        if s is not None:
            n = max(n, s)
    return n + 1


def _fsync_tree(path: str) -> None:
    """Every file and folder under path reaches the disk before the image is
    published (CRIU does not fsync its images)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            p = os.path.join(root, name)
            if os.path.islink(p):
                continue
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:          # some network file systems refuse fsync on a folder
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _write_json(path: str, obj: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def publish(d: str, tmp: str, seq: int, job: dict) -> str:
    """tmp (a finished dump) becomes ckpt-<seq> and `latest`, atomically."""
    _write_json(os.path.join(tmp, JOB_FILE), job)
    _fsync_tree(tmp)
    final = os.path.join(d, f"{CKPT}{seq}")
    os.rename(tmp, final)
    _fsync_dir(d)
    link_tmp = os.path.join(d, f".{LATEST}.{os.getpid()}")
    try:
        os.unlink(link_tmp)
    except FileNotFoundError:
        pass
    os.symlink(f"{CKPT}{seq}", link_tmp)
    os.replace(link_tmp, os.path.join(d, LATEST))
    _fsync_dir(d)
    return final


def prune(d: str, keep: int) -> list[str]:
    """Removes the oldest complete images beyond keep; never `latest`."""
    try:
        cur = latest(d)
    except ContractError:
        cur = None
    imgs = images(d)
    gone = []
    for _s, p in imgs[:max(0, len(imgs) - keep)]:
        if cur and os.path.samefile(p, cur):
            continue
        shutil.rmtree(p, ignore_errors=True)
        gone.append(p)
    if gone:
        _fsync_dir(d)
    return gone


def clean_tmp(d: str) -> list[str]:
    """Dumps that never finished (the previous holder of DIR was killed)."""
    gone = []
    for name in os.listdir(d):
        if _seq(name, TMP) is not None or name.startswith(f".{LATEST}."):
            p = os.path.join(d, name)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
            gone.append(name)
    return gone


def job_identity(argv: list[str]) -> dict:
    return {"argv": list(argv), "uid": os.geteuid()}


def check_identity(img: str, want: dict) -> dict:
    """job.json of img, refusing an image of another command or user."""
    p = os.path.join(img, JOB_FILE)
    try:
        with open(p) as f:
            job = json.load(f)
    except (OSError, ValueError) as e:
        raise ContractError(f"{p} is unreadable ({e}); refusing the image") from None
    if not isinstance(job, dict) or job.get("version") != JOB_VERSION:
        raise ContractError(f"{p} is not a job record of this gpuproxy (version {job.get('version')!r} "
                            f"if any); refusing the image")
    if job.get("uid") != want["uid"]:
        raise ContractError(f"the image {img} was made by uid {job.get('uid')}, not by uid {want['uid']}; "
                            f"refusing to restore another user's job")
    if job.get("argv") != want["argv"]:
        raise ContractError(f"the image {img} is of another command ({_cmdline(job.get('argv'))}), not "
                            f"{_cmdline(want['argv'])}; refusing to restore it (use another --checkpoint-dir)")
    return job


def _cmdline(argv) -> str:
    import shlex
    try:
        return " ".join(shlex.quote(str(a)) for a in argv)
    except TypeError:
        return repr(argv)


# ---------------------------------------------------------------- processes

def become_subreaper() -> bool:
    """Orphans of our descendants (the tree CRIU restores) become ours."""
    if os.getpid() == 1:
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _raise_pid_floor() -> None:
    if os.getpid() > 1:
        return
    try:
        with open("/proc/sys/kernel/ns_last_pid", "r+") as f:
            if int(f.read().strip() or 0) < FRESH_NS_PID_FLOOR:
                f.seek(0)
                f.write(str(FRESH_NS_PID_FLOOR))
    except (OSError, ValueError):
        pass          # not writable here: the app keeps its low pid


def _ignore_term() -> None:          # runs in the child between fork and exec
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def exit_code(status: int) -> int:
    """A waitpid status as a shell reports it (128+N for signal N)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class _Relay(threading.Thread):
    """Copies one of the app's pipes to one of our fds until EOF."""

    def __init__(self, rfd: int, out_fd: int):
        super().__init__(daemon=True)
        self.rfd, self.out_fd = rfd, out_fd

    def run(self):
        try:
            while True:
                try:
                    b = os.read(self.rfd, 65536)
                except InterruptedError:
                    continue
                if not b:
                    return
                mv = memoryview(b)
                while len(mv):
                    try:
                        mv = mv[os.write(self.out_fd, mv):]
                    except BrokenPipeError:
                        mv = mv[len(mv):]        # our reader left: keep draining the app's pipe
        finally:
            os.close(self.rfd)


# ---------------------------------------------------------------- the runner

# "Checkpoint now" (a --leave-running checkpoint, the app runs on): what the
# Kubernetes node agent sends a wrapper before a drain or on a spot notice
# (k8s/agent.py). SIGUSR1/2 are the app's own (forwarded), so a real-time one.
CHECKPOINT_NOW = signal.SIGRTMIN + 2


class Runner:
    """One `proxy-cli run --checkpoint-dir`. run() returns the exit status."""

    def __init__(self, argv: list[str], ckpt_dir: str, endpoint: str, env: dict, every: float | None = None,
                 keep: int = 2, timeout_s: float = 600.0, prog: str = "proxy-cli run"):
        self.argv = list(argv)
        self.dir = os.path.abspath(ckpt_dir)
        self.endpoint = endpoint
        self.env = env
        self.every = every
        self.keep = max(1, keep)
        self.timeout_s = timeout_s
        self.prog = prog
        self.job = job_identity(argv)
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.pipes: dict[str, int] = {}        # "1"/"2" -> inode of the app's pipe
        self.relays: list[_Relay] = []
        self.term = False
        self.now = False                       # CHECKPOINT_NOW arrived: one checkpoint, the app runs on
        self.status: int | None = None
        self._wake_r = self._wake_w = -1
        self._lock_fd = -1

    # -- output
    def say(self, msg: str) -> None:
        print(f"{self.prog}: {msg}", file=sys.stderr, flush=True)

    def client(self):
        ControlClient, _ = _client_cls()
        return ControlClient(self.endpoint, timeout_s=self.timeout_s)

    # -- set-up
    def _signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

        def on_term(signum, frame):
            self.term = True

        def forward(signum, frame):
            if self.pid:
                try:
                    os.kill(self.pid, signum)
                except ProcessLookupError:
                    pass
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(CHECKPOINT_NOW, lambda signum, frame: setattr(self, "now", True))
        for s in FORWARDED:
            signal.signal(s, forward)

    def _lock(self) -> None:
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ContractError(f"{self.dir} is in use by another `proxy-cli run --checkpoint-dir` "
                                f"(its {LOCK} is locked); one job per checkpoint directory") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        self._lock_fd = fd

    def _new_pipes(self) -> tuple[dict[str, int], dict[str, int]]:
        """({"1": write end, "2": ...}, {"1": read end, ...}); the read ends
        stay ours (close-on-exec), the write ends go to the app."""
        w, r = {}, {}
        for k in ("1", "2"):
            rfd, wfd = os.pipe2(os.O_CLOEXEC)
            r[k], w[k] = rfd, wfd
        return w, r

    def _start_relays(self, r: dict[str, int]) -> None:
        for k, rfd in r.items():
            t = _Relay(rfd, int(k))
            t.start()
            self.relays.append(t)

    def _watch(self, pid: int) -> None:
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)

    # -- start and restore
    def spawn(self) -> None:
        _raise_pid_floor()
        w, r = self._new_pipes()
        try:
            p = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=w["1"],
                                 stderr=w["2"], start_new_session=True, preexec_fn=_ignore_term)
        except OSError as e:
            for fd in list(w.values()) + list(r.values()):
                os.close(fd)
            raise ContractError(f"cannot run {self.argv[0]}: {e.strerror}") from None
        self.pipes = {k: os.fstat(fd).st_ino for k, fd in w.items()}
        for fd in w.values():
            os.close(fd)
        p.returncode = 0           # the Popen object must not reap it: we wait with waitpid
        self._watch(p.pid)
        self._start_relays(r)

    def restore(self, img: str) -> None:
        W = _whole_process()
        job = check_identity(img, self.job)
        st = W.restore_state(img)
        w, r = self._new_pipes()
        inherit = {}
        for k, ino in (job.get("pipes") or {}).items():
            if k in w and isinstance(ino, int):
                inherit[w[k]] = f"pipe:[{ino}]"
        try:
            res = W.restore(self.client(), self.endpoint, img, {}, st, rollback_files=True, inherit=inherit)
        finally:
            for fd in w.values():
                os.close(fd)
        self.pipes = {k: os.fstat(r[k]).st_ino for k in r}
        pid = int(res["pid"])
        self._watch(pid)
        self._start_relays(r)
        self.say(f"restored {_cmdline(self.argv)} from {img} (pid {pid}, GPU {res['gpu'].get('total_ms', 0):.0f} ms,"
                 f" CRIU {res['criu_ms']:.0f} ms)")

    # -- checkpoints
    def is_client(self) -> bool:
        _, ControlError = _client_cls()
        try:
            st = self.client().call("status")
        except ControlError:
            return False
        return any(int(s.get("pid") or 0) == self.pid for s in st.get("sessions", []))

    def checkpoint(self, final: bool) -> str:
        """A whole-process dump of the app into a fresh .tmp-<n>, published
        when complete. final: the app is gone afterwards (CRIU ends it)."""
        W = _whole_process()
        seq = _next_seq(self.dir)
        tmp = os.path.join(self.dir, f"{TMP}{seq}")
        try:
            res = W.dump(self.client(), self.endpoint, self.pid, tmp, leave_running=not final)
            # the app's stall as its shim measured it (first thread held to
            # all running again: interceptor/park.c), else (an older shim)
            # park to resume as the orchestrator saw it; never the wrapper's
            # whole dump
            app = res.get("app_stopped_ms")
            job = dict(self.job, version=JOB_VERSION, pipes=self.pipes, host=socket.gethostname(),
                       time=time.time(), kind="final" if final else "periodic",
                       stall_ms=app if app is not None else res["stall_ms"],
                       stall_from="app" if app is not None else "orchestrator")
            path = publish(self.dir, tmp, seq, job)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        prune(self.dir, self.keep)
        return path

    # -- the loop
    def _reap(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        os.close(self.pidfd)
        self.pidfd = None
        return status

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _on_term(self) -> int:
        if not self.is_client():
            self.say(f"SIGTERM before {self.argv[0]} made its first CUDA call (pid {self.pid} is no client of "
                     f"proxyd at {self.endpoint} yet): nothing to checkpoint; {self._kept()}; ending it")
            self._kill()
            return EXIT_TERM
        try:
            path = self.checkpoint(final=True)
        except Exception as e:       # whatever failed, one line and no half image (never a traceback)
            self.say(f"SIGTERM: the checkpoint failed: {e}; {self._kept()}; ending the app")
            self._kill()
            return EXIT_TERM
        self._reap()               # CRIU ended it
        self.say(f"SIGTERM: checkpointed pid {self.pid} into {path}; exit {EXIT_TERM}")
        return EXIT_TERM

    def _kept(self) -> str:
        try:
            cur = latest(self.dir)
        except ContractError:
            cur = None
        return f"{self.dir} keeps {'its image ' + os.path.basename(cur) if cur else 'no image'}"

    def _kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reap()

    def _periodic(self) -> None:
        if not self.is_client():
            return                          # no CUDA call yet: nothing to checkpoint
        try:
            path = self.checkpoint(final=False)
            self.say(f"checkpoint {os.path.basename(path)} of pid {self.pid} written (the app runs on)")
        except Exception as e:
            self.say(f"periodic checkpoint failed: {e}; {self._kept()}; the app runs on")

    def wait(self) -> int:
        next_ckpt = time.monotonic() + self.every if self.every else None
        while True:
            if self.term:
                return self._on_term()
            timeout = None if next_ckpt is None else max(0.0, next_ckpt - time.monotonic())
            try:
                ready, _, _ = select.select([self.pidfd, self._wake_r], [], [], timeout)
            except InterruptedError:
                continue
            if self._wake_r in ready:
                self._drain_wakeups()
            if self.pidfd in ready:
                return exit_code(self._reap())
            if self.now and not self.term:
                self.now = False
                self._periodic()
            if next_ckpt is not None and time.monotonic() >= next_ckpt and not self.term:
                self._periodic()
                next_ckpt = time.monotonic() + self.every

    def finish(self, code: int) -> int:
        for t in self.relays:
            t.join(timeout=10)
        if code == 0:
            try:
                os.unlink(os.path.join(self.dir, LATEST))     # done: a rerun starts afresh
                _fsync_dir(self.dir)
            except FileNotFoundError:
                pass
        return code

    def run(self) -> int:
        _, ControlError = _client_cls()
        W = _whole_process()
        self._signals()
        try:
            self._lock()
            for name in clean_tmp(self.dir):
                self.say(f"removed {name} in {self.dir}: a checkpoint that never finished")
            img = latest(self.dir)
            become_subreaper()
            if img:
                self.restore(img)
            else:
                self.spawn()
        except (ContractError, W.WholeProcessError, ControlError, OSError) as e:
            self.say(str(e) if not isinstance(e, OSError) else f"{self.dir}: {e.strerror or e}")
            return 1
        except Exception as e:       # an unreadable image and the like: one line, never a traceback
            self.say(f"cannot start from {self.dir}: {e}")
            return 1
        return self.finish(self.wait())


def run(argv: list[str], ckpt_dir: str, endpoint: str, env: dict, every: float | None = None, keep: int = 2,
        timeout_s: float = 600.0) -> int:
    return Runner(argv, ckpt_dir, endpoint, env, every=every, keep=keep, timeout_s=timeout_s).run()
