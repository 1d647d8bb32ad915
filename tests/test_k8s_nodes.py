"""The controller's decisions on real Node and Pod objects (tests/data/k8s):
a drain, a spot interruption notice, a heartbeat; which pods to checkpoint;
GPUCheckpoint names, status, schedules and record garbage collection."""
import copy
import datetime
import json
from pathlib import Path

import pytest

from gpuproxy.k8s import checkpoints as C
from gpuproxy.k8s import nodes as N
from gpuproxy.k8s.config import Config

DATA = Path(__file__).parent / "data" / "k8s"
CFG = Config()


def load(name):
    return json.loads((DATA / name).read_text())


def test_fixtures_are_valid_kubernetes_objects():
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra) holds the schemas")
    for name in ("node-ready.json", "node-drained.json", "node-spot-itn.json", "node-drained-heartbeat.json",
                 "eviction.json", "pods-on-node.json"):
        kv.validate(load(name), "1.33.0", strict=True)


def test_kubectl_drain_is_seen_once():
    ready, drained, beat = load("node-ready.json"), load("node-drained.json"), load("node-drained-heartbeat.json")
    reasons = N.going(ready, drained, CFG)
    assert reasons == ["node cordoned (spec.unschedulable)",
                       "taint node.kubernetes.io/unschedulable:NoSchedule"]
    assert N.reason_kind(reasons) == "Drain"
    assert N.going(drained, beat, CFG) == []          # still cordoned: nothing new
    assert N.going(beat, ready, CFG) == []            # uncordoned
    assert N.going(None, ready, CFG) == []            # first sight of a healthy node
    assert N.going(None, drained, CFG) != []          # first sight of a draining one (controller restart): act


def test_spot_interruption_taint_and_notice_annotation():
    ready, spot = load("node-ready.json"), load("node-spot-itn.json")
    reasons = N.going(ready, spot, CFG)
    assert reasons == ["taint aws-node-termination-handler/spot-itn=i-0abc123def4567890:NoSchedule"]
    assert N.reason_kind(reasons) == "SpotNotice"
    noted = copy.deepcopy(ready)
    noted["metadata"]["annotations"]["gpuproxy.io/termination-notice"] = "2026-11-27T09:44:30Z"
    assert N.reason_kind(N.going(ready, noted, CFG)) == "SpotNotice"
    # the GPU taint the node always had, or a PreferNoSchedule one, is no signal
    soft = copy.deepcopy(ready)
    soft["spec"]["taints"].append({"key": "karpenter.sh/disruption", "value": "disrupting",
                                   "effect": "PreferNoSchedule"})
    assert N.going(ready, soft, CFG) == []


def test_the_signals_are_configurable():
    ready, spot = load("node-ready.json"), load("node-spot-itn.json")
    cfg = Config.from_env({"GPUPROXY_K8S_DRAIN_TAINTS": "example.com/maintenance",
                           "GPUPROXY_K8S_NOTICE_ANNOTATIONS": "example.com/reboot-at"})
    assert N.going(ready, spot, cfg) == []
    m = copy.deepcopy(ready)
    m["spec"]["taints"].append({"key": "example.com/maintenance", "effect": "NoExecute"})
    m["metadata"]["annotations"]["example.com/reboot-at"] = "03:00"
    assert N.going(ready, m, cfg) == ["annotation example.com/reboot-at=03:00",
                                      "taint example.com/maintenance:NoExecute"]
    # cordons ignored: the drain is seen by its taint only, if that is listed
    drained = load("node-drained.json")
    quiet = Config.from_env({"GPUPROXY_K8S_WATCH_CORDON": "false"})
    assert N.going(ready, drained, quiet) == ["taint node.kubernetes.io/unschedulable:NoSchedule"]
    quieter = Config.from_env({"GPUPROXY_K8S_WATCH_CORDON": "0", "GPUPROXY_K8S_DRAIN_TAINTS": "x"})
    assert N.going(ready, drained, quieter) == []
    with pytest.raises(ValueError):
        Config.from_env({"GPUPROXY_K8S_WATCH_CORDON": "maybe"})
    with pytest.raises(ValueError):
        Config.from_env({"GPUPROXY_K8S_DEFAULT_GRACE_S": "long"})
    with pytest.raises(ValueError):
        Config.from_env({"GPUPROXY_K8S_POD_SECURITY": "root"})


def test_pods_to_checkpoint_on_a_draining_node():
    pods = load("pods-on-node.json")["items"]
    chosen = N.pods_to_checkpoint(pods, "gpu-node-a")
    # the evicted pod (terminating: it got SIGTERM and dumps itself), the unwrapped
    # one and the one on another node are left out
    assert [p["metadata"]["name"] for p in chosen] == ["train-low-x7k2p"]
    assert N.pods_to_checkpoint(pods, "gpu-node-b")[0]["metadata"]["name"] == "train-low-z9y8x"
    assert load("eviction.json")["metadata"]["name"] == pods[1]["metadata"]["name"]


