"""CRIU for whole-process checkpoints: finding it, checking that it can work
here, and running its dump, pre-dump and restore on a gpuproxy client.

A gpuproxy client never opens /dev/nvidia* nor maps GPU memory: its GPU
state lives in proxyd. Once its shim has parked (closed its ZeroMQ sockets,
unmapped the memory it shares with proxyd), the process holds only what
stock CRIU knows how to save, so no CUDA plugin is involved.

Finding CRIU, first hit wins:
  1. $GPUPROXY_CRIU (a criu executable, or a wrapper such as install-criu's);
  2. the private install of scripts/install-criu: PREFIX/bin/criu with
     PREFIX = ${XDG_DATA_HOME:-~/.local/share}/gpuproxy/criu, then
     /opt/gpuproxy/criu (root's default);
  3. `criu` on PATH.
It must be CRIU >= 4 (3.x fails on 6.x kernels: "vdso: Unexpected rt vDSO
area bounds"), >= 4.2 on Linux >= 6.16 (older ones cannot dump sockets there), run by root or with CAP_CHECKPOINT_RESTORE (then CRIU's
--unprivileged mode is used), and `criu check` must pass.

Images: CRIU writes into the image's own sub-folder (criu/ of the gpuproxy
image directory), logs included (dump.log, pre-dump.log, restore.log). What
was done is recorded in the gpuproxy manifest under "criu" by
record_in_manifest(), only once CRIU has finished: a criu/ folder without
that record is an incomplete dump.

Options chosen from the process (criu(8), "dump" and "restore"):
  --tree PID                the app's whole process tree;
  --shell-job               when the tree has a terminal, or its session or
                            process group leader lies outside the tree
                            (CRIU refuses such a tree otherwise);
  --tcp-established         when it has established TCP connections, with
                            --network-lock nftables or skip where this
                            machine has no iptables-restore (network_lock());
  --leave-running           for periodic checkpoints;
  --track-mem / --prev-images-dir   incremental memory, where the kernel
                            tracks dirty memory (`criu check --feature
                            mem_dirty_track`);
  restore: --restore-detached --pidfile, with the dump's --shell-job and
  --tcp-established.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field

from ..core import procinfo

MIN_VERSION = (4, 0)
# Linux 6.16 refuses SO_PASSCRED/SO_PASSSEC on non-unix sockets; CRIU before
# 4.2 treats that as an error and cannot dump a process holding any inet
# socket (checkpoint-restore/criu issue 2718)
SOCKOPT_KERNEL, SOCKOPT_CRIU = (6, 16), (4, 2)
# linux/capability.h: CAP_CHECKPOINT_RESTORE is capability 40 (Linux 5.9)
CAP_CHECKPOINT_RESTORE = 40
SUBDIR = "criu"
RECORD_KEY = "criu"
LOG_LEVEL = "-v4"        # full logs: they are the only diagnosis of a failed dump or restore


class CriuError(Exception):
    """CRIU is missing, unusable here, or one of its runs failed."""


# ---------------------------------------------------------------- finding

def private_prefixes() -> list[str]:
    """Where scripts/install-criu installs (per user, then root's)."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return [os.path.join(data, "gpuproxy", "criu"), "/opt/gpuproxy/criu"]


def candidates() -> list[tuple[str, str]]:
    """(where it came from, path) in the order they are tried."""
    out = []
    env = os.environ.get("GPUPROXY_CRIU")
    if env:
        out.append(("$GPUPROXY_CRIU", env))
        return out            # named explicitly: nothing else is tried
    for p in private_prefixes():
        out.append((f"private install {p}", os.path.join(p, "bin", "criu")))
    on_path = shutil.which("criu")
    if on_path:
        out.append(("PATH", on_path))
    return out


@dataclass
class Criu:
    path: str
    source: str
    version: tuple
    version_text: str
    unprivileged: bool = False
    _features: dict = field(default_factory=dict)

    def argv(self, action: str, *args: str) -> list[str]:
        a = [self.path, action]
        if self.unprivileged:
            a.append("--unprivileged")
        return a + list(args)

    def run(self, action: str, *args: str, timeout: float | None = None,
            pass_fds: tuple = ()) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(action, *args), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, pass_fds=pass_fds)

    def feature(self, name: str) -> bool:
        """`criu check --feature NAME` passes (cached)."""
        if name not in self._features:
            self._features[name] = self.run("check", "--feature", name, timeout=60).returncode == 0
        return self._features[name]

    def network_lock(self) -> tuple[str | None, str]:
        """How CRIU keeps a dumped tree's TCP connections quiet
        (criu(8) --network-lock): its default, iptables, needs the
        iptables-restore programs, which a GPU node or a slim container may
        not have (CRIU then fails the dump: "Iptables configuration failed");
        nftables needs a CRIU built with it (`criu check --feature
        network-lock-nftables`); else "skip". Returns (option value or None
        for CRIU's default, why)."""
        if shutil.which("iptables-restore") and shutil.which("ip6tables-restore"):
            return None, "iptables"
        if self.feature("network-lock-nftables"):
            return "nftables", "no iptables-restore here; CRIU has nftables"
        # the tree is frozen while it is dumped, so connections inside it
        # (torchrun's rendezvous store and its ranks) carry nothing; data a
        # peer outside the tree sends meanwhile is acknowledged by the kernel
        # and, when the tree ends after the dump, not in the image
        return "skip", ("no iptables-restore and no nftables in CRIU: connections not locked (peers outside "
                        "the tree must not send during the dump)")

    def mem_tracking(self) -> bool:
        """The kernel tracks dirty memory (soft-dirty bits): CRIU's pre-dump
        and incremental dumps can then store only what changed."""
        return self.feature("mem_dirty_track")


