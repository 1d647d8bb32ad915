"""A second local user against a node daemon (issue 21; docs/security.md,
"Threat model"): the unprivileged user nobody (`setpriv`) attacks root's
sessions on `proxyd --users all` (ipc) and on keyed tcp (CURVE).

* a worker answers its session's owner only: raw messages with root's
  (stolen) session token get no answer at all, over ipc and over tcp with an
  authorised key, and root's program output stays exact; no /dev/shm name
  carries the token, no process's arguments name a worker's socket;
* HELLOs are checked against the sender's credentials: a HELLO that claims
  another process (pid 1) is refused, a user's pending HELLOs are bounded,
  and sessions that never open at their worker are reaped within seconds;
* the fuzzer (tests/fuzzing.py) runs as the second user too.

Runs as root (CI does)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from paced import PacedRun  # noqa: E402
from proxy import Daemon  # noqa: E402
from test_checkpoint import ctl, expected, kernels, programs  # noqa: E402,F401
from test_curve import _listening_ports, keyed  # noqa: E402,F401

NOBODY = 65534
TESTS = Path(__file__).parent
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv to act as another user")


_HELPERS: list[str] = []


def helpers_dir() -> str:
    """tests/fuzzing.py where nobody can read it (the checkout may be in a
    folder only root may enter)."""
    if not _HELPERS:
        import tempfile
        d = tempfile.mkdtemp(prefix="gpx-su-py-", dir="/tmp")       # not $TMPDIR: it may be private
        os.chmod(d, 0o755)
        shutil.copy(TESTS / "fuzzing.py", d)
        os.chmod(os.path.join(d, "fuzzing.py"), 0o644)
        _HELPERS.append(d)
    return _HELPERS[0]


# The interpreter the user nobody runs, and the folder it needs on PYTHONPATH
# for gpuproxy: this test's own interpreter where nobody can run it; else
# the system's python3 (with Debian's python3-zmq and python3-msgpack, which
# scripts/install-cluster-test-deps installs) and a world-readable copy of
# the installed package. CI's interpreter lives under /root, which nobody
# may not enter, and these tests skipped there.
_NOBODY = {"python": sys.executable, "path": ""}


def _nobody_imports(python: str, path: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HOME": "/tmp", **({"PYTHONPATH": path} if path else {})})
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c",
                           "import gpuproxy.proxyd.core.protocol, zmq, msgpack"], capture_output=True, text=True,
                          timeout=60, cwd="/tmp", env=env)


def _package_copy() -> str:
    """A copy of the installed gpuproxy package that nobody can read."""
    import gpuproxy
    import tempfile
    d = tempfile.mkdtemp(prefix="gpx-su-pkg-", dir="/tmp")     # not $TMPDIR: it may be private
    shutil.copytree(list(gpuproxy.__path__)[0], os.path.join(d, "gpuproxy"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(d):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return d


@pytest.fixture(scope="module", autouse=True)
def nobody_can_run_python():
    r = _nobody_imports(sys.executable, "")
    if r.returncode != 0:
        why = f"the user nobody cannot run {sys.executable} with gpuproxy installed: {r.stderr[-300:]}"
        system = shutil.which("python3", path="/usr/bin:/bin")
        if not system or os.path.realpath(system) == os.path.realpath(sys.executable):
            pytest.skip(why)
        path = _package_copy()
        r = _nobody_imports(system, path)
        if r.returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            pytest.skip(f"{why}; nor {system} with a copy of the package: {r.stderr[-300:]}")
        _NOBODY.update(python=system, path=path)
    yield
    for d in _HELPERS + ([_NOBODY["path"]] if _NOBODY["path"] else []):
        shutil.rmtree(d, ignore_errors=True)
    _HELPERS.clear()
    _NOBODY.update(python=sys.executable, path="")


def nobody_pythonpath() -> str:
    return ":".join(p for p in (helpers_dir(), _NOBODY["path"]) if p)


def nobody_env() -> dict:
    """The shim for nobody's programs: from the package copy where the
    installed one is out of nobody's reach."""
    if not _NOBODY["path"]:
        return {}
    import gpuproxy
    from proxy import preload
    here = list(gpuproxy.__path__)[0]
    return {"LD_PRELOAD": preload().replace(here, os.path.join(_NOBODY["path"], "gpuproxy"))}


