"""The node agent (gpuproxy.k8s.agent) on a /proc tree laid out as a node's
(pods' processes with their cgroup paths, command lines and signal masks,
and their containers' root folders), with real checkpoint images written by
the image writer; plus the parts that read the real /proc of this machine."""
import contextlib
import json
import os
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpuproxy.k8s import agent as G
from gpuproxy.k8s import images as I
from k8s_node import CKDIR, OLD, OTHER, UID, make_node, write_image  # noqa: E402


@pytest.fixture
def node(tmp_path):
    return make_node(tmp_path)


def test_finds_the_pods_processes_and_its_wrapper(node):
    proc, _ = node
    assert G.pod_pids(UID, str(proc)) == [4100, 4107]
    assert G.pod_pids(OTHER, str(proc)) == [5200]
    assert G.pod_pids(OTHER.upper(), str(proc)) == [5200]
    assert G.wrappers(UID, str(proc)) == [(4100, CKDIR)]          # the app's own --checkpoint-dir is not read
    assert G.wrappers(OTHER, str(proc)) == []
    with pytest.raises(G.AgentError) as e:
        G.pod_pids("../../etc", str(proc))
    assert e.value.code == 400


def test_a_pods_gpuproxy_sessions_by_the_node_pid(node):
    """proxyd's status lists each container client under the pid the node
    sees (its socket's credentials), so the pod of a session is the pod
    whose cgroup holds that pid, even where two pods' apps both call
    themselves 1001."""
    proc, _ = node
    status = [{"pid": 4107, "calls": 10, "exe": "/app/train"}, {"pid": 5200, "calls": 3, "exe": "/app/train"},
              {"pid": 999999, "calls": 1, "exe": "/elsewhere"}]
    assert G.pod_sessions(UID, status, str(proc)) == [status[0]]
    assert G.pod_sessions(OTHER, status, str(proc)) == [status[1]]


@pytest.mark.parametrize("argv,want", [
    (["proxy-cli", "run", "--checkpoint-dir", "/c/d", "--", "x"], "/c/d"),
    (["python3", "-m", "gpuproxy.cli", "run", "--checkpoint-dir=/c/e", "--", "x"], "/c/e"),
    (["/opt/venv/bin/proxy-cli", "run", "--", "./app"], None),                     # no checkpoint folder
    (["proxy-cli", "status"], None),
    (["python", "train.py", "--checkpoint-dir", "/c"], None),
    (["sh", "-c", "proxy-cli run --checkpoint-dir /c -- x"], None),
    ([], None),
])
def test_wrapper_command_lines(argv, want):
    assert G.wrapper_dir(argv) == want


def test_signal_masks_of_real_processes():
    """SigCgt read from this machine's /proc: a signal is caught once a
    handler is installed, not while its disposition is the default. (SIGINT
    is given Python's handler here: a runner started in the background
    inherits SIGINT ignored, and then Python installs none.)"""
    pid = os.getpid()
    old = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert G.catches(pid, signal.SIGINT)
        assert not G.catches(pid, signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, lambda *_: None)
        assert G.catches(pid, signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, old)
        signal.signal(signal.SIGINT, old_int)
    assert G.pod_pids("00000000-0000-4000-8000-000000000000") == []


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_checkpoint_asks_the_wrapper_and_reports_the_new_image(node):
    proc, rootfs = node
    folder = rootfs / CKDIR.lstrip("/")
    write_image(folder / "ckpt-1")
    sent = []

    def kill(pid, sig):              # the wrapper's answer to CHECKPOINT_NOW: a new image, published as it does
        sent.append((pid, sig))
        write_image(folder / "ckpt-2", created_bump=b"y", stall_ms=640.0)

    clock = Clock()
    a = G.Agent("gpu-node-a", str(proc), poll_s=0.5, kill=kill, clock=clock, sleep=clock.sleep)
    out = a.checkpoint_pod({"namespace": "gpuproxy-example", "pod": "train-low-x7k2p", "uid": UID,
                            "timeoutSeconds": 60})
    assert sent == [(4100, G.CHECKPOINT_NOW)]
    assert out["node"] == "gpu-node-a"
    (img,) = out["images"]
    assert img["path"] == CKDIR + "/ckpt-2" and img["dir"] == CKDIR and img["container_pid"] == 4100
    assert img["sizeBytes"] == I.read_entry(str(folder / "ckpt-2"), 2).size > 4096
    assert img["stallMs"] == 640.0 and img["criuMs"] == 812.5                # job.json's and CRIU's record
    assert img["created"] == "2026-11-27T09:41:19.500+00:00"                 # job.json's time (date -u -d @1795772479)


