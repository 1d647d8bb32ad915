"""The node agent: a small HTTP service in the gpuproxy DaemonSet through
which the controller checkpoints a pod on this node.

    POST /v1/checkpoint  {"namespace", "pod", "uid", "timeoutSeconds"}
        -> 200 {"node", "images": [{"container_pid", "dir", "path", "sizeBytes",
                 "created", "durationMs", "stallMs", "criuMs"}], "time"}
    POST /v1/gc          {"namespace", "pod", "uid", "keep"} -> 200 {"deleted": [paths]}
    POST /v1/sessions    {"namespace", "pod", "uid"} -> 200 {"node", "sessions": [proxyd's
                          status of each of the pod's gpuproxy sessions]}  (read-only)
    GET  /healthz        -> 200 "ok"

How a checkpoint is taken: the pod's wrapped containers run
`proxy-cli run --checkpoint-dir DIR ... -- CMD` (the webhook put it there).
The agent (hostPID, so it sees every process of the node) finds the pod's
processes by the pod's uid in their cgroup path, picks the wrappers among
them by their command line, and sends each CHECKPOINT_NOW (SIGRTMIN+2): "one
--leave-running checkpoint now", the step --checkpoint-every takes. So the
image is written by the wrapper, inside the container, with the pids, mounts
and folder layout its own restore expects; the agent only asks and watches
DIR (through /proc/PID/root, the container's view) until a new complete
ckpt-<n> is there (images.py). A wrapper that does not catch the signal
(SigCgt in /proc/PID/status) is never sent it: its default action would kill
it. (SIGUSR1 and SIGUSR2 are not used: the contract passes them on to the
app.)

Authentication: every request but /healthz carries `Authorization: Bearer
TOKEN`, the token of a Secret shared with the controller (file named by
--token-file); compared in constant time. One request per pod at a time.
"""
from __future__ import annotations

import argparse
import hmac
import os
import re
import shutil
import signal
import stat
import sys
import threading
import time

from . import images as I
from .httpserve import BodyError, JsonHandler, make_server
from .checkpoints import now_utc, rfc3339

# "checkpoint now, leave the app running": a real-time signal, free for an
# application's own meaning (signal(7)); the contract must catch it.
from gpuproxy.proxyd.checkpoint.orchestrate.contract import CHECKPOINT_NOW  # noqa: E402  (the contract's own)
TRIGGER = CHECKPOINT_NOW
_UID_RE = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
MAX_BODY = 64 * 1024


class AgentError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _uid_forms(uid: str) -> tuple[str, str]:
    """The pod uid as kubelet writes it into cgroup paths: with dashes (cgroupfs
    driver: .../kubepods/burstable/pod<uid>/...) or underscores (systemd
    driver: ...kubepods-burstable-pod<uid_with_underscores>.slice/...)."""
    u = uid.lower()
    return "pod" + u, "pod" + u.replace("-", "_")


def pod_pids(uid: str, proc: str = "/proc") -> list[int]:
    """Pids (in proc's namespace) of the processes of the pod with this uid."""
    if not _UID_RE.match(uid or ""):
        raise AgentError(400, f"pod uid {uid!r} is not a uid")
    forms = _uid_forms(uid)
    out = []
    for n in os.listdir(proc):
        if not n.isdigit():
            continue
        try:
            with open(os.path.join(proc, n, "cgroup")) as f:
                text = f.read()
        except OSError:
            continue
        if any(form in seg for line in text.splitlines() for seg in line.split("/") for form in forms):
            out.append(int(n))
    return sorted(out)


def pod_sessions(uid: str, sessions: list[dict], proc: str = "/proc") -> list[dict]:
    """The gpuproxy sessions (proxyd's `status` sessions) of the pod with this
    uid: those whose pid is one of the pod's processes. proxyd lists a client
    of a container's own pid namespace under the pid the kernel showed it
    (the socket's credentials, docs/cluster.md): the node's pid, which the
    agent (hostPID) sees in /proc with the pod's cgroup; so apps of two pods
    with the same pid in their own namespaces are told apart."""
    mine = set(pod_pids(uid, proc))
    return [s for s in sessions if isinstance(s.get("pid"), int) and s["pid"] in mine]


def cmdline(pid: int, proc: str = "/proc") -> list[str]:
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def wrapper_dir(argv: list[str]) -> str | None:
    """DIR when argv is `proxy-cli run ... --checkpoint-dir DIR ... -- CMD`
    (also through an interpreter: python3 /usr/local/bin/proxy-cli run ...,
    python3 -m gpuproxy.cli run ...); else None."""
    if "--" in argv:
        argv = argv[:argv.index("--")]
    for i, a in enumerate(argv):
        base = a.rsplit("/", 1)[-1]
        if base == "proxy-cli" or (base == "gpuproxy.cli" and i > 0 and argv[i - 1] == "-m"):
            rest = argv[i + 1:]
            if not rest or rest[0] != "run":
                return None
            for j, b in enumerate(rest):
                if b == "--checkpoint-dir" and j + 1 < len(rest):
                    return rest[j + 1]
                if b.startswith("--checkpoint-dir="):
                    return b.split("=", 1)[1]
            return None
    return None