def as_nobody(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs Python code as the user nobody (no groups), with this test's
    interpreter and package; what it prints on stdout is the result."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROXY_") and k != "LD_PRELOAD"}
    e.update({"HOME": "/tmp", "PYTHONPATH": nobody_pythonpath(), "PYTHONDONTWRITEBYTECODE": "1"}, **(env or {}))
    r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", _NOBODY["python"],
                        "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True, timeout=timeout,
                       cwd="/tmp")
    assert r.returncode == 0, r.stderr[-3000:]
    return r


# what nobody sends to every worker it can reach with a stolen token: a
# HELLO (re-attaching the session), a device-to-host copy and a status
# request; it prints every answer it got
STEAL = """
import json, os, sys, msgpack, zmq
from gpuproxy.proxyd.core import curve
from gpuproxy.proxyd._generated import FUNCTIONS
FID = {f.name: i for i, f in FUNCTIONS.items()}
token, eps = os.environ["STOLEN"], json.loads(os.environ["ENDPOINTS"])
kp = None
if os.environ.get("KEYS"):
    k = json.loads(os.environ["KEYS"])
    kp = (k[0].encode(), k[1].encode(), k[2].encode())
got = []
control = None
if os.environ.get("CONTROL"):
    # the attacker's own access works (its key is admitted): silence below is the worker's choice
    c = zmq.Context.instance().socket(zmq.DEALER)
    c.setsockopt(zmq.LINGER, 0)
    if kp:
        curve.secure_client(c, "tcp://", kp)
    c.connect(os.environ["CONTROL"])
    c.send(msgpack.packb([10, 1, "ping", {}]))
    control = bool(c.poll(20000))
    c.close(0)
for ep in eps:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.ROUTING_ID, b"c:" + token.encode())
    if kp:
        curve.secure_client(s, "tcp://", kp)
    s.connect(ep)
    s.send(msgpack.packb([1, 100, [[FID["cuMemcpyDtoH_v2"], 1, None, 0x200000000000, 64]]]))
    s.send(msgpack.packb([0, 101, [{"pid": os.getpid(), "token": token, "exe": "intruder", "channel": None}]]))
    s.send(msgpack.packb([10, 102, "status", {}]))
    while s.poll(2500):
        got.append([ep, repr(msgpack.unpackb(s.recv(), raw=False))[:300]])
    s.close(0)
print(json.dumps({"control": control, "got": got}))
"""


def token_of(pid: int, timeout: float = 20) -> str:
    """Root's session token, as a leak would give it: read out of the
    client's own memory (the shim's routing id "c:<token>"); proxyd's log
    shows public ids only."""
    pat = re.compile(rb"c:([0-9a-f]{16}-%d)(?![0-9])" % pid)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(f"/proc/{pid}/maps") as f:
            regions = [l.split() for l in f]
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            for r in regions:
                lo, hi = (int(x, 16) for x in r[0].split("-"))
                if not r[1].startswith("rw") or hi - lo > 64 << 20 or (len(r) > 5 and r[5].startswith("/dev/shm")):
                    continue
                try:
                    mem.seek(lo)
                    m = pat.search(mem.read(hi - lo))
                except (OSError, ValueError, OverflowError):
                    continue
                if m:
                    return m[1].decode()
        time.sleep(0.2)
    raise AssertionError(f"no session token in the memory of pid {pid}")


def no_public_capability(token: str, proxyd_pid: int, log: str):
    """No world-readable name carries the token or a worker's socket path:
    /dev/shm, and every process's arguments (ps)."""
    names = os.listdir("/dev/shm")
    assert token not in log, "proxyd's log shows a session token"
    assert not [n for n in names if token in n], [n for n in names if token in n]
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert token not in argv, f"pid {p.name} shows the token in its arguments: {argv!r}"
        if int(p.name) in children(proxyd_pid):
            assert "ipc://" not in argv, f"worker {p.name} shows its socket in its arguments: {argv!r}"


