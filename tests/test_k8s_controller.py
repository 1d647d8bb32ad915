"""The controller's kopf handlers, called as kopf calls them, with the API
server replaced by an in-memory stand-in holding the fixtures' objects, and
the node agent real: an HTTP agent on this machine over a node's /proc layout
(tests/k8s_node.py), reached through the controller's own HTTP client.

Needs the [k8s] extra (kopf, kubernetes); skipped, visibly, without it."""
import copy
import json
import threading
from pathlib import Path

import pytest

kopf = pytest.importorskip("kopf", reason="the [k8s] extra (kopf) is not installed")
pytest.importorskip("kubernetes", reason="the [k8s] extra (kubernetes) is not installed")

from gpuproxy.k8s import agent as G  # noqa: E402
from gpuproxy.k8s import controller as K  # noqa: E402
from k8s_node import CKDIR, UID, make_node, write_image  # noqa: E402

DATA = Path(__file__).parent / "data" / "k8s"
TOKEN = "0123456789abcdef0123456789abcdef"


def load(name):
    return json.loads((DATA / name).read_text())


class FakeApi:
    """The calls the controller makes, answered from in-memory objects."""

    def __init__(self, pods):
        self.pods = pods
        self.created: list[dict] = []
        self.deleted: list[str] = []
        self.crs: list[dict] = []
        self.status_patches: list[tuple] = []

    # CoreV1Api
    def read_namespaced_pod(self, name, namespace):
        for p in self.pods:
            if p["metadata"]["name"] == name and p["metadata"]["namespace"] == namespace:
                return copy.deepcopy(p)
        from kubernetes.client.rest import ApiException
        raise ApiException(status=404, reason="Not Found")

    def list_pod_for_all_namespaces(self, field_selector, label_selector):
        node = field_selector.split("=", 1)[1]
        k, v = label_selector.split("=")
        return _List([copy.deepcopy(p) for p in self.pods if p["spec"].get("nodeName") == node
                      and p["metadata"]["labels"].get(k) == v])

    def list_namespaced_pod(self, namespace, label_selector=None, field_selector=None):
        k, v = label_selector.split("=")
        return _List([copy.deepcopy(p) for p in self.pods if p["metadata"]["namespace"] == namespace
                      and p["metadata"]["labels"].get(k) == v])

    # CustomObjectsApi
    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        assert (group, version, plural) == ("gpuproxy.io", "v1alpha1", "gpucheckpoints")
        self.created.append(body)

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body):
        self.status_patches.append((name, body["status"]["phase"], body["status"]["node"]))

    def list_namespaced_custom_object(self, group, version, namespace, plural):
        return {"items": copy.deepcopy(self.crs)}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.deleted.append(name)


