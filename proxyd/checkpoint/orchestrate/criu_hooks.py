"""The work of gpuproxy's CRIU plugin (proxyd/checkpoint/criu_plugin.c),
run by it as `python -m gpuproxy.proxyd.checkpoint.orchestrate.criu_hooks ACTION ARG
IMAGES`, one process per hook call:

    pause PID IMAGES       park every gpuproxy client in PID's process tree
                           (PAUSE_DEVICES; CRIU has not stopped them yet)
    checkpoint PID IMAGES  a parked client's GPU state -> IMAGES/gpuproxy/<P>
                           (CHECKPOINT_DEVICES; the task is frozen)
    finish RET IMAGES      RET != 0 (the dump failed): resume the parked
                           clients and remove the gpuproxy part; else, once
                           criu has exited, resume those still running
                           (--leave-running)
    prepare 0 IMAGES       every IMAGES/gpuproxy/<P> into this node's
                           proxyd (init of a restore: before CRIU forks the
                           tree, as proxyd wants the pid free)
    restore PID IMAGES     resume the restored shim with its session's
                           token (RESUME_DEVICES_LATE)
    abandon RET IMAGES     a failed restore: one line

P is the pid the client has in its own pid namespace (the last NSpid of
/proc/PID/status): what it is again after a restore in a new container.
proxyd is asked with the pids CRIU gives the hooks (the node's, where the
plugin runs): proxyd keeps a client of another pid namespace under the pid
the kernel shows it (client_view.py), and resumes sessions by token. The GPU dump keeps the session in proxyd
(leave_running): CRIU, not the plugin, decides whether the app goes on; a
client CRIU ended is noticed by proxyd, which ends its session.

Which proxyd: $GPUPROXY_ENDPOINT where criu runs with it (criu run by hand).
Container runtimes run criu with an environment of their own (runc's
checkpoint under podman or CRI-O passes none of the caller's), so otherwise:
at a dump, the endpoint the client itself uses (GPUPROXY_ENDPOINT in its
/proc/PID/environ, else the default), an ipc path reached through
/proc/PID/root (the client's mount namespace: the socket folder mounted into
a container); it is recorded in IMAGES/gpuproxy/endpoint, and a restore uses
that recorded endpoint on the node (the node's socket folder is mounted into
containers at its own path, docs/cluster.md), or the restored task's own
view once it exists. Exit status 0 on success; otherwise one line on stderr
(the plugin puts it into CRIU's log) and status 1, which fails the dump or
restore.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

SUBDIR = "gpuproxy"
STATE = "parked.json"
PARK_TIMEOUT_S = 60.0


class HookError(Exception):
    pass


ENDPOINT_FILE = "endpoint"


def _client(endpoint: str | None = None):
    from gpuproxy.proxyd.client import ControlClient
    from gpuproxy.proxyd.core import protocol as P
    return ControlClient(os.environ.get("GPUPROXY_ENDPOINT") or endpoint or P.DEFAULT_ENDPOINT, timeout_s=600.0)


def client_endpoint(pid: int) -> str:
    """The endpoint process pid uses (its GPUPROXY_ENDPOINT, else the
    default), as the plugin can reach it: an ipc path through the process's
    own root (/proc/PID/root), so a socket mounted into a container is found
    wherever the container has it."""
    from gpuproxy.proxyd.core import protocol as P
    ep = ""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(b"GPUPROXY_ENDPOINT="):
                    ep = kv.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        pass
    ep = ep or P.DEFAULT_ENDPOINT
    if ep.startswith("ipc://") and os.path.isabs(ep[6:]):
        return f"ipc:///proc/{pid}/root{ep[6:]}"
    return ep


def _plain(endpoint: str) -> str:
    """endpoint without a /proc/PID/root prefix: as the node names it when
    the container mounts the node's socket folder at its own path."""
    import re
    return re.sub(r"^ipc:///proc/[0-9]+/root/", "ipc:///", endpoint)