@pytest.fixture
def node(tmp_path_factory):
    d = Path(f"/tmp/gpx-su-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    d.mkdir()
    d.chmod(0o755)
    dm = Daemon(backend="emu", emu_kernels=kernels(), endpoint=f"ipc://{d}/proxyd.sock",
                log_path=str(d / "proxyd.log"),
                extra_args=["--users", "all"],
                env={**os.environ, "GPUPROXY_MAX_PENDING_PER_USER": "3", "GPUPROXY_HELLO_TIMEOUT_S": "2"})
    dm.start()
    yield dm, d
    dm.cleanup()
    shutil.rmtree(d, ignore_errors=True)


def test_stolen_token_gets_no_answer_ipc(programs, node):
    d, tmp = node
    b = programs["iterative"]
    with PacedRun(b, d) as run:
        run.step_to(3)
        token = token_of(run.pid)
        socks = sorted(str(p) for p in tmp.rglob("*.sock") if p.name != "proxyd.sock")
        socks += sorted(str(p) for p in Path("/tmp").glob(f"gpuproxy-workers-{d.proc.pid}-*/**/*.sock"))
        assert socks, "no worker socket found"
        eps = [d.endpoint] + [f"ipc://{p}" for p in socks]
        r = as_nobody(STEAL, {"STOLEN": token, "ENDPOINTS": json.dumps(eps)})
        answers = json.loads(r.stdout)["got"]
        # the supervisor may answer nobody's status request (its own, empty
        # list); nothing that comes from root's session may come back
        leaked = [a for a in answers if a[0] != d.endpoint or "sessions': []" not in a[1]]
        assert leaked == [], leaked
        no_public_capability(token, d.proc.pid, d.log())
        run.step_to(6)
        assert run.finish() == expected(b), run.stderr()


def test_stolen_token_gets_no_answer_tcp(programs, keyed):
    from gpuproxy.proxyd.core import curve
    d, keys = keyed
    b = programs["iterative"]
    mine = keys(os.geteuid())
    theirs = keys(NOBODY)
    kp = [theirs["GPUPROXY_CURVE_SERVERKEY"],
          *[k.decode() for k in curve._parse_pair(Path(theirs["GPUPROXY_CURVE_KEY_FILE"]).read_text(), "key")]]
    with PacedRun(b, d, env=mine) as run:
        run.step_to(3)
        token = token_of(run.pid)
        with open(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children") as f:
            workers = [int(c) for c in f.read().split()]
        ports = sorted({p for w in workers for p in _listening_ports(w)})
        assert ports, "no worker listens on tcp"
        eps = [f"tcp://127.0.0.1:{p}" for p in ports]
        r = as_nobody(STEAL, {"STOLEN": token, "ENDPOINTS": json.dumps(eps), "KEYS": json.dumps(kp),
                              "CONTROL": d.endpoint})
        out = json.loads(r.stdout)
        assert out["control"] is True, "nobody's key is not admitted: the test proves nothing"
        assert out["got"] == [], out["got"]
        no_public_capability(token, d.proc.pid, d.log())
        run.step_to(6)
        assert run.finish() == expected(b), run.stderr()


def worker_endpoints(d, tmp: Path | None) -> list[str]:
    """Every worker endpoint of proxyd d (root can list them)."""
    if d.endpoint.startswith("ipc://"):
        socks = sorted(str(p) for p in tmp.rglob("*.sock") if p.name != "proxyd.sock")
        socks += sorted(str(p) for p in Path("/tmp").glob(f"gpuproxy-workers-{d.proc.pid}-*/**/*.sock"))
        return [f"ipc://{p}" for p in socks]
    ports = sorted({p for w in children(d.proc.pid) for p in _listening_ports(w)})
    return [f"tcp://127.0.0.1:{p}" for p in ports]


def restored_session_not_taken(d, tmp, b, run_env=None, keys=None, dump_dir=None):
    """Root's session is dumped and restored while its process is stopped
    (SIGSTOP): the restored worker has no client connection yet, so a
    stolen token's routing id is free. nobody goes there first and must get
    nothing; root's process, continued, finishes with exact output."""
    import signal
    with PacedRun(b, d, env=run_env) as run:
        run.step_to(3)
        token = token_of(run.pid)
        ctl(d, "dump", pid=run.pid, dir=str(dump_dir))        # released: its worker is gone
        os.kill(run.pid, signal.SIGSTOP)
        try:
            ctl(d, "restore", dir=str(dump_dir))
            eps = worker_endpoints(d, tmp)
            env = {"STOLEN": token, "ENDPOINTS": json.dumps(eps)}
            if keys:
                env["KEYS"] = json.dumps(keys)
            r = as_nobody(STEAL, env)
        finally:
            os.kill(run.pid, signal.SIGCONT)
        got = json.loads(r.stdout)["got"]
        assert got == [], got
        run.step_to(6)
        assert run.finish() == expected(b), run.stderr()


def test_restored_session_not_taken_ipc(programs, node):
    d, tmp = node
    restored_session_not_taken(d, tmp, programs["iterative"], dump_dir=tmp / "img")


def test_restored_session_not_taken_tcp(programs, keyed, tmp_path):
    from gpuproxy.proxyd.core import curve
    d, keys = keyed
    mine = keys(os.geteuid())
    theirs = keys(NOBODY)
    kp = [theirs["GPUPROXY_CURVE_SERVERKEY"],
          *[k.decode() for k in curve._parse_pair(Path(theirs["GPUPROXY_CURVE_KEY_FILE"]).read_text(), "key")]]
    restored_session_not_taken(d, None, programs["iterative"], run_env=mine, keys=kp, dump_dir=tmp_path / "img")


FORGE = """
import json, os, sys, uuid, msgpack, zmq
ep, claim, n = os.environ["EP"], int(os.environ["CLAIM"] or os.getpid()), int(os.environ["N"])
pidns = os.readlink("/proc/self/ns/pid")
out = []
socks = []
for i in range(n):
    token = f"{uuid.uuid4().hex[:16]}-{claim}"
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.ROUTING_ID, b"c:" + token.encode())
    s.connect(ep)
    s.send(msgpack.packb([0, 1, [{"pid": claim, "token": token, "exe": "forged", "pidns": pidns}]]))
    socks.append(s)
for s in socks:
    ans = []
    while s.poll(3000):
        rep = msgpack.unpackb(s.recv(), raw=False)
        ans.append(rep[1])
        if rep[1] != -1:
            break
    out.append(ans)
print(json.dumps(out))
sys.stdout.flush()
import time; time.sleep(float(os.environ.get("LINGER", "0")))
"""


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def test_forged_hellos_refused_and_bounded(programs, node):
    d, tmp = node
    # a HELLO that claims pid 1 (root's init) from nobody's process
    r = as_nobody(FORGE, {"EP": d.endpoint, "CLAIM": "1", "N": "3"})
    answers = json.loads(r.stdout)
    assert all(a and a[-1] == -2 for a in answers), answers          # refused, no KEEPALIVE
    st = ctl(d, "status")
    assert [s for s in st["sessions"] if s["pid"] == 1] == [], st["sessions"]
    # many HELLOs of nobody's own process that never open their session:
    # at most GPUPROXY_MAX_PENDING_PER_USER=3 are taken, and they are reaped
    p = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", _NOBODY["python"],
                          "-c", textwrap.dedent(FORGE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**{k: v for k, v in os.environ.items() if not k.startswith("GPUPROXY_")
                                 and k not in ("LD_PRELOAD", "PYTHONPATH")},
                              "HOME": "/tmp", "EP": d.endpoint, "CLAIM": "", "N": "20", "LINGER": "8",
                              **({"PYTHONPATH": _NOBODY["path"]} if _NOBODY["path"] else {})}, cwd="/tmp")
    try:
        line = p.stdout.readline()
        answers = json.loads(line)
        taken = [a for a in answers if a and a[-1] in (-1, 0)]
        refused = [a for a in answers if a and a[-1] == -2]
        assert len(taken) <= 3 and len(refused) >= 17, answers
        assert len(children(d.proc.pid)) <= 3 + 2, children(d.proc.pid)     # their workers and spares
        # the sender is alive (no pidfd ends them) but never opened its sessions: reaped in seconds
        end = time.monotonic() + 15
        while time.monotonic() < end:
            mine = [s for s in ctl(d, "status")["sessions"] if s["pid"] == p.pid]
            if not mine:
                break
            time.sleep(0.2)
        assert mine == [], mine
        assert p.poll() is None, "the sender exited: its sessions ended with it, not by the reaper"
    finally:
        p.kill()
        p.wait()
    # root's programs still run, with exact output
    b = programs["iterative"]
    with PacedRun(b, d) as run:
        assert run.finish() == expected(b), run.stderr()


@pytest.mark.slow
def test_fuzzer_as_second_user(programs, node):
    """tests/fuzzing.py with nobody's credentials against root's node daemon
    while root's program runs: proxyd survives and root's output is exact."""
    d, tmp = node
    b = programs["iterative"]
    count = int(os.environ.get("GPUPROXY_FUZZ_COUNT_SECOND_USER", "50000"))
    with PacedRun(b, d) as run:
        run.step_to(2)
        r = as_nobody(f"""
            import json, shutil
            from fuzzing import Fuzzer
            f = Fuzzer({d.endpoint!r}, seed=21, worker_probe="hello")
            try:
                stats = f.run({count})
            finally:
                f.close()
                shutil.rmtree(f.tmp, ignore_errors=True)
            print(json.dumps(stats))
            """, timeout=600)
        print("fuzz as nobody:", r.stdout)
        assert d.proc.poll() is None, d.log()[-3000:]
        assert run.finish() == expected(b), run.stderr()


class AsNobody:
    """A built corpus program run as nobody (PacedRun takes its argv)."""

    def __init__(self, built):
        self.built = built

    def argv(self) -> list[str]:
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *self.built.argv()]