def test_new_checkpoint_objects():
    pod = load("pods-on-node.json")["items"][0]
    t = datetime.datetime(2026, 11, 27, 9, 41, 8, tzinfo=datetime.timezone.utc)
    cr = C.new_checkpoint(pod, "Drain", t, CFG)
    assert cr["metadata"] == {"name": "train-low-x7k2p-drain-20261127-094108", "namespace": "gpuproxy-example",
                              "labels": {"gpuproxy.io/pod": "train-low-x7k2p", "gpuproxy.io/reason": "Drain",
                                         "gpuproxy.io/checkpoint-name": "train-low-5f1b6c0e"}}
    assert cr["spec"] == {"podName": "train-low-x7k2p", "reason": "Drain", "timeoutSeconds": 600}
    with pytest.raises(ValueError):
        C.new_checkpoint(pod, "Whim", t, CFG)
    long_a, long_b = "p" * 250 + "a", "p" * 250 + "b"
    na, nb = C.cr_name(long_a, "OnDemand", t), C.cr_name(long_b, "OnDemand", t)
    assert len(na) <= 253 and len(nb) <= 253 and na != nb


def test_status_from_the_agents_answer():
    ans = {"node": "gpu-node-a", "time": "2026-11-27T09:41:20Z", "images": [
        {"container_pid": 81234, "dir": "/checkpoints/e/k", "path": "/checkpoints/e/k/ckpt-3",
         "sizeBytes": 3 * (1 << 30), "created": "2026-11-27T09:41:19.512+00:00", "durationMs": 11250,
         "stallMs": None, "criuMs": 812.4}]}
    st = C.status_from_agent(ans, "gpu-node-a")
    assert st == {"phase": "Succeeded", "node": "gpu-node-a", "image": "/checkpoints/e/k/ckpt-3",
                  "sizeBytes": 3 << 30, "size": "3.0 GiB", "checkpointTime": "2026-11-27T09:41:19.512+00:00",
                  "durationMs": 11250, "stallMs": 812.4, "stall": "812ms (CRIU)",
                  "message": "1 image(s) written by the pod's wrapper"}
    ans["images"][0]["stallMs"] = 2450.0
    assert C.status_from_agent(ans, "n")["stall"] == "2.5s"
    assert C.status_from_agent({"images": []}, "n")["phase"] == "Failed"


def test_schedules():
    t = datetime.datetime(2026, 11, 27, 10, 0, 0, tzinfo=datetime.timezone.utc)
    spec = {"selector": {"matchLabels": {"app": "train-low"}}, "intervalSeconds": 900}
    assert C.schedule_due(spec, {}, t)
    assert not C.schedule_due(spec, {"lastScheduleTime": "2026-11-27T09:50:00Z"}, t)
    assert C.schedule_due(spec, {"lastScheduleTime": "2026-11-27T09:45:00Z"}, t)
    assert not C.schedule_due({**spec, "suspend": True}, {}, t)
    assert not C.schedule_due({**spec, "intervalSeconds": 5}, {"lastScheduleTime": "2026-11-27T09:59:30Z"}, t)
    labels = load("pods-on-node.json")["items"][0]["metadata"]["labels"]
    assert C.selector_matches(spec["selector"], labels)
    assert not C.selector_matches({"matchLabels": {"app": "other"}}, labels)
    assert C.selector_matches({"matchExpressions": [{"key": "job-name", "operator": "In",
                                                     "values": ["train-low", "x"]},
                                                    {"key": "tier", "operator": "DoesNotExist"}]}, labels)
    assert not C.selector_matches({"matchExpressions": [{"key": "app", "operator": "NotIn",
                                                         "values": ["train-low"]}]}, labels)
    assert not C.selector_matches({}, labels)                  # an empty selector selects nothing


def _cr(name, created, phase, key="train-low-5f1b6c0e"):
    return {"metadata": {"name": name, "creationTimestamp": created, "labels": {"gpuproxy.io/checkpoint-name": key}},
            "spec": {"podName": "p"}, "status": {"phase": phase} if phase else {}}


def test_record_garbage_collection():
    crs = [_cr("a", "2026-11-27T01:00:00Z", "Succeeded"),
           _cr("b", "2026-11-27T02:00:00Z", "Failed"),
           _cr("c", "2026-11-27T03:00:00Z", "Succeeded"),
           _cr("d", "2026-11-27T04:00:00Z", "Running"),
           _cr("e", "2026-11-27T05:00:00Z", "Failed"),
           _cr("f", "2026-11-27T06:00:00Z", "Failed"),
           _cr("z", "2026-11-27T00:00:00Z", "Succeeded", key="other")]
    # keep 2: e, f are the newest; c is the newest Succeeded (kept); d still runs (kept)
    assert sorted(C.records_to_delete(crs, 2)) == ["a", "b"]
    assert C.records_to_delete(crs, 10) == []
    assert sorted(C.records_to_delete(crs, 1)) == ["a", "b", "e"]