def parse_version(text: str) -> tuple | None:
    m = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x or 0) for x in m.groups()) if m else None


def _version_of(path: str) -> tuple[tuple | None, str]:
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
    except OSError as e:
        return None, f"cannot run: {e.strerror}"
    except subprocess.TimeoutExpired:
        return None, "'--version' did not answer in 30 s"
    text = (r.stdout + r.stderr).strip()
    v = parse_version(text)
    if r.returncode != 0 or v is None:
        return None, f"'--version' failed: {text.splitlines()[-1] if text else 'exit status %d' % r.returncode}"
    return v, text.splitlines()[0]


def has_capability(cap: int, pid: str = "self") -> bool:
    """cap is in the effective set of pid (/proc/PID/status CapEff)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> cap & 1)
    except OSError:
        pass
    return False


def privilege_problem() -> str | None:
    """None when this process may run CRIU (root, or CAP_CHECKPOINT_RESTORE),
    else the reason."""
    if os.geteuid() == 0 or has_capability(CAP_CHECKPOINT_RESTORE):
        return None
    return ("CRIU needs root or CAP_CHECKPOINT_RESTORE (uid %d has neither): run proxy-cli as root, or give it "
            "the capability (e.g. `sudo setpriv --inh-caps +checkpoint_restore --ambient-caps "
            "+checkpoint_restore proxy-cli ...`), or use --gpu-only" % os.geteuid())


def find() -> Criu:
    """The CRIU to use; CriuError listing what was tried otherwise."""
    tried = []
    for source, path in candidates():
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            tried.append(f"{source}: {path} not found" if source != "PATH" else f"PATH: {path} not executable")
            continue
        v, text = _version_of(path)
        if v is None:
            tried.append(f"{source}: {path}: {text}")
            continue
        if v < MIN_VERSION:
            tried.append(f"{source}: {path} is CRIU {'.'.join(map(str, v))}; gpuproxy needs >= "
                         f"{'.'.join(map(str, MIN_VERSION))} (3.x fails on 6.x kernels with a vDSO layout error)")
            continue
        return Criu(path=path, source=source, version=v, version_text=text)
    if not shutil.which("criu") and not os.environ.get("GPUPROXY_CRIU"):
        tried.append("PATH: no criu")
    raise CriuError("no usable CRIU (" + "; ".join(tried) + "). Install it with scripts/install-criu, or name "
                    "one with GPUPROXY_CRIU")


def kernel_version() -> tuple:
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def usable() -> Criu:
    """find(), plus the privilege check and `criu check`: everything a
    whole-process checkpoint needs, checked before anything is touched."""
    c = find()
    why = privilege_problem()
    if why:
        raise CriuError(why)
    c.unprivileged = os.geteuid() != 0
    if kernel_version() >= SOCKOPT_KERNEL and c.version < SOCKOPT_CRIU:
        raise CriuError(f"{c.path} is CRIU {'.'.join(map(str, c.version))}, which cannot dump sockets on Linux "
                        f"{'.'.join(map(str, kernel_version()))} (>= 6.16 restricts SO_PASSCRED; fixed in CRIU 4.2): "
                        f"install a newer one with scripts/install-criu")
    try:
        r = c.run("check", timeout=120)
    except subprocess.TimeoutExpired:
        raise CriuError(f"'{c.path} check' did not finish in 120 s") from None
    if r.returncode != 0:
        out = (r.stdout + r.stderr).strip().splitlines()
        errs = [ln for ln in out if ln.startswith("Error")] or out[-3:]
        raise CriuError(f"'{c.path} check' fails on this machine ({c.version_text}): " + " | ".join(errs))
    return c


# ---------------------------------------------------------------- the process

def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    # comm may hold spaces and parentheses: the fields follow the last ')'
    return s[s.rindex(")") + 2:].split()


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (through every thread's children list)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                try:
                    with open(f"/proc/{p}/task/{t}/children") as f:
                        todo += [int(x) for x in f.read().split()]
                except OSError:
                    pass
        except OSError:
            pass
    return out


def _fd_targets(pid: int) -> list[str]:
    out = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
    except OSError:
        pass
    return out


def session_outside_namespace(tree: list[int]) -> int | None:
    """The first task of tree whose session id reads 0 in /proc/PID/stat: its
    session leader lives in an ancestor pid namespace (a job started inside a
    container by a shell outside it, `unshare --pid` without setsid). CRIU
    cannot dump such a task with any option (cr-dump.c: "A session leader of
    ... is outside of its pid namespace"), so this is checked before anything
    is parked or dumped."""
    for p in tree:
        try:
            if int(_stat_fields(p)[3]) == 0:
                return p
        except (OSError, ValueError, IndexError):
            continue
    return None


def holding_io_uring(tree: list[int]) -> tuple[int, str] | None:
    """The first task of tree with an io_uring instance open, and its name.
    CRIU 4.x cannot dump one (proc_parse.c stops at the ring's mapping:
    "Unknown shit ... (anon_inode:[io_uring])"). Seen on the GPU machine
    (2026-11-28, PyTorch 2.11): torchrun's agent held two from its start,
    with UV_USE_IO_URING=0 and USE_LIBUV=0 alike (its TCPStore server runs
    on the libuv linked into libtorch_cpu). The shim now answers libc's
    io_uring_setup with ENOSYS (interceptor/io_uring_off.c), so a process
    under it has none unless GPUPROXY_IO_URING=1 or it bypasses libc."""
    for p in tree:
        if any(t == "anon_inode:[io_uring]" for t in _fd_targets(p)):
            return p, procinfo.name(p)
    return None


def check_dumpable(pid: int) -> list[int]:
    """pid's process tree, or CriuError when CRIU could not dump it."""
    tree = process_tree(pid)
    bad = session_outside_namespace(tree)
    if bad is not None:
        raise CriuError(f"process {bad} (in the tree of pid {pid}) belongs to a session whose leader is "
                        f"outside this pid namespace, which CRIU cannot dump; start the app in its own "
                        f"session (setsid, or start_new_session=True)")
    ring = holding_io_uring(tree)
    if ring is not None:
        raise CriuError(f"process {ring[0]} ({ring[1]}, in the tree of pid {pid}) has an io_uring open, which "
                        f"CRIU cannot dump (start it under the shim without GPUPROXY_IO_URING=1: docs/multigpu.md, "
                        f"\"The whole-process form\")")
    return tree


def needs_shell_job(tree: list[int]) -> tuple[bool, str]:
    """CRIU's --shell-job is needed when a task of the tree has a terminal
    open, or its session or process group leader is not in the tree (CRIU
    refuses such a tree without it: "The root process N is not a session
    leader")."""
    pids = set(tree)
    for p in tree:
        try:
            f = _stat_fields(p)
        except OSError:
            continue
        pgrp, sid, tty_nr = int(f[2]), int(f[3]), int(f[4])
        if tty_nr != 0 or any(t.startswith(("/dev/pts/", "/dev/tty")) for t in _fd_targets(p)):
            return True, "it has a terminal"
        if sid not in pids or pgrp not in pids:
            return True, "its session or process group leader is outside its process tree"
    return False, ""


def has_established_tcp(tree: list[int]) -> bool:
    """A task of the tree holds an established TCP connection (state 01 in
    /proc/PID/net/tcp{,6}); CRIU then needs --tcp-established."""
    for p in tree:
        inodes = {t[8:-1] for t in _fd_targets(p) if t.startswith("socket:[")}
        if not inodes:
            continue
        for name in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{p}/net/{name}") as f:
                    for line in f.readlines()[1:]:
                        cols = line.split()
                        if len(cols) > 9 and cols[3] == "01" and cols[9] in inodes:
                            return True
            except OSError:
                pass
    return False


def written_files(tree: list[int]) -> list[dict]:
    """Regular files the tree has open for writing, with their sizes now.
    CRIU refuses to restore a process whose open file changed size since the
    dump ("has bad size"); these let proxy-cli say which and roll them back."""
    out: dict[str, int] = {}
    for p in tree:
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"/proc/{p}/fdinfo/{fd}") as f:
                    flags = int(next(ln for ln in f if ln.startswith("flags:")).split()[1], 8)
                if flags & (os.O_WRONLY | os.O_RDWR) == 0:
                    continue
                target = os.readlink(f"/proc/{p}/fd/{fd}")
                st = os.stat(f"/proc/{p}/fd/{fd}")
            except (OSError, StopIteration, ValueError):
                continue
            if stat.S_ISREG(st.st_mode) and target.startswith("/"):
                out[target] = st.st_size
    return [{"path": k, "size": v} for k, v in sorted(out.items())]