def test_second_users_program_runs_dumps_and_restores(programs, node):
    """nobody's own program on root's node daemon: its worker serves it
    (shared memory and fast channel of nobody's files), root dumps it (the
    image is nobody's, and records whom the worker served) and restores it
    into the live process, which finishes with exact output; nobody sees
    its own session and root's not."""
    from gpuproxy.proxyd.checkpoint.image import Image
    d, tmp = node
    b = programs["iterative"]
    img = tmp / "nobody-img"
    with PacedRun(b, d) as mine, PacedRun(AsNobody(b), d, env=nobody_env()) as theirs:
        mine.step_to(2)
        theirs.step_to(3)
        st = ctl(d, "status")
        pids = {s["pid"] for s in st["sessions"]}
        assert {mine.pid, theirs.pid} <= pids, st
        r = as_nobody(f"""
            import json, msgpack, zmq
            from gpuproxy.proxyd.client import drop_proof, make_proof
            path, proof = make_proof()
            s = zmq.Context.instance().socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect({d.endpoint!r})
            s.send(msgpack.packb([10, 1, "status", {{}}, proof], use_bin_type=True))
            assert s.poll(60000)
            rep = msgpack.unpackb(s.recv(), raw=False, strict_map_key=False)
            drop_proof(path)
            print(json.dumps([x["pid"] for x in rep[2]["sessions"]]))
            """)
        assert json.loads(r.stdout) == [theirs.pid]
        ctl(d, "dump", pid=theirs.pid, dir=str(img))      # released: its next call waits for the restore
        with Image.open(img) as im:
            assert im.session.get("owner_uid") == NOBODY and im.session.get("uid") == NOBODY, im.session
        assert img.stat().st_uid == NOBODY
        theirs.release(2)
        ctl(d, "restore", dir=str(img))
        theirs.wait_step(5)
        assert theirs.finish() == expected(b), theirs.stderr()
        assert mine.finish() == expected(b), mine.stderr()
    # both used shared memory with their workers (nobody's segments are nobody's files)
    assert "no shared memory with the client" not in d.log() and "not a file of the session's user" not in d.log()