def test_no_signal_to_a_wrapper_that_takes_no_checkpoint_on_request(node):
    """Today's contract catches SIGUSR1 only to pass it on to the app (which
    may die of it): the agent sends nothing to a wrapper that does not catch
    CHECKPOINT_NOW."""
    proc, _ = node
    sent = []
    a = G.Agent("gpu-node-a", str(proc), kill=lambda *x: sent.append(x))
    with pytest.raises(G.AgentError) as e:
        a.checkpoint_pod({"namespace": "ns", "pod": "old", "uid": OLD})
    assert e.value.code == 409 and "does not handle SIGRTMIN+2" in str(e.value) and sent == []
    with pytest.raises(G.AgentError) as e:
        a.checkpoint_pod({"namespace": "ns", "pod": "nginx", "uid": OTHER})
    assert e.value.code == 404 and "proxy-cli run --checkpoint-dir" in str(e.value)


def test_timeout_and_vanished_wrapper(node):
    proc, _ = node
    clock = Clock()
    a = G.Agent("n", str(proc), poll_s=5, kill=lambda *x: None, clock=clock, sleep=clock.sleep)
    with pytest.raises(G.AgentError) as e:
        a.checkpoint_pod({"uid": UID, "timeoutSeconds": 30})
    assert e.value.code == 504 and CKDIR in str(e.value)

    def gone(pid, sig):
        raise ProcessLookupError
    with pytest.raises(G.AgentError) as e:
        G.Agent("n", str(proc), kill=gone).checkpoint_pod({"uid": UID})
    assert e.value.code == 410
    # one request per pod at a time: a second one is refused while the first runs
    a._claim(UID)
    with pytest.raises(G.AgentError) as e:
        a.checkpoint_pod({"uid": UID})
    assert e.value.code == 409


def test_gc_keeps_the_newest_complete_images(node):
    proc, rootfs = node
    folder = rootfs / CKDIR.lstrip("/")
    for i, bump in enumerate((b"a", b"b", b"c", b"d")):
        write_image(folder / f"ckpt-{i}", created_bump=bump)            # latest -> ckpt-3
    write_image(folder / ".tmp-4", created_bump=b"e", publish=False)     # the wrapper is writing one
    write_image(folder / "ckpt-9", criu_complete=False)                  # broken: not counted, not touched
    entries = I.scan(str(folder))
    assert [(Path(e.path).name, e.complete) for e in entries] == [
        ("ckpt-0", True), ("ckpt-1", True), ("ckpt-2", True), ("ckpt-3", True), ("ckpt-9", False)]
    assert I.latest(str(folder)) == str(folder / "ckpt-9")                # write_image published it last
    (folder / "latest").unlink()
    (folder / "latest").symlink_to("ckpt-1")                             # as if ckpt-2, 3 came after a restore
    out = G.Agent("n", str(proc)).gc_pod({"uid": UID, "keep": 1})
    assert sorted(out["deleted"]) == [CKDIR + "/ckpt-0", CKDIR + "/ckpt-2"]
    assert sorted(p.name for p in folder.iterdir()) == [".tmp-4", "ckpt-1", "ckpt-3", "ckpt-9", "latest"]
    with pytest.raises(G.AgentError):
        G.Agent("n", str(proc)).gc_pod({"uid": UID, "keep": 0})


def test_unpublished_and_foreign_folders_are_not_images(tmp_path):
    write_image(tmp_path / "ckpt-1")
    write_image(tmp_path / ".tmp-2", publish=False)                      # complete CRIU part, no job.json yet
    write_image(tmp_path / "ckpt-3", publish=False)
    write_image(tmp_path / "backup", stall_ms=None)
    (tmp_path / "ckpt-7").symlink_to(tmp_path / "ckpt-1")
    entries = I.scan(str(tmp_path))
    assert [(Path(e.path).name, e.complete) for e in entries] == [("ckpt-1", True), ("ckpt-3", False)]
    assert "job.json" in entries[1].problem
    assert I.newest_complete(entries).path == str(tmp_path / "ckpt-1")
    assert I.select_for_deletion(str(tmp_path), entries, 1) == []
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").symlink_to("/etc")                             # not one of ours: protects nothing
    assert I.latest(str(tmp_path)) is None