def pid_alive(pid: int) -> bool:
    """pid exists and is not a zombie."""
    try:
        return _stat_fields(pid)[0] not in ("Z", "X")
    except (OSError, IndexError, ValueError):
        return False


# ---------------------------------------------------------------- running

def _dir_size(path: str) -> tuple[int, int]:
    total = n = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                total += os.stat(p).st_size
                n += 1
    return total, n


def _failure(what: str, r: subprocess.CompletedProcess, log: str) -> CriuError:
    lines = []
    try:
        with open(log, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if "Error" in ln]
    except OSError:
        pass
    lines = lines or (r.stdout + r.stderr).strip().splitlines()
    detail = " | ".join(lines[-4:]) if lines else f"exit status {r.returncode}"
    return CriuError(f"criu {what} failed: {detail} (log: {log})")


def _varint(b: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError("truncated varint")
        x = b[i]
        i += 1
        v |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return v, i


def frozen_ms(images: str) -> float | None:
    """How long CRIU held the tree frozen, from its stats-dump image (None
    when absent or unreadable). The file, as CRIU writes it (images/stats.proto,
    criu/stats.c): two 32-bit magics, a 32-bit length, then a StatsEntry whose
    field 1 is DumpStatsEntry; its field 2, frozen_time, is in microseconds."""
    try:
        with open(os.path.join(images, "stats-dump"), "rb") as f:
            b = f.read(4096)
        n = int.from_bytes(b[8:12], "little")
        msg, i = b[12:12 + n], 0
        while i < len(msg):
            key, i = _varint(msg, i)
            if key & 7 != 2:
                return None
            ln, i = _varint(msg, i)
            if key >> 3 == 1:
                sub, j = msg[i:i + ln], 0
                while j < len(sub):
                    k, j = _varint(sub, j)
                    if k & 7 != 0:
                        return None
                    v, j = _varint(sub, j)
                    if k >> 3 == 2:
                        return round(v / 1000.0, 3)
                return None
            i += ln
    except (OSError, ValueError):
        pass
    return None


def make_private(path: str) -> None:
    """Images hold the app's memory: directories 0700, files 0600."""
    os.chmod(path, 0o700)
    for root, dirs, files in os.walk(path):
        for d in dirs:
            p = os.path.join(root, d)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, 0o600)


