"""The mutating webhook's logic on real AdmissionReview objects (tests/data/k8s),
without an API server: each JSONPatch is applied with the `jsonpatch` package
and the resulting Pod is checked field by field and validated against the
Kubernetes Pod schema (kubernetes-validate)."""
import base64
import copy
import json
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

import pytest

from gpuproxy.interceptor import LIBRARIES
from gpuproxy.k8s import admission as A
from gpuproxy.k8s.config import Config

jsonpatch = pytest.importorskip("jsonpatch", reason="jsonpatch (test extra) applies the webhook's patches")

DATA = Path(__file__).parent / "data" / "k8s"
CFG = Config()
K8S_VERSION = "1.33.0"


def load(name):
    return json.loads((DATA / name).read_text())


def respond(review, cfg=CFG):
    out = A.review(review, cfg)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == (review.get("request") or {}).get("uid", "")
    return out["response"]


def patched(review, cfg=CFG):
    resp = respond(review, cfg)
    assert resp["allowed"] is True, resp
    assert resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    pod = review["request"]["object"]
    return jsonpatch.JsonPatch(ops).apply(copy.deepcopy(pod)), ops, resp


def validate_pod(pod):
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra) holds the schemas")
    body = copy.deepcopy(pod)
    body["metadata"].setdefault("name", "x")      # generateName pods get theirs after admission
    kv.validate(body, K8S_VERSION, strict=True)