class _List:
    def __init__(self, items):
        self.items = items


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """The fixtures' pods; gpu-node-a's agent serving on 127.0.0.1."""
    proc, rootfs = make_node(tmp_path)
    folder = rootfs / CKDIR.lstrip("/")
    write_image(folder / "ckpt-1", created_bump=b"1")
    n = iter(range(2, 100))

    def wrapper_answers(pid, sig):                 # what the wrapper does on CHECKPOINT_NOW
        assert sig == G.CHECKPOINT_NOW
        write_image(folder / f"ckpt-{next(n)}", created_bump=b"n")

    srv = G.serve(G.Agent("gpu-node-a", str(proc), poll_s=0.05, kill=wrapper_answers), TOKEN, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    pods = load("pods-on-node.json")["items"]
    pods[0]["metadata"]["uid"] = UID
    api = FakeApi(pods)
    monkeypatch.setattr(K.client, "CoreV1Api", lambda: api)
    monkeypatch.setattr(K.client, "CustomObjectsApi", lambda: api)
    monkeypatch.setattr(K, "TOKEN_FILE", str(token_file))
    urls = {"gpu-node-a": f"http://127.0.0.1:{srv.server_address[1]}"}

    def agent_url(node):
        if node not in urls:
            raise K.AgentCallError(f"no running gpuproxy node agent on node {node}")
        return urls[node]
    monkeypatch.setattr(K, "_agent_url", agent_url)
    yield api, folder
    srv.shutdown()
    srv.server_close()


def test_on_demand_checkpoint_fills_the_status(cluster):
    api, folder = cluster
    patch = kopf.Patch()
    K.checkpoint_created(spec=kopf.Body({"spec": {"podName": "train-low-x7k2p", "timeoutSeconds": 30}}).spec,
                         namespace="gpuproxy-example", name="train-now", status={}, patch=patch)
    assert api.status_patches == [("train-now", "Running", "gpu-node-a")]      # shown while it runs
    st = patch["status"]
    assert st["phase"] == "Succeeded", st
    assert st["node"] == "gpu-node-a" and st["image"] == CKDIR + "/ckpt-2"
    assert st["sizeBytes"] > 4096 and st["stall"] == "1.2s" and st["stallMs"] == 1234.5
    # keep 2 (the pod's annotation): the folder holds ckpt-1 and ckpt-2
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt-1", "ckpt-2", "latest"]


def test_checkpoint_of_a_pod_that_cannot_be_checkpointed(cluster):
    api, _ = cluster
    for pod, why in (("plain-gpu-n4m5b", "not wrapped"), ("nope", "Not Found"), ("train-other-q8w3e", "terminating"),
                     ("train-low-z9y8x", "no running gpuproxy node agent on node gpu-node-b")):
        patch = kopf.Patch()
        K.checkpoint_created(spec={"podName": pod}, namespace="gpuproxy-example", name="x", status={}, patch=patch)
        assert patch["status"]["phase"] == "Failed" and why in patch["status"]["message"], (pod, patch)


def test_drain_creates_one_checkpoint_per_wrapped_pod(cluster):
    api, _ = cluster
    K._seen.clear()
    K.node_event(event={"type": "ADDED"}, body=kopf.Body(load("node-ready.json")), name="gpu-node-a")
    assert api.created == []
    K.node_event(event={"type": "MODIFIED"}, body=kopf.Body(load("node-drained.json")), name="gpu-node-a")
    assert [(c["spec"]["podName"], c["spec"]["reason"]) for c in api.created] == [("train-low-x7k2p", "Drain")]
    K.node_event(event={"type": "MODIFIED"}, body=kopf.Body(load("node-drained-heartbeat.json")), name="gpu-node-a")
    assert len(api.created) == 1


def test_schedule_creates_owned_checkpoints(cluster):
    api, _ = cluster
    patch = kopf.Patch()
    spec = {"selector": {"matchLabels": {"app": "train-low"}}, "intervalSeconds": 900}
    K.schedule_tick(spec=spec, status={}, namespace="gpuproxy-example", name="every-15m",
                    uid="0f0e0d0c-0b0a-4908-8706-050403020100", patch=patch)
    # the two running train-low pods (on both nodes); not the one being evicted, not the unwrapped one
    assert [c["spec"]["podName"] for c in api.created] == ["train-low-x7k2p", "train-low-z9y8x"]
    for cr in api.created:
        assert cr["spec"]["reason"] == "Schedule" and cr["metadata"]["labels"]["gpuproxy.io/schedule"] == "every-15m"
        assert cr["metadata"]["ownerReferences"][0]["uid"] == "0f0e0d0c-0b0a-4908-8706-050403020100"
    assert patch["status"]["lastCheckpoints"] == [c["metadata"]["name"] for c in api.created]
    patch2 = kopf.Patch()
    K.schedule_tick(spec=spec, status=dict(patch["status"]), namespace="gpuproxy-example", name="every-15m",
                    uid="0f0e0d0c-0b0a-4908-8706-050403020100", patch=patch2)
    assert len(api.created) == 2 and not patch2          # not due yet