def dump(c: Criu, pid: int, image_dir: str, *, leave_running: bool, pre: bool = False,
         parent_images: str | None = None, leave_stopped: bool = False) -> dict:
    """criu dump (or pre-dump when pre) of pid's tree into IMAGE/criu.
    parent_images: the previous criu/ folder of the chain (its memory is not
    stored again where the kernel tracks dirty memory). Returns the record
    for the manifest."""
    tree = check_dumpable(pid)
    out = os.path.join(image_dir, SUBDIR)
    if os.path.isdir(out):
        shutil.rmtree(out)          # a dump that did not finish before: never recorded, so never used
    os.makedirs(out, mode=0o700)
    shell, why_shell = needs_shell_job(tree)
    tcp = has_established_tcp(tree)
    track = c.mem_tracking()
    action = "pre-dump" if pre else "dump"
    log = f"{action}.log"
    args = ["--tree", str(pid), "--images-dir", out, "--log-file", log, LOG_LEVEL]
    if shell:
        args.append("--shell-job")
    lock, lock_why = (None, "")
    if tcp:
        args.append("--tcp-established")
        lock, lock_why = c.network_lock()
        if lock:
            args += ["--network-lock", lock]
    if leave_running and not pre:
        args.append("--leave-running")
    elif leave_stopped and not pre:
        # the caller ends the tree (kill_tree) once the rest of the image is
        # durable, or lets it go on (continue_tree) if that failed
        args.append("--leave-stopped")
    prev = None
    if track:
        args.append("--track-mem")
        if parent_images and os.path.isdir(parent_images):
            prev = os.path.relpath(parent_images, out)      # CRIU takes it relative to --images-dir
            args += ["--prev-images-dir", prev]
    wfiles = written_files(tree)
    t0 = time.monotonic()
    r = c.run(action, *args)
    ms = round((time.monotonic() - t0) * 1000.0, 3)
    if r.returncode != 0:
        raise _failure(action, r, os.path.join(out, log))
    make_private(out)
    size, files = _dir_size(out)
    return {
        "dir": SUBDIR,
        "kind": action,
        "complete": True,
        "root_pid": pid,
        "pids": sorted(tree),
        "size": size,
        "files": files,
        "criu_version": ".".join(map(str, c.version)),
        "options": {"shell_job": shell, "shell_job_reason": why_shell, "tcp_established": tcp,
                    "network_lock": lock, "network_lock_reason": lock_why,
                    "leave_running": bool(leave_running and not pre), "track_mem": track,
                    "unprivileged": c.unprivileged},
        "prev_images_dir": prev,
        "written_files": wfiles,
        "log": f"{SUBDIR}/{log}",
        "ms": ms,
        "frozen_ms": frozen_ms(out),
    }