def env_of(c):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_job_pod_is_wrapped_field_by_field():
    rev = load("review-job-pod.json")
    before = rev["request"]["object"]
    pod, ops, resp = patched(rev)
    c = pod["spec"]["containers"][0]
    ckdir = "/checkpoints/gpuproxy-example/train-low-5f1b6c0e"
    assert c["command"] == ["proxy-cli", "run", "--checkpoint-dir", ckdir, "--keep", "2", "--",
                            "python3", "/app/train_torch.py", "--model", "gpt", "--steps", "20000"]
    assert "args" not in c
    env = env_of(c)
    assert env == {"GPUPROXY_ENDPOINT": "ipc:///var/lib/gpuproxy/run/proxyd.sock",
                   "GPUPROXY_SHIM_DIR": "/var/lib/gpuproxy/lib"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["kube-api-access-7xq2k"] == before["spec"]["containers"][0]["volumeMounts"][0]
    assert mounts["gpuproxy-host"] == {"name": "gpuproxy-host", "mountPath": "/var/lib/gpuproxy", "readOnly": True}
    assert mounts["gpuproxy-shm"] == {"name": "gpuproxy-shm", "mountPath": "/dev/shm"}
    assert mounts["gpuproxy-checkpoints"] == {"name": "gpuproxy-checkpoints", "mountPath": "/checkpoints"}
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["kube-api-access-7xq2k"] == before["spec"]["volumes"][0]
    assert vols["gpuproxy-host"]["hostPath"] == {"path": "/var/lib/gpuproxy", "type": "Directory"}
    assert vols["gpuproxy-shm"]["hostPath"] == {"path": "/dev/shm/gpuproxy", "type": "Directory"}
    assert vols["gpuproxy-checkpoints"]["persistentVolumeClaim"] == {"claimName": "gpuproxy-checkpoints"}
    assert c["securityContext"] == {"privileged": True}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 180          # the pod's annotation
    assert pod["spec"]["nodeSelector"] == {"gpuproxy.io/node": "true"}
    assert pod["spec"]["affinity"] == {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"gpuproxy.io/checkpoint": "true"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    ann = pod["metadata"]["annotations"]
    assert ann["gpuproxy.io/checkpoint-dir"] == ckdir
    assert ann["gpuproxy.io/wrapped-containers"] == "train"
    assert ann["gpuproxy.io/grace-period"] == "180"                     # the user's kept
    # nothing else changed
    for k in ("image", "resources", "imagePullPolicy", "terminationMessagePath"):
        assert c[k] == before["spec"]["containers"][0][k]
    for k in ("tolerations", "priorityClassName", "priority", "restartPolicy", "serviceAccountName"):
        assert pod["spec"][k] == before["spec"][k]
    assert pod["metadata"]["labels"] == before["metadata"]["labels"]
    assert pod["metadata"]["ownerReferences"] == before["metadata"]["ownerReferences"]
    assert "warnings" not in resp
    validate_pod(pod)


def test_reinvocation_changes_nothing():
    """reinvocationPolicy IfNeeded: the webhook may see its own output again."""
    rev = load("review-job-pod.json")
    pod, _, _ = patched(rev)
    rev["request"]["object"] = pod
    resp = respond(rev)
    assert resp["allowed"] is True and "patch" not in resp


def test_indexed_job_without_command_uses_the_annotation():
    rev = load("review-indexed-job-pod-annotated-command.json")
    before = rev["request"]["object"]
    pod, ops, _ = patched(rev)
    c = pod["spec"]["containers"][0]
    ckdir = "/checkpoints/research/sweep-5f1b6c0e-3"                  # Job name, uid start, completion index
    assert c["command"] == ["proxy-cli", "run", "--checkpoint-dir", ckdir, "--checkpoint-every", "600",
                            "--keep", "2", "--", "python3", "/app/train_torch.py"]
    assert c["args"] == ["--model", "mlp", "--steps", "5000"]         # still appended by the runtime
    # the wrong endpoint is replaced where it was; the downward-API entry is kept as it is
    assert [e["name"] for e in c["env"]] == ["JOB_COMPLETION_INDEX", "GPUPROXY_ENDPOINT", "GPUPROXY_SHIM_DIR"]
    assert c["env"][0] == before["spec"]["containers"][0]["env"][0]
    assert c["env"][1] == {"name": "GPUPROXY_ENDPOINT", "value": CFG.endpoint}
    assert {"op": "replace", "path": "/spec/containers/0/env/1",
            "value": {"name": "GPUPROXY_ENDPOINT", "value": CFG.endpoint}} in ops
    assert pod["spec"]["terminationGracePeriodSeconds"] == CFG.default_grace_s
    assert pod["metadata"]["annotations"]["gpuproxy.io/checkpoint-dir"] == ckdir
    validate_pod(pod)


def test_container_without_command_is_refused_with_the_fix():
    rev = load("review-bare-pod-no-command.json")
    resp = respond(rev)
    assert resp["allowed"] is False and "patch" not in resp
    msg = resp["status"]["message"]
    assert resp["status"]["code"] == 403
    assert "'lab' has no command" in msg and "ENTRYPOINT" in msg and "gpuproxy.io/command" in msg


def test_annotation_gives_the_entrypoint_per_container():
    rev = load("review-bare-pod-no-command.json")
    pod = rev["request"]["object"]
    pod["metadata"]["annotations"] = {"gpuproxy.io/command": json.dumps({"lab": ["start-notebook.py"]})}
    out, _, _ = patched(rev)
    c = out["spec"]["containers"][0]
    assert c["command"] == ["proxy-cli", "run", "--checkpoint-dir", "/checkpoints/research/notebook-gpu",
                            "--keep", "2", "--", "start-notebook.py"]
    validate_pod(out)
    pod["metadata"]["annotations"] = {"gpuproxy.io/command": "python train.py"}
    assert "not JSON" in respond(rev)["status"]["message"]
    pod["metadata"]["annotations"] = {"gpuproxy.io/command": "[]"}
    assert "non-empty list" in respond(rev)["status"]["message"]


def test_pod_without_label_is_untouched():
    rev = load("review-pod-unlabelled.json")
    resp = respond(rev)
    assert resp == {"uid": rev["request"]["uid"], "allowed": True}


def test_other_kinds_and_operations_are_untouched():
    rev = load("review-job-pod.json")
    upd = copy.deepcopy(rev)
    upd["request"]["operation"] = "UPDATE"
    assert respond(upd) == {"uid": rev["request"]["uid"], "allowed": True}
    other = copy.deepcopy(rev)
    other["request"]["kind"] = {"group": "batch", "version": "v1", "kind": "Job"}
    assert respond(other) == {"uid": rev["request"]["uid"], "allowed": True}


def test_replicaset_pod_is_refused():
    resp = respond(load("review-replicaset-pod.json"))
    assert resp["allowed"] is False
    assert "ReplicaSet" in resp["status"]["message"] and "gpuproxy.io/checkpoint-name" in resp["status"]["message"]


def test_replicaset_pod_with_a_name_annotation_is_wrapped():
    rev = load("review-replicaset-pod.json")
    rev["request"]["object"]["metadata"]["annotations"] = {"gpuproxy.io/checkpoint-name": "infer-main"}
    pod, _, _ = patched(rev)
    assert pod["metadata"]["annotations"]["gpuproxy.io/checkpoint-dir"] == "/checkpoints/serving/infer-main"
    rev["request"]["object"]["metadata"]["annotations"] = {"gpuproxy.io/checkpoint-name": "../etc"}
    assert "not a valid name" in respond(rev)["status"]["message"]


def test_malformed_reviews_are_refused_not_crashed():
    for body in ({}, {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}},
                 {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": "x"}):
        resp = A.review(body, CFG)["response"]
        assert resp["allowed"] is False and resp["status"]["code"] == 400
    rev = load("review-job-pod.json")
    rev["request"]["object"] = None
    assert respond(rev)["status"]["code"] == 400


def test_wrap_false_preloads_the_node_shim_only():
    rev = load("review-job-pod.json")
    obj = rev["request"]["object"]
    obj["metadata"]["annotations"]["gpuproxy.io/wrap"] = "false"
    obj["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so.2"}]
    pod, _, resp = patched(rev)
    c = pod["spec"]["containers"][0]
    assert c["command"] == obj["spec"]["containers"][0]["command"]
    pre = ":".join(f"/var/lib/gpuproxy/lib/{n}" for n in LIBRARIES)
    assert env_of(c) == {"LD_PRELOAD": pre + ":/usr/lib/libjemalloc.so.2", "GPUPROXY_ENDPOINT": CFG.endpoint}
    assert "gpuproxy-checkpoints" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert "securityContext" not in c
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30
    assert any("nothing checkpoints" in w for w in resp["warnings"])
    validate_pod(pod)


def test_refusals_name_the_problem():
    base = load("review-job-pod.json")

    def msg(mutate):
        rev = copy.deepcopy(base)
        mutate(rev["request"]["object"])
        resp = respond(rev)
        assert resp["allowed"] is False
        return resp["status"]["message"]

    def shm(p):
        p["spec"]["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        p["spec"]["containers"][0]["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    assert "'dshm' at /dev/shm" in msg(shm)

    def nonroot(p):
        p["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000}
    assert "runAsUser=1000" in msg(nonroot)

    def bad_grace(p):
        p["metadata"]["annotations"]["gpuproxy.io/grace-period"] = "soon"
    assert "not a whole number" in msg(bad_grace)

    def two_no_gpu(p):
        c = p["spec"]["containers"][0]
        c.pop("resources")
        p["spec"]["containers"].append({"name": "sidecar", "image": "busybox", "command": ["sleep", "inf"]})
    assert "gpuproxy.io/containers" in msg(two_no_gpu)

    def wrong_container(p):
        p["metadata"]["annotations"]["gpuproxy.io/containers"] = "trainer"
    assert "trainer" in msg(wrong_container)


def test_container_runs_as_root_when_the_container_overrides_the_pod():
    rev = load("review-job-pod.json")
    obj = rev["request"]["object"]
    obj["spec"]["securityContext"] = {"runAsUser": 1000}
    obj["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0, "allowPrivilegeEscalation": False}
    pod, _, resp = patched(rev)
    assert pod["spec"]["containers"][0]["securityContext"] == {"runAsUser": 0, "privileged": True}
    assert any("allowPrivilegeEscalation" in w for w in resp["warnings"])
    validate_pod(pod)


def test_capabilities_mode_and_sidecar_selection():
    cfg = Config(pod_security="capabilities")
    rev = load("review-job-pod.json")
    obj = rev["request"]["object"]
    obj["spec"]["containers"].append({"name": "log-shipper", "image": "fluent/fluent-bit:3.0",
                                      "command": ["/fluent-bit/bin/fluent-bit"]})
    obj["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_ADMIN"]}}
    pod, _, _ = patched(rev, cfg)
    c, side = pod["spec"]["containers"]
    assert c["securityContext"] == {"capabilities": {"add": ["NET_ADMIN", *A.CRIU_CAPS]},
                                    "seccompProfile": {"type": "Unconfined"}}
    assert side == obj["spec"]["containers"][1]                        # requests no GPU: not wrapped
    validate_pod(pod)


def test_two_wrapped_containers_share_the_pod_folder_name():
    rev = load("review-job-pod.json")
    obj = rev["request"]["object"]
    second = copy.deepcopy(obj["spec"]["containers"][0])
    second["name"] = "eval"
    obj["spec"]["containers"].append(second)
    pod, _, _ = patched(rev)
    dirs = [c["command"][3] for c in pod["spec"]["containers"]]
    assert dirs == ["/checkpoints/gpuproxy-example/train-low-5f1b6c0e/train",
                    "/checkpoints/gpuproxy-example/train-low-5f1b6c0e/eval"]
    assert pod["metadata"]["annotations"]["gpuproxy.io/wrapped-containers"] == "train,eval"
    validate_pod(pod)


@pytest.mark.skipif(not shutil.which("openssl"), reason="openssl makes the test certificate")
def test_served_over_tls(tmp_path):
    """The webhook's HTTPS server, as the API server calls it (POST /mutate)."""
    from gpuproxy.k8s import webhook
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(tmp_path / "tls.key"),
                    "-out", str(tmp_path / "tls.crt")], check=True, capture_output=True)
    srv = webhook.start_in_thread(CFG, "127.0.0.1", 0, str(tmp_path))
    try:
        port = srv.server_address[1]
        ctx = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
        rev = load("review-job-pod.json")
        req = urllib.request.Request(f"https://localhost:{port}/mutate", data=json.dumps(rev).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            out = json.loads(r.read())
        assert out["response"] == A.review(rev, CFG)["response"]
        with urllib.request.urlopen(f"https://localhost:{port}/healthz", context=ctx, timeout=10) as r:
            assert r.read() == b"ok"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("review-*.json")))