def catches(pid: int, signum: int, proc: str = "/proc") -> bool:
    """The process has a handler for signum (SigCgt of /proc/PID/status, a hex
    mask with bit signum-1; proc(5))."""
    try:
        with open(os.path.join(proc, str(pid), "status")) as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def wrappers(uid: str, proc: str = "/proc") -> list[tuple[int, str]]:
    """(pid, DIR) of each contract wrapper among the pod's processes; a
    wrapper's own children (CMD's tree) are not wrappers (their command lines
    are CMD's)."""
    return [(pid, d) for pid in pod_pids(uid, proc) if (d := wrapper_dir(cmdline(pid, proc)))]


def _host_view(pid: int, path: str, proc: str) -> str:
    """path as the container of pid sees it, reached from here. The path comes
    from the pod (its wrapper's command line): no '..' and no symlink on the
    way, since an absolute symlink under /proc/PID/root resolves against the
    agent's own root, not the container's."""
    if not path.startswith("/") or ".." in path.split("/"):
        raise AgentError(400, f"checkpoint folder {path!r} is not an absolute path")
    root = os.path.join(proc, str(pid), "root")
    cur = root
    for part in [p for p in path.split("/") if p]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break               # not made yet: the wrapper makes it
        except OSError as e:
            raise AgentError(500, f"checkpoint folder {path!r}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise AgentError(400, f"checkpoint folder {path!r} passes through a symlink "
                                  f"({cur[len(root):]}); refused")
    return root + path


def _container_path(pid: int, host_path: str, proc: str) -> str:
    root = os.path.join(proc, str(pid), "root")
    return host_path[len(root):] if host_path.startswith(root) else host_path


class Agent:
    def __init__(self, node: str, proc: str = "/proc", poll_s: float = 0.5, kill=os.kill, clock=time.monotonic,
                 sleep=time.sleep, status=None):
        self.node, self.proc, self.poll_s = node, proc, poll_s
        self._status = status or _proxyd_sessions     # () -> proxyd's `status` sessions of this node
        self._kill, self._clock, self._sleep = kill, clock, sleep
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    def _claim(self, uid: str) -> None:
        with self._lock:
            if uid in self._busy:
                raise AgentError(409, f"a request for pod {uid} is in progress on node {self.node}")
            self._busy.add(uid)

    def _release(self, uid: str) -> None:
        with self._lock:
            self._busy.discard(uid)

    def _wrappers(self, req: dict) -> list[tuple[int, str]]:
        uid = str(req.get("uid") or "")
        who = f"pod {req.get('namespace')}/{req.get('pod')} (uid {uid})"
        found = wrappers(uid, self.proc)
        if not found:
            raise AgentError(404, f"{who}: no process running `proxy-cli run --checkpoint-dir` on node {self.node} "
                                  f"(not wrapped by the webhook, not on this node, or not started yet)")
        return found

    def checkpoint_pod(self, req: dict) -> dict:
        uid = str(req.get("uid") or "")
        timeout = float(req.get("timeoutSeconds") or 600)
        found = self._wrappers(req)
        self._claim(uid)
        try:
            for pid, _d in found:
                if not catches(pid, TRIGGER, self.proc):
                    raise AgentError(409, f"the wrapper (pid {pid}) of pod {req.get('namespace')}/{req.get('pod')} "
                                          f"does not handle SIGRTMIN+2 (checkpoint now), so it cannot checkpoint on "
                                          f"request (its gpuproxy predates on-demand checkpoints); nothing was sent")
            views = [(pid, d, _host_view(pid, d, self.proc)) for pid, d in found]     # all checked first
            out = [self._one(pid, d, view, timeout) for pid, d, view in views]
        finally:
            self._release(uid)
        return {"node": self.node, "images": out, "time": rfc3339(now_utc())}

    def _one(self, pid: int, ckdir: str, view: str, timeout: float) -> dict:
        before = {e.path for e in I.scan(view)}
        t0 = self._clock()
        try:
            self._kill(pid, TRIGGER)
        except ProcessLookupError:
            raise AgentError(410, f"the wrapper (pid {pid}) ended before the checkpoint request") from None
        while True:
            new = [e for e in I.scan(view) if e.complete and e.path not in before]
            if new:
                e = max(new, key=lambda x: x.seq)
                return {"container_pid": pid, "dir": ckdir, "path": _container_path(pid, e.path, self.proc),
                        "sizeBytes": e.size, "created": e.created, "durationMs": round((self._clock() - t0) * 1000),
                        "stallMs": e.stall_ms, "criuMs": e.criu_ms}
            if not os.path.exists(os.path.join(self.proc, str(pid))):
                raise AgentError(410, f"the wrapper (pid {pid}) ended before a new image appeared in {ckdir}")
            if self._clock() - t0 > timeout:
                raise AgentError(504, f"no new complete image in {ckdir} within {timeout:.0f} s of the request "
                                      f"(the wrapper's own messages are in the pod's log)")
            self._sleep(self.poll_s)

    def gc_pod(self, req: dict) -> dict:
        keep = int(req.get("keep") or 0)
        if keep < 1:
            raise AgentError(400, "keep must be at least 1")
        uid = str(req.get("uid") or "")
        found = self._wrappers(req)
        self._claim(uid)
        deleted = []
        try:
            for pid, d in found:
                view = _host_view(pid, d, self.proc)
                for p in I.select_for_deletion(view, I.scan(view), keep):
                    shutil.rmtree(p, ignore_errors=True)
                    deleted.append(_container_path(pid, p, self.proc))
        finally:
            self._release(uid)
        return {"node": self.node, "deleted": deleted}


    def sessions_of_pod(self, req: dict) -> dict:
        """The pod's gpuproxy sessions as this node's proxyd reports them
        (pod_sessions); reads only."""
        uid = str(req.get("uid") or "")
        if not _UID_RE.match(uid):                    # before proxyd is asked
            raise AgentError(400, f"pod uid {uid!r} is not a uid")
        try:
            every = self._status()
        except Exception as e:
            raise AgentError(503, f"proxyd on node {self.node} does not answer its status: {e}") from None
        return {"node": self.node, "sessions": pod_sessions(uid, every, self.proc)}