def kill_tree(pids) -> None:
    """Ends a tree CRIU left stopped (--leave-stopped), as a dump without
    --leave-running would have."""
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except ProcessLookupError:
            pass


def continue_tree(pids) -> None:
    """Lets a tree CRIU left stopped run again."""
    for p in pids:
        try:
            os.kill(int(p), signal.SIGCONT)
        except ProcessLookupError:
            pass


def restore(c: Criu, image_dir: str, record: dict, inherit: dict | None = None) -> tuple[int, float]:
    """criu restore of IMAGE/criu, detached: returns (root pid, ms) once the
    tree runs again (under its old pids). inherit: {fd of ours: CRIU's name
    of a file outside the dumped tree, e.g. "pipe:[1234]"}: the restored app
    gets our fd in its place (criu(8) --inherit-fd)."""
    src = os.path.join(image_dir, record.get("dir") or SUBDIR)
    pidfile = os.path.join(src, "restore.pid")
    try:
        os.unlink(pidfile)
    except FileNotFoundError:
        pass
    opts = record.get("options") or {}
    args = ["--images-dir", src, "--log-file", "restore.log", LOG_LEVEL, "--restore-detached",
            "--pidfile", pidfile]
    if opts.get("shell_job"):
        args.append("--shell-job")
    if opts.get("tcp_established"):
        args.append("--tcp-established")
        if opts.get("network_lock"):
            # the dump's method: a restore unlocks what the dump locked
            args += ["--network-lock", str(opts["network_lock"])]
    for fd, name in (inherit or {}).items():
        args += ["--inherit-fd", f"fd[{fd}]:{name}"]
    t0 = time.monotonic()
    r = c.run("restore", *args, pass_fds=tuple(inherit or ()))
    ms = round((time.monotonic() - t0) * 1000.0, 3)
    if r.returncode != 0:
        raise _failure("restore", r, os.path.join(src, "restore.log"))
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        pid = int(record["root_pid"])
    return pid, ms


# ---------------------------------------------------------------- the manifest record

