"""The controller: thin kopf handlers over the pure logic of this package.

Run as `kopf run --all-namespaces --standalone -m gpuproxy.k8s.controller`
(the Deployment in docker/k8s/base does). It needs the `[k8s]` extra (kopf,
kubernetes). What it does:

  * serves the mutating admission webhook (webhook.py, in a thread) when a
    TLS certificate is mounted;
  * GPUCheckpoint created (by a user: on demand; by the controller: drain,
    spot notice, schedule) -> asks the node agent of the pod's node for a
    checkpoint (agent.py) -> writes the status (node, image, size, time,
    stall); then garbage collection: keep-N images in the pod's folder (by
    the agent) and keep-N GPUCheckpoint records per checkpoint name;
  * Node events: a node that starts going (nodes.py) -> one GPUCheckpoint
    per wrapped pod running on it (reason Drain or SpotNotice). Nodes are
    only read: the last signals seen per node are kept in memory (a restart
    acts once more on nodes that are still going, which is harmless), so the
    controller needs no write access to nodes;
  * GPUCheckpointSchedule: every 30 s, a due schedule creates one
    GPUCheckpoint per wrapped running pod its selector matches (owned by
    the schedule, so deleting it deletes them).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request

import kopf
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.rest import ApiException

from . import checkpoints as C
from . import nodes as N
from .config import ANN_KEEP, GROUP, LABEL, VERSION, Config

log = logging.getLogger("gpuproxy.k8s")
CFG = Config.from_env()
TOKEN_FILE = os.environ.get("GPUPROXY_AGENT_TOKEN_FILE", "/var/run/secrets/gpuproxy-agent/token")
_seen: dict[str, dict] = {}
_seen_lock = threading.Lock()


def _plain(obj) -> dict:
    """A client model as the API's JSON (camelCase keys), for the pure functions."""
    return client.ApiClient().sanitize_for_serialization(obj)


class AgentCallError(Exception):
    pass


def _agent_url(node: str) -> str:
    pods = client.CoreV1Api().list_namespaced_pod(CFG.agent_namespace, label_selector=CFG.agent_label,
                                                  field_selector=f"spec.nodeName={node}").items
    ready = [p for p in pods if p.status and p.status.pod_ip and p.status.phase == "Running"]
    if not ready:
        raise AgentCallError(f"no running gpuproxy node agent on node {node} (DaemonSet pods labelled "
                             f"{CFG.agent_label} in {CFG.agent_namespace})")
    return f"http://{ready[0].status.pod_ip}:{CFG.agent_port}"


def _agent_call(node: str, path: str, body: dict, timeout_s: float) -> dict:
    with open(TOKEN_FILE) as f:
        token = f.read().strip()
    req = urllib.request.Request(_agent_url(node) + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read()).get("message")
        except ValueError:
            msg = None
        raise AgentCallError(f"node agent on {node}: {msg or e}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise AgentCallError(f"node agent on {node} unreachable: {e}") from None


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_):
    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    cert_dir = os.environ.get("GPUPROXY_WEBHOOK_CERT_DIR", "/etc/gpuproxy/webhook-tls")
    if os.path.exists(os.path.join(cert_dir, "tls.crt")):
        from .webhook import start_in_thread
        port = int(os.environ.get("GPUPROXY_WEBHOOK_PORT", "8443"))
        start_in_thread(CFG, "0.0.0.0", port, cert_dir)
        log.info("admission webhook serving on :%d", port)
    else:
        log.warning("no TLS certificate in %s: the admission webhook is not served", cert_dir)