def _proxyd_sessions() -> list[dict]:
    """proxyd's status sessions, at the node's endpoint (GPUPROXY_ENDPOINT,
    else the default), as the agent (root: proxyd shows it every session)
    asks for them."""
    from gpuproxy.proxyd.client import ControlClient
    from gpuproxy.proxyd.core import protocol as P
    ep = os.environ.get("GPUPROXY_ENDPOINT") or P.DEFAULT_ENDPOINT
    return list(ControlClient(ep, timeout_s=10.0).call("status").get("sessions") or [])


class _Handler(JsonHandler):
    name = "gpuproxy-agent"
    max_body = MAX_BODY
    agent: Agent
    want: bytes

    def do_POST(self):
        got = (self.headers.get("Authorization") or "").encode()
        if not hmac.compare_digest(got, self.want):
            return self.send_body(401, {"message": "missing or wrong bearer token"})
        try:
            req = self.read_json()
        except BodyError as e:
            return self.send_body(400, {"message": str(e)})
        try:
            if self.path == "/v1/checkpoint":
                return self.send_body(200, self.agent.checkpoint_pod(req))
            if self.path == "/v1/gc":
                return self.send_body(200, self.agent.gc_pod(req))
            if self.path == "/v1/sessions":
                return self.send_body(200, self.agent.sessions_of_pod(req))
            return self.send_body(404, {"message": f"no {self.path}"})
        except AgentError as e:
            return self.send_body(e.code, {"message": str(e)})


def make_handler(agent: Agent, token: str) -> type:
    return type("Handler", (_Handler,), {"agent": agent, "want": ("Bearer " + token).encode()})


def serve(agent: Agent, token: str, host: str, port: int):
    return make_server(make_handler(agent, token), host, port)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gpuproxy-k8s-agent", description=__doc__.split("\n")[0])
    ap.add_argument("--listen", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=int(os.environ.get("GPUPROXY_K8S_AGENT_PORT", "8471")))
    ap.add_argument("--token-file", default=os.environ.get("GPUPROXY_AGENT_TOKEN_FILE",
                                                           "/var/run/secrets/gpuproxy-agent/token"))
    ap.add_argument("--node", default=os.environ.get("NODE_NAME", ""))
    ap.add_argument("--proc", default="/proc")
    a = ap.parse_args(argv)
    try:
        with open(a.token_file) as f:
            token = f.read().strip()
    except OSError as e:
        print(f"gpuproxy-k8s-agent: cannot read the token file {a.token_file}: {e.strerror}", file=sys.stderr)
        return 2
    if len(token) < 16:
        print(f"gpuproxy-k8s-agent: the token in {a.token_file} is shorter than 16 characters", file=sys.stderr)
        return 2
    try:
        srv = serve(Agent(a.node or os.uname().nodename, a.proc), token, a.listen, a.port)
    except OSError as e:
        print(f"gpuproxy-k8s-agent: cannot listen on {a.listen}:{a.port}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"gpuproxy-k8s-agent: node {a.node}, listening on {a.listen}:{a.port}", file=sys.stderr)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