def record_in_manifest(image_dir: str, record: dict) -> None:
    """Adds the CRIU record to the image's manifest (rewritten atomically;
    its digest changes, which is safe because no child image refers to it
    yet: this runs as the last step of the dump that wrote it). An image
    sealed with this user's key (proxyd's, when both run as the same user)
    is sealed again for the new digest; one sealed by another user's daemon
    keeps its old seal and then restores only with --allow-foreign."""
    from ..core import keys
    from .image import (MANIFEST, SEAL, SEAL_ALGO, Image, _fsync_dir, _write_file_atomic, encode_manifest,
                        read_manifest, seal_of)
    try:
        key = keys.seal_key(create=False)
    except Exception:          # no key, or one this user may not use: nothing to re-seal with
        key = None
    with Image.open(image_dir) as img:
        ours = key is not None and img.seal(key)[0]
    path = os.path.join(image_dir, MANIFEST)
    st = os.stat(path)
    body, _ = read_manifest(image_dir)
    body[RECORD_KEY] = record
    _write_file_atomic(path, encode_manifest(body))
    if ours:
        _, digest = read_manifest(image_dir)
        _write_file_atomic(os.path.join(image_dir, SEAL),
                           f"{SEAL_ALGO} {keys.key_id(key)} {seal_of(key, digest)}\n".encode())
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
        # a root dump of a user's session: the image stays the user's (as proxyd made it)
        for root, dirs, files in os.walk(image_dir):
            for n in dirs + files:
                os.lchown(os.path.join(root, n), st.st_uid, st.st_gid)
        os.chown(image_dir, st.st_uid, st.st_gid)
    _fsync_dir(image_dir)


def state(image_dir: str, manifest: dict) -> dict:
    """What an image holds of the process: {"present": bool, "complete":
    bool, "problem": str|None, "record": dict|None, "size_on_disk": int}.
    complete means CRIU finished and recorded it and its folder is there
    with at least the recorded files."""
    rec = manifest.get(RECORD_KEY)
    sub = os.path.join(image_dir, (rec or {}).get("dir") or SUBDIR)
    exists = os.path.isdir(sub)
    out = {"present": exists or rec is not None, "complete": False, "problem": None, "record": rec,
           "size_on_disk": _dir_size(sub)[0] if exists else 0}
    if rec is None:
        if exists:
            out["problem"] = (f"{sub} exists but the manifest has no CRIU record: the CRIU dump did not finish "
                              f"(only the GPU state can be restored, with --gpu-only)")
        return out
    if not exists:
        out["problem"] = f"the manifest records a CRIU {rec.get('kind')} in {sub}, which is missing"
        return out
    size, files = _dir_size(sub)
    if files < int(rec.get("files", 0)) or size < int(rec.get("size", 0)):
        out["problem"] = (f"{sub} holds {files} files ({size} bytes); the CRIU {rec.get('kind')} wrote "
                          f"{rec.get('files')} files ({rec.get('size')} bytes)")
        return out
    if not any(n.startswith(("pstree", "inventory")) for n in os.listdir(sub)):
        out["problem"] = f"{sub} has no CRIU inventory/pstree image"
        return out
    prev = rec.get("prev_images_dir")
    if prev and not os.path.isdir(os.path.join(sub, prev)):
        # an incremental dump: its unchanged pages are in that folder
        out["problem"] = (f"the CRIU {rec.get('kind')} in {sub} is incremental on {prev}, which is missing")
        return out
    out["complete"] = bool(rec.get("complete"))
    return out


def describe_record(st: dict) -> list[str]:
    """Lines for proxy-cli inspect."""
    rec = st["record"]
    if not st["present"]:
        return ["process    none (GPU state only: a --gpu-only image)"]
    if rec is None:
        return [f"process    INCOMPLETE: {st['problem']}"]
    o = rec.get("options") or {}
    flags = [k.replace("_", "-") for k in ("shell_job", "tcp_established", "leave_running", "track_mem")
             if o.get(k)]
    from_ = f", incremental on {rec['prev_images_dir']}" if rec.get("prev_images_dir") else ""
    head = (f"process    CRIU {rec.get('kind')} in {rec.get('dir')}/: "
            f"{'complete' if st['complete'] else 'INCOMPLETE'}, {rec.get('files')} files, "
            f"{_fmt(rec.get('size', 0))}, pids {', '.join(map(str, rec.get('pids', [])))} "
            f"(root {rec.get('root_pid')}), CRIU {rec.get('criu_version')}{from_}")
    if o.get("network_lock"):
        flags.append(f"network-lock {o['network_lock']}")
    lines = [head, f"           options: {', '.join(flags) or 'none'}; log {rec.get('log')}; took {rec.get('ms')} ms"]
    if st["problem"]:
        lines.append(f"           PROBLEM: {st['problem']}")
    return lines


def _fmt(n) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