def test_fixture_pods_are_valid(name):
    """The fixtures' pods are what the API server would pass: valid Pods."""
    rev = load(name)
    assert rev["request"]["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    validate_pod(rev["request"]["object"])


def test_one_wrapped_pod_per_node_joins_the_pods_own_affinity():
    rev = load("review-job-pod.json")
    own = {"labelSelector": {"matchLabels": {"app": "train-low"}}, "topologyKey": "topology.kubernetes.io/zone"}
    node_aff = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}
    rev["request"]["object"]["spec"]["affinity"] = {"nodeAffinity": node_aff,
                                                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [own]}}
    pod, _, _ = patched(rev)
    aff = pod["spec"]["affinity"]
    assert aff["nodeAffinity"] == node_aff
    assert aff["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [own, A.ONE_PER_NODE]
    validate_pod(pod)
    rev["request"]["object"] = pod                                    # reinvocation: not added twice
    assert "patch" not in respond(rev)
    off = Config(one_pod_per_node=False)
    rev = load("review-job-pod.json")
    pod, _, _ = patched(rev, off)
    assert "affinity" not in pod["spec"]


def test_a_command_the_user_wrapped_gets_the_rest():
    rev = load("review-job-pod.json")
    c = rev["request"]["object"]["spec"]["containers"][0]
    mine = ["proxy-cli", "run", "--checkpoint-dir", "/checkpoints/mine", "--checkpoint-every", "900", "--",
            "python3", "train.py"]
    c["command"] = mine
    pod, _, _ = patched(rev)
    out = pod["spec"]["containers"][0]
    assert out["command"] == mine
    assert env_of(out)["GPUPROXY_SHIM_DIR"] == "/var/lib/gpuproxy/lib"
    assert {m["name"] for m in out["volumeMounts"]} >= {"gpuproxy-host", "gpuproxy-shm", "gpuproxy-checkpoints"}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 180 and "affinity" in pod["spec"]