def _recorded(images: str) -> str | None:
    try:
        with open(os.path.join(images, SUBDIR, ENDPOINT_FILE)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def ns_pid(pid: int) -> int:
    """pid as its own (innermost) pid namespace sees it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("NSpid:"):
                    return int(ln.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


def _state_path(images: str) -> str:
    return os.path.join(images, SUBDIR, STATE)


def _load(images: str) -> dict:
    try:
        with open(_state_path(images)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"parked": [], "dumped": []}


def _save(images: str, state: dict) -> None:
    p = _state_path(images)
    tmp = p + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, p)


def pause(pid: int, images: str) -> None:
    from gpuproxy.proxyd.checkpoint import criu
    ep = client_endpoint(pid)
    c = _client(ep)
    clients = {int(s.get("pid") or 0) for s in c.call("status").get("sessions", [])}
    state = _load(images)
    for p in criu.process_tree(pid):
        v = ns_pid(p)
        if p not in clients or v in state["parked"]:
            continue
        os.makedirs(os.path.join(images, SUBDIR), mode=0o700, exist_ok=True)
        res = c.call("park", {"pid": p, "timeout_s": PARK_TIMEOUT_S})
        state["parked"].append(v)
        state.setdefault("tokens", {})[str(v)] = res.get("token") or ""
        state.setdefault("hosts", {})[str(v)] = p
        state["endpoint"] = ep
        _save(images, state)
        with open(os.path.join(images, SUBDIR, ENDPOINT_FILE), "w") as f:
            f.write(_plain(os.environ.get("GPUPROXY_ENDPOINT") or ep) + "\n")


def checkpoint(pid: int, images: str) -> None:
    state = _load(images)
    v = ns_pid(pid)
    if v not in state["parked"] or v in state["dumped"]:
        return
    out = os.path.join(images, SUBDIR, str(v))
    _client(state.get("endpoint")).call("dump", {"pid": pid, "dir": out, "leave_running": True, "concurrent": False})
    state["dumped"].append(v)
    _save(images, state)


def _resume_all(parked: list, endpoint: str | None) -> None:
    """parked: the sessions' tokens (pids where a token is missing)."""
    from gpuproxy.proxyd.client import ControlError
    c = _client(endpoint)
    for v in parked:
        try:
            c.call("resume", {"token": v} if isinstance(v, str) else {"pid": v})
        except ControlError:
            pass                  # gone: proxyd ends its session


def _resume_when_criu_is_done(parked: list[tuple], criu_pid: int, endpoint: str | None) -> None:
    """CRIU calls fini before it ends the dumped tree or lets it go on
    (cr-dump.c: cr_plugin_fini, then pstree_switch_state). A resume now
    would leave a resume flag behind for a process CRIU is about to end,
    which its restored copy would then take as its own; so a detached
    process waits for criu to exit and resumes those that still run."""
    import time
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    try:
        # criu's caller may wait for the end of criu's output: not ours
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        from gpuproxy.proxyd.checkpoint import criu
        end = time.monotonic() + 3600
        while criu.pid_alive(criu_pid) and time.monotonic() < end:     # a zombie counts as done
            time.sleep(0.05)
        alive = [who for who, host in parked if criu.pid_alive(host)]
        if alive:
            # the client's own view may be gone with its container: the
            # node's name for the endpoint then
            ep = endpoint if endpoint and os.path.exists(endpoint[6:] if endpoint.startswith("ipc://") else "/") \
                else (_plain(endpoint) if endpoint else None)
            _resume_all(alive, ep)
    finally:
        os._exit(0)


def finish(ret: int, images: str) -> None:
    state = _load(images)
    tokens, hosts = state.get("tokens", {}), state.get("hosts", {})
    # (what resume names: the token, else the pid; the pid on this node)
    parked = [(tokens.get(str(v)) or v, hosts.get(str(v), v)) for v in state["parked"]]
    if ret != 0:
        # the dump failed: CRIU lets the tree go on; nothing of ours stays
        if parked:
            _resume_all([who for who, _ in parked], state.get("endpoint"))
        shutil.rmtree(os.path.join(images, SUBDIR), ignore_errors=True)
        return
    for v in state["dumped"]:
        if _needs_record(images, v):
            _use_proxyd_keys(state.get("endpoint"))      # only for an older proxyd (criu_record_call.py)
            _record_criu(images, v, state.get("endpoint"))
    if parked:
        # the tokens go with the detached resumer, not into the image
        state["parked"], state["tokens"], state["hosts"] = [], {}, {}
        _save(images, state)
        _resume_when_criu_is_done(parked, os.getppid(), state.get("endpoint"))


def _needs_record(images: str, v: int) -> bool:
    """Whether the GPU image must say that CRIU holds its process: only when
    its pid is one of proxyd's namespace (engine._check_process then wants
    the process to exist); a container's own pid namespace is not checked."""
    from gpuproxy.proxyd.checkpoint.image import read_manifest
    from gpuproxy.proxyd.core.pidview import OWN_PIDNS
    try:
        m, _ = read_manifest(os.path.join(images, SUBDIR, str(v)))
        ns = (m.get("session") or {}).get("pidns") or m.get("pidns")
    except Exception:
        return True
    return not ns or ns == OWN_PIDNS


def _use_proxyd_keys(endpoint: str | None) -> None:
    """Recording CRIU's part edits the GPU image's manifest, which is then
    sealed again with proxyd's image-seal key (criu.record_in_manifest). criu
    under runc runs without the caller's environment, so the key folder
    proxyd uses is taken from proxyd's own environment (/proc/PID/environ of
    the supervisor that answers at the endpoint), unless GPUPROXY_KEY_DIR is
    set here."""
    if os.environ.get("GPUPROXY_KEY_DIR"):
        return
    try:
        pid = int(_client(endpoint).call("status").get("pid") or 0)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"gpuproxy.proxyd" not in f.read():
                return            # not proxyd's pid here (proxyd in another pid namespace)
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except Exception:
        return
    get = lambda k: env.get(k.encode(), b"").decode(errors="replace")   # noqa: E731
    d = get("GPUPROXY_KEY_DIR") or os.path.join(get("XDG_CONFIG_HOME") or os.path.join(get("HOME") or "/root",
                                                                                        ".config"), "gpuproxy", "keys")
    os.environ["GPUPROXY_KEY_DIR"] = d


def _record_criu(images: str, v: int, endpoint: str | None) -> None:
    """The GPU image says that CRIU holds its process (its images are two
    folders up): proxyd then restores it before the process exists, as for
    proxy-cli's whole-process images (engine: a whole-process image's
    process does not exist yet). proxyd adds the record and seals it
    (checkpoint/criu_record.py)."""
    from .criu_record_call import record
    record(_client(endpoint), os.path.join(images, SUBDIR, str(v)), {
        "dir": os.path.join("..", ".."), "kind": "dump", "complete": True, "root_pid": v, "pids": [v],
        "size": 0, "files": 0, "by": "gpuproxy criu plugin", "options": {}, "written_files": []})


TOKENS = "restored.json"


def prepare(_arg: int, images: str) -> None:
    """Every GPU image of IMAGES/gpuproxy into this node's proxyd, before
    CRIU forks the tree; the sessions' tokens are kept for restore()."""
    sub = os.path.join(images, SUBDIR)
    try:
        names = sorted(n for n in os.listdir(sub) if n.isdigit())
    except FileNotFoundError:
        return
    c = _client(_recorded(images))
    tokens = {}
    for n in names:
        img = os.path.join(sub, n)
        if os.path.exists(os.path.join(img, "manifest")):
            tokens[n] = c.call("restore", {"dir": img, "device_map": {}}).get("token")
    with open(os.path.join(sub, TOKENS), "w") as f:
        json.dump(tokens, f)


def restore(pid: int, images: str) -> None:
    """The restored task's shim goes on: resumed with its session's token."""
    v = ns_pid(pid)
    try:
        with open(os.path.join(images, SUBDIR, TOKENS)) as f:
            tokens = json.load(f)
    except (OSError, ValueError):
        return
    if str(v) not in tokens:
        return
    token = tokens[str(v)]
    ep = _recorded(images)
    if not os.environ.get("GPUPROXY_ENDPOINT") and not (ep and ep.startswith("ipc://") and os.path.exists(ep[6:])):
        ep = client_endpoint(pid)          # the restored task's own view
    # pid_here: the restored task as proxyd's pid namespace sees it (criu's
    # is the node's): proxyd finds the task's own /dev/shm through it
    args = {"token": token} if token else {"pid": v}
    args["pid_here"] = pid
    _client(ep).call("resume", args)


def abandon(ret: int, images: str) -> None:
    """A restore that failed after prepare(): its sessions wait in proxyd
    for a process that will not come; say so (a later restore of the same
    image replaces them)."""
    try:
        with open(os.path.join(images, SUBDIR, TOKENS)) as f:
            tokens = json.load(f)
    except (OSError, ValueError):
        return
    if tokens:
        print(f"gpuproxy criu plugin: the restore failed ({ret}); the GPU state of pids "
              f"{', '.join(tokens)} was restored into proxyd and waits there", file=sys.stderr)


ACTIONS = {"pause": pause, "checkpoint": checkpoint, "finish": finish, "prepare": prepare, "restore": restore,
           "abandon": abandon}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] not in ACTIONS:
        print("usage: python -m gpuproxy.proxyd.checkpoint.orchestrate.criu_hooks ACTION ARG IMAGES",
              file=sys.stderr)
        return 2
    try:
        ACTIONS[argv[0]](int(argv[1]), argv[2])
    except Exception as e:            # one line into CRIU's log, never a traceback
        print(f"gpuproxy criu plugin: {argv[0]} {argv[1]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