@kopf.on.create(GROUP, VERSION, C.PLURAL)
def checkpoint_created(spec, namespace, name, status, patch, **_):
    if (status or {}).get("phase") in ("Succeeded", "Failed"):
        return
    pod_name = spec.get("podName")
    core = client.CoreV1Api()
    try:
        pod = _plain(core.read_namespaced_pod(pod_name, namespace))
    except ApiException as e:
        patch.status.update(C.status_failed(f"pod {namespace}/{pod_name}: {e.reason}"))
        return
    node = (pod.get("spec") or {}).get("nodeName")
    if not N.wrapped(pod):
        patch.status.update(C.status_failed(f"pod {namespace}/{pod_name} is not wrapped by gpuproxy's webhook "
                                            f"(label {LABEL}=true at creation)"))
        return
    if not N.checkpointable(pod) or not node:
        patch.status.update(C.status_failed(f"pod {namespace}/{pod_name} is not running, or is terminating (a "
                                            f"terminating pod dumps itself on SIGTERM)", node))
        return
    timeout = int(spec.get("timeoutSeconds") or CFG.checkpoint_timeout_s)
    # visible at once (`kubectl get gpucheckpoints`: Running on NODE); kopf applies `patch` only at the end
    try:
        client.CustomObjectsApi().patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, C.PLURAL, name, {"status": C.status_running(node, C.now_utc())})
    except ApiException as e:
        log.warning("GPUCheckpoint %s/%s: status: %s", namespace, name, e.reason)
    req = {"namespace": namespace, "pod": pod_name, "uid": pod["metadata"]["uid"], "timeoutSeconds": timeout}
    try:
        ans = _agent_call(node, "/v1/checkpoint", req, timeout + 30)
    except (AgentCallError, OSError) as e:
        patch.status.update(C.status_failed(str(e), node))
        return
    patch.status.update(C.status_from_agent(ans, node))
    keep = int((pod["metadata"].get("annotations") or {}).get(ANN_KEEP) or CFG.default_keep)
    try:
        _agent_call(node, "/v1/gc", {**req, "keep": keep}, 120)
    except (AgentCallError, OSError) as e:
        log.warning("image garbage collection for %s/%s: %s", namespace, pod_name, e)
    _gc_records(namespace)


def _gc_records(namespace: str) -> None:
    api = client.CustomObjectsApi()
    crs = api.list_namespaced_custom_object(GROUP, VERSION, namespace, C.PLURAL).get("items", [])
    for n in C.records_to_delete(crs, CFG.keep_records):
        try:
            api.delete_namespaced_custom_object(GROUP, VERSION, namespace, C.PLURAL, n)
        except ApiException as e:
            if e.status != 404:
                log.warning("deleting GPUCheckpoint %s/%s: %s", namespace, n, e.reason)


def _create_checkpoint(pod: dict, reason: str, schedule: dict | None = None) -> str:
    body = C.new_checkpoint(pod, reason, C.now_utc(), CFG, schedule=(schedule or {}).get("name"))
    if schedule:
        body["metadata"]["ownerReferences"] = [{"apiVersion": C.API_VERSION, "kind": C.SCHEDULE_KIND,
                                                "name": schedule["name"], "uid": schedule["uid"]}]
    ns = pod["metadata"]["namespace"]
    client.CustomObjectsApi().create_namespaced_custom_object(GROUP, VERSION, ns, C.PLURAL, body)
    return body["metadata"]["name"]


@kopf.on.event("", "v1", "nodes")
def node_event(event, body, name, **_):
    if event.get("type") == "DELETED":
        with _seen_lock:
            _seen.pop(name, None)
        return
    new = dict(body)
    with _seen_lock:
        old = _seen.get(name)
        _seen[name] = new
    reasons = N.going(old, new, CFG)
    if not reasons:
        return
    kind = N.reason_kind(reasons)
    pods = client.CoreV1Api().list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}",
                                                          label_selector=f"{LABEL}=true").items
    for pod in N.pods_to_checkpoint([_plain(p) for p in pods], name):
        try:
            cr = _create_checkpoint(pod, kind)
            log.info("node %s: %s -> %s", name, "; ".join(reasons), cr)
        except ApiException as e:
            log.warning("node %s: GPUCheckpoint for %s/%s: %s", name, pod["metadata"]["namespace"],
                        pod["metadata"]["name"], e.reason)


@kopf.timer(GROUP, VERSION, C.SCHEDULE_PLURAL, interval=30)
def schedule_tick(spec, status, namespace, name, uid, patch, **_):
    t = C.now_utc()
    if not C.schedule_due(spec, status, t):
        return
    pods = client.CoreV1Api().list_namespaced_pod(namespace, label_selector=f"{LABEL}=true").items
    made = []
    for pod in (_plain(p) for p in pods):
        if N.checkpointable(pod) and C.selector_matches(spec.get("selector"), pod["metadata"].get("labels")):
            made.append(_create_checkpoint(pod, "Schedule", {"name": name, "uid": uid}))
    patch.status["lastScheduleTime"] = C.rfc3339(t)
    patch.status["lastCheckpoints"] = made
    patch.status["message"] = f"{len(made)} pod(s) checkpointed" if made else "no wrapped running pod matched"