TOKEN = "t0k3n-0123456789abcdef"


@contextlib.contextmanager
def served(agent):
    """The agent's HTTP API on a free local port, bearer token TOKEN; yields
    (its base URL, post(path, body, tok=TOKEN) -> (HTTP status, JSON body))."""
    srv = G.serve(agent, TOKEN, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"

    def post(path, body, tok=TOKEN):
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {tok}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        yield base, post
    finally:
        srv.shutdown()
        srv.server_close()


def test_http_api(node):
    proc, rootfs = node
    write_image(rootfs / CKDIR.lstrip("/") / "ckpt-1")
    with served(G.Agent("gpu-node-a", str(proc), kill=lambda *x: None)) as (base, post):
        with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
            assert r.read() == b"ok"
        assert post("/v1/gc", {"uid": UID, "keep": 1}, tok="wrong")[0] == 401
        code, body = post("/v1/gc", {"uid": UID, "keep": 1})
        assert code == 200 and body == {"node": "gpu-node-a", "deleted": []}
        code, body = post("/v1/checkpoint", {"uid": OLD})
        assert code == 409 and "SIGRTMIN+2" in body["message"]
        assert post("/v1/nothing", {"uid": UID})[0] == 404


def test_http_sessions_of_a_pod(node):
    """POST /v1/sessions: the gpuproxy sessions of the pod named by a real
    Pod object (tests/data/k8s/pods-on-node.json), from proxyd's status as
    it lists them (by the node's pid); bearer token as for the other
    endpoints; a proxyd that does not answer is a 503 with one message."""
    proc, _ = node
    pods = json.loads((Path(__file__).parent / "data" / "k8s" / "pods-on-node.json").read_text())["items"]
    by_uid = {p["metadata"]["uid"]: p["metadata"] for p in pods}
    status = [{"pid": 4107, "calls": 10, "exe": "/app/train", "state": "live"},
              {"pid": 5200, "calls": 3, "exe": "/app/train", "state": "live"},
              {"pid": 999999, "calls": 1, "exe": "/elsewhere", "state": "live"}]
    answers = [lambda: status]

    def ask():
        return answers[0]()

    with served(G.Agent("gpu-node-a", str(proc), kill=lambda *x: None, status=ask)) as (_, post):
        def ask_for(meta, tok=TOKEN):
            return post("/v1/sessions", {"namespace": meta["namespace"], "pod": meta["name"], "uid": meta["uid"]},
                        tok)

        train, plain = by_uid[UID], by_uid[OTHER]
        assert ask_for(train, tok="wrong")[0] == 401
        assert ask_for(train) == (200, {"node": "gpu-node-a", "sessions": [status[0]]})
        assert ask_for(plain) == (200, {"node": "gpu-node-a", "sessions": [status[1]]})
        assert ask_for(by_uid[OLD]) == (200, {"node": "gpu-node-a", "sessions": []})
        code, body = post("/v1/sessions", {"uid": "../../etc"})
        assert code == 400 and "not a uid" in body["message"]

        def dead():
            raise ConnectionError("no answer at ipc:///run/gpuproxy/proxyd.sock")
        answers[0] = dead
        code, body = ask_for(train)
        assert code == 503 and "ipc:///run/gpuproxy/proxyd.sock" in body["message"]


def test_a_symlink_in_the_folder_path_is_refused(node):
    """The folder comes from the pod's command line: a symlink planted in it
    would lead the agent out of the container (absolute links under
    /proc/PID/root resolve against the agent's root)."""
    proc, rootfs = node
    ck = rootfs / CKDIR.lstrip("/")
    ck.rmdir()
    ck.symlink_to("/")
    for call in (lambda a: a.gc_pod({"uid": UID, "keep": 1}), lambda a: a.checkpoint_pod({"uid": UID})):
        with pytest.raises(G.AgentError) as e:
            call(G.Agent("n", str(proc), kill=lambda *x: pytest.fail("signalled")))
        assert e.value.code == 400 and "symlink" in str(e.value)
