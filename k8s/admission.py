"""The mutating admission webhook's decision (AdmissionReview v1 in, JSONPatch out).

A Pod labelled gpuproxy.io/checkpoint=true gets, in each container it wraps:

  * its command wrapped by the preemption contract
        proxy-cli run --checkpoint-dir /checkpoints/<ns>/<name> [--checkpoint-every S] --keep N -- CMD...
    (SIGTERM: whole-process dump into the folder, exit 143; a complete image
    there: restored instead of starting CMD);
  * GPUPROXY_ENDPOINT (proxyd's socket in the host folder) and
    GPUPROXY_SHIM_DIR (the node's shim, which `proxy-cli run` preloads);
    with gpuproxy.io/wrap=false, LD_PRELOAD of that shim instead;
  * the host folder (socket, shim), the host's gpuproxy shared-memory folder
    as /dev/shm (the shim and proxyd map the same segments, proxyd/shm.py)
    and the checkpoint volume (the pod's own volume named
    gpuproxy-checkpoints, else the namespace's claim of that name);
  * what CRIU needs to run inside it (Config.pod_security);

and the pod gets a termination grace period long enough for the dump, the
node selector of the nodes that run proxyd, a pod anti-affinity that keeps
wrapped pods on separate nodes (Config.one_pod_per_node), and two
annotations naming its checkpoint folder and wrapped containers. Pods
without the label, other kinds and other operations are allowed untouched.
The patch is idempotent: a pod that went through it once gets no operation
the second time (reinvocationPolicy: IfNeeded).

The webhook cannot see an image's ENTRYPOINT. A wrapped container without
`command` must get one from the annotation gpuproxy.io/command (a JSON list,
or a JSON object mapping container names to lists); otherwise the pod is
refused with a message saying so. A pod that opted in is never admitted
half-protected: every problem is a refusal naming the container and the fix,
because a pod that silently runs without checkpoints loses its work at the
next preemption.

Pure functions on plain dicts (the JSON of the API server); no kopf, no client.
"""
from __future__ import annotations

import base64
import copy
import json
import re

from gpuproxy.interceptor import LIBRARIES

from .config import (ANN_COMMAND, ANN_CONTAINERS, ANN_DIR, ANN_EVERY, ANN_GRACE, ANN_KEEP, ANN_NAME, ANN_WRAP,
                     ANN_WRAPPED, LABEL, Config)

VOL_HOST = "gpuproxy-host"
VOL_SHM = "gpuproxy-shm"
VOL_CKPT = "gpuproxy-checkpoints"
SHM_PATH = "/dev/shm"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"
# Capabilities CRIU uses to dump and restore a process tree (criu.org, "Security"):
# ptrace and /proc/PID/map_files (SYS_PTRACE, CHECKPOINT_RESTORE), choosing pids and
# restoring namespaces' state (SYS_ADMIN), restoring rlimits (SYS_RESOURCE).
CRIU_CAPS = ("CHECKPOINT_RESTORE", "SYS_ADMIN", "SYS_PTRACE", "SYS_RESOURCE")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,251}[a-z0-9])?$")


class Refusal(Exception):
    """The pod opted in but cannot be wrapped; the message says why and how to fix it."""


def _ptr(*parts) -> str:
    """A JSON Pointer (RFC 6901): '~' and '/' inside a part are escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def checkpoint_name(meta: dict) -> str:
    """The name of a pod's checkpoint folder: stable across the pod's replacements.

    gpuproxy.io/checkpoint-name if set; for a Job's pod the Job's name and the
    start of its uid (a Job created again under the same name starts afresh),
    plus the completion index of an Indexed Job; a StatefulSet's pod or a
    bare pod: its own name. Pods of other controllers (ReplicaSet, DaemonSet)
    are interchangeable, so none of them owns an image: refused."""
    ann = meta.get("annotations") or {}
    given = ann.get(ANN_NAME)
    if given is not None:
        if not _NAME_RE.match(given):
            raise Refusal(f"annotation {ANN_NAME}={given!r} is not a valid name (lower-case letters, digits, "
                          f"'-', '_', '.'; at most 253 characters)")
        return given
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if owner is not None:
        kind = owner.get("kind")
        if kind == "Job":
            uid = (owner.get("uid") or "").replace("-", "")
            if not owner.get("name") or len(uid) < 8:
                raise Refusal("the pod's Job owner reference has no name or uid")
            key = f"{owner['name']}-{uid[:8]}"
            idx = ann.get(JOB_INDEX, (meta.get("labels") or {}).get(JOB_INDEX))
            if idx is not None:
                if not str(idx).isdigit():
                    raise Refusal(f"{JOB_INDEX}={idx!r} is not a number")
                key += f"-{idx}"
            return key
        if kind != "StatefulSet":
            raise Refusal(f"the pod belongs to a {kind} ({owner.get('name')}), whose pods are interchangeable: "
                          f"no checkpoint folder can be its own. Run it as a Job, a StatefulSet or a bare Pod, or "
                          f"name the folder with the annotation {ANN_NAME}")
    name = meta.get("name")
    if not name:
        raise Refusal(f"the pod has no name yet (generateName) and no owner: name it, or name its checkpoint "
                      f"folder with the annotation {ANN_NAME}")
    return name


def _int_annotation(ann: dict, key: str, lo: int, hi: int):
    v = ann.get(key)
    if v is None:
        return None
    try:
        n = int(str(v).strip())
    except ValueError:
        raise Refusal(f"annotation {key}={v!r} is not a whole number") from None
    if not lo <= n <= hi:
        raise Refusal(f"annotation {key}={n} is outside {lo}..{hi}")
    return n


def _gpu_request(c: dict, cfg: Config) -> bool:
    res = c.get("resources") or {}
    for part in ("limits", "requests"):
        for r in cfg.gpu_resources:
            if str((res.get(part) or {}).get(r, "0")) not in ("0", ""):
                return True
    return False


def select_containers(containers: list, ann: dict, cfg: Config) -> list[int]:
    """Indices of the containers to wrap: those named by gpuproxy.io/containers;
    else those that request a GPU; else the only container."""
    names = [c.get("name") for c in containers]
    if ANN_CONTAINERS in ann:
        want = [x.strip() for x in ann[ANN_CONTAINERS].split(",") if x.strip()]
        missing = [w for w in want if w not in names]
        if missing or not want:
            raise Refusal(f"annotation {ANN_CONTAINERS}={ann[ANN_CONTAINERS]!r} names no container or one the pod "
                          f"does not have ({', '.join(missing) or 'empty'}); its containers: {', '.join(names)}")
        return [names.index(w) for w in want]
    gpu = [i for i, c in enumerate(containers) if _gpu_request(c, cfg)]
    if gpu:
        return gpu
    if len(containers) == 1:
        return [0]
    raise Refusal(f"none of the containers ({', '.join(names)}) requests {' or '.join(cfg.gpu_resources)}: say "
                  f"which to wrap with the annotation {ANN_CONTAINERS}")


def _commands_from_annotation(ann: dict) -> dict | list | None:
    raw = ann.get(ANN_COMMAND)
    if raw is None:
        return None
    try:
        v = json.loads(raw)
    except ValueError:
        raise Refusal(f"annotation {ANN_COMMAND} is not JSON (want a list such as [\"python\", \"train.py\"], or "
                      f"an object mapping container names to such lists)") from None
    return v


def _is_cmd(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v) and bool(v[0])


def command_of(c: dict, ann_cmd, cfg: Config) -> list[str]:
    """The command the wrapper runs: the container's own, else the annotation's."""
    if c.get("command"):
        return list(c["command"])
    name = c.get("name")
    v = ann_cmd.get(name) if isinstance(ann_cmd, dict) else ann_cmd
    if v is None:
        raise Refusal(f"container {name!r} has no command, so the image's ENTRYPOINT would run, which the webhook "
                      f"cannot see or wrap. Give the container a command (its args stay as they are), or annotate "
                      f"the pod with {ANN_COMMAND}='[\"python\", \"train.py\"]' (the ENTRYPOINT, plus the image's "
                      f"CMD when the container has no args)")
    if not _is_cmd(v):
        raise Refusal(f"annotation {ANN_COMMAND} for container {name!r} is not a non-empty list of strings")
    return list(v)


def is_wrapped(cmd, cfg: Config) -> bool:
    """The command already runs under the contract (a re-invocation of the webhook)."""
    return (bool(cmd) and len(cmd) > 3 and cmd[0].rsplit("/", 1)[-1] == cfg.proxy_cli.rsplit("/", 1)[-1]
            and cmd[1] == "run" and "--checkpoint-dir" in cmd and "--" in cmd)


def wrap_command(cmd: list[str], ckdir: str, every: int | None, keep: int, cfg: Config) -> list[str]:
    out = [cfg.proxy_cli, "run", "--checkpoint-dir", ckdir]
    if every:
        out += ["--checkpoint-every", str(every)]
    return out + ["--keep", str(keep), "--"] + cmd


def _nonroot_reason(pod_sc: dict, c: dict) -> str | None:
    csc = c.get("securityContext") or {}
    for where, sc in (("container", csc), ("pod", pod_sc)):
        uid = sc.get("runAsUser")
        if uid not in (None, 0):
            return f"its {where} securityContext sets runAsUser={uid}"
        if sc.get("runAsNonRoot"):
            return f"its {where} securityContext sets runAsNonRoot"
        if "runAsUser" in sc or "runAsNonRoot" in sc:
            return None     # the container's own setting decides, as the kubelet does
    return None


class _Patch:
    """Collects RFC 6902 operations; appends to lists that may not exist yet."""

    def __init__(self):
        self.ops: list[dict] = []

    def set(self, exists: bool, path: str, value) -> None:
        self.ops.append({"op": "replace" if exists else "add", "path": path, "value": value})

    def append(self, parent: dict, key: str, path: str, items: list) -> None:
        """Appends items to parent[key] (a list at path), creating it if absent.
        parent is updated too, so that later calls see what this one added."""
        if not items:
            return
        if key in parent and parent[key] is not None:
            for it in items:
                self.ops.append({"op": "add", "path": path + "/-", "value": it})
            parent[key] = list(parent[key]) + items
        else:
            self.ops.append({"op": "add", "path": path, "value": items})
            parent[key] = list(items)


def _security_ops(p: _Patch, c: dict, base: str, cfg: Config, warnings: list) -> None:
    sc = c.get("securityContext")
    if cfg.pod_security == "none":
        return
    if cfg.pod_security == "privileged":
        if sc is None:
            p.set(False, base + "/securityContext", {"privileged": True})
            return
        if sc.get("allowPrivilegeEscalation") is False:
            # The API server refuses privileged together with allowPrivilegeEscalation=false.
            p.ops.append({"op": "remove", "path": base + "/securityContext/allowPrivilegeEscalation"})
            warnings.append(f"container {c.get('name')!r}: allowPrivilegeEscalation=false removed (CRIU needs a "
                            f"privileged container)")
        if sc.get("privileged") is not True:
            p.set("privileged" in sc, base + "/securityContext/privileged", True)
        return
    # capabilities
    caps_ = (sc or {}).get("capabilities") or {}
    have = set(caps_.get("add") or [])
    want = [x for x in CRIU_CAPS if x not in have and "CAP_" + x not in have]
    if sc is None:
        p.set(False, base + "/securityContext", {"capabilities": {"add": list(CRIU_CAPS)},
                                                 "seccompProfile": {"type": "Unconfined"}})
        return
    if "capabilities" not in sc:
        p.set(False, base + "/securityContext/capabilities", {"add": want})
    elif want:
        p.append(caps_, "add", base + "/securityContext/capabilities/add", want)
    if (sc.get("seccompProfile") or {}).get("type") != "Unconfined":
        p.set("seccompProfile" in sc, base + "/securityContext/seccompProfile", {"type": "Unconfined"})


def _env_ops(p: _Patch, c: dict, base: str, env: dict[str, str]) -> None:
    cur = c.get("env")
    if cur is None:
        p.set(False, base + "/env", [{"name": k, "value": v} for k, v in env.items()])
        return
    names = [e.get("name") for e in cur]
    add = []
    for k, v in env.items():
        if k in names:
            i = names.index(k)
            if cur[i] != {"name": k, "value": v}:
                p.set(True, f"{base}/env/{i}", {"name": k, "value": v})
        else:
            add.append({"name": k, "value": v})
    p.append(c, "env", base + "/env", add)


def _mount_ops(p: _Patch, c: dict, base: str, mounts: list[dict]) -> None:
    cur = c.get("volumeMounts") or []
    by_path = {m.get("mountPath", "").rstrip("/") or "/": m for m in cur}
    names = {m.get("name") for m in cur}
    add = []
    for m in mounts:
        if m["name"] in names:
            continue
        other = by_path.get(m["mountPath"].rstrip("/"))
        if other is not None:
            raise Refusal(f"container {c.get('name')!r} mounts volume {other.get('name')!r} at {m['mountPath']}, "
                          f"where gpuproxy mounts {m['name']} ({_MOUNT_WHY[m['name']]}); remove that mount")
        add.append(m)
    p.append(c, "volumeMounts", base + "/volumeMounts", add)


_MOUNT_WHY = {VOL_HOST: "proxyd's socket and the shim",
              VOL_SHM: "memory the shim shares with proxyd; it lies on the host's tmpfs",
              VOL_CKPT: "the checkpoint images"}


ONE_PER_NODE = {"labelSelector": {"matchLabels": {LABEL: "true"}}, "topologyKey": "kubernetes.io/hostname"}


def _anti_affinity_ops(p: _Patch, spec: dict) -> None:
    """A required pod anti-affinity: no two wrapped pods on one node (Config.one_pod_per_node)."""
    aff = spec.get("affinity")
    if aff is None:
        p.set(False, "/spec/affinity", {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                            [ONE_PER_NODE]}})
        return
    anti = aff.get("podAntiAffinity")
    if anti is None:
        p.set(False, "/spec/affinity/podAntiAffinity", {"requiredDuringSchedulingIgnoredDuringExecution":
                                                        [ONE_PER_NODE]})
        return
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    if ONE_PER_NODE not in (anti.get(key) or []):
        p.append(anti, key, "/spec/affinity/podAntiAffinity/" + key, [copy.deepcopy(ONE_PER_NODE)])


def mutate_pod(pod: dict, namespace: str, cfg: Config) -> tuple[list[dict], list[str]]:
    """The JSONPatch operations and admission warnings for one Pod.
    ([], []) for a pod without the opt-in label; Refusal for one that opted
    in and cannot be wrapped."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL) != "true":
        return [], []
    pod = copy.deepcopy(pod)      # _Patch.append records its additions in the object; the caller's stays as it was
    meta = pod.get("metadata") or {}
    if not namespace:
        raise Refusal("the admission request names no namespace")
    ann = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        raise Refusal("the pod has no containers")
    warnings: list[str] = []
    p = _Patch()
    name = checkpoint_name(meta)
    ckdir = f"{cfg.checkpoint_mount.rstrip('/')}/{namespace}/{name}"
    wrap = str(ann.get(ANN_WRAP, "true")).strip().lower() not in ("false", "0", "no")
    every = _int_annotation(ann, ANN_EVERY, 10, 7 * 86400)
    keep = _int_annotation(ann, ANN_KEEP, 1, 1000) or cfg.default_keep
    grace = _int_annotation(ann, ANN_GRACE, 1, cfg.max_grace_s)
    targets = select_containers(containers, ann, cfg)
    ann_cmd = _commands_from_annotation(ann) if wrap else None
    pod_sc = spec.get("securityContext") or {}

    wrapped = []
    for i in targets:
        c = containers[i]
        base = _ptr("spec", "containers", i)
        cname = c.get("name")
        if not _gpu_request(c, cfg):
            warnings.append(f"container {cname!r} requests no {' or '.join(cfg.gpu_resources)}: the scheduler "
                            f"counts no GPU for it (priority preemption frees none for it)")
        env = {"GPUPROXY_ENDPOINT": cfg.endpoint}
        if wrap:
            why = _nonroot_reason(pod_sc, c)
            if why and cfg.pod_security != "none":
                raise Refusal(f"container {cname!r} cannot be checkpointed: {why}, and CRIU dumps and restores "
                              f"its processes from inside it as root")
            # A command that runs under the contract already (this webhook's earlier
            # invocation, or the user's own) is kept; the rest is added all the same.
            if not is_wrapped(c.get("command"), cfg):
                # one folder per wrapped container: each wrapper owns its images
                cdir = f"{ckdir}/{cname}" if len(targets) > 1 else ckdir
                new = wrap_command(command_of(c, ann_cmd, cfg), cdir, every, keep, cfg)
                p.set("command" in c, base + "/command", new)
            env["GPUPROXY_SHIM_DIR"] = cfg.shim_dir
        else:
            pre = ":".join(f"{cfg.shim_dir}/{n}" for n in LIBRARIES)
            old = next((e.get("value") for e in c.get("env") or [] if e.get("name") == "LD_PRELOAD"), None)
            env["LD_PRELOAD"] = old if old and pre in old else (f"{pre}:{old}" if old else pre)
        _env_ops(p, c, base, env)
        mounts = [{"name": VOL_HOST, "mountPath": cfg.host_dir, "readOnly": True},
                  {"name": VOL_SHM, "mountPath": SHM_PATH}]
        if wrap:
            mounts.append({"name": VOL_CKPT, "mountPath": cfg.checkpoint_mount})
            _security_ops(p, c, base, cfg, warnings)
        _mount_ops(p, c, base, mounts)
        wrapped.append(cname)

    if not wrap:
        warnings.append(f"{ANN_WRAP}=false: the shim and endpoint only; nothing checkpoints this pod on SIGTERM")

    vols = [{"name": VOL_HOST, "hostPath": {"path": cfg.host_dir, "type": "Directory"}},
            {"name": VOL_SHM, "hostPath": {"path": cfg.shm_host_dir, "type": "Directory"}}]
    if wrap:
        vols.append({"name": VOL_CKPT, "persistentVolumeClaim": {"claimName": cfg.checkpoint_claim}})
    have = {v.get("name") for v in spec.get("volumes") or []}
    p.append(spec, "volumes", "/spec/volumes", [v for v in vols if v["name"] not in have])

    if wrap and wrapped:
        cur = spec.get("terminationGracePeriodSeconds")
        want = grace if grace is not None else max(int(cur or 30), cfg.default_grace_s)
        if cur != want:
            p.set("terminationGracePeriodSeconds" in spec, "/spec/terminationGracePeriodSeconds", want)

    if wrap and wrapped and cfg.one_pod_per_node:
        _anti_affinity_ops(p, spec)

    sel = spec.get("nodeSelector")
    if sel is None:
        p.set(False, "/spec/nodeSelector", {cfg.node_label: cfg.node_label_value})
    elif cfg.node_label not in sel:
        p.set(False, _ptr("spec", "nodeSelector", cfg.node_label), cfg.node_label_value)
    elif sel[cfg.node_label] != cfg.node_label_value:
        warnings.append(f"nodeSelector {cfg.node_label}={sel[cfg.node_label]!r} kept: proxyd runs on nodes "
                        f"labelled {cfg.node_label}={cfg.node_label_value}")

    new_ann = {ANN_DIR: ckdir} if wrap else {}
    if wrapped and wrap:
        new_ann[ANN_WRAPPED] = ",".join(wrapped)
    new_ann = {k: v for k, v in new_ann.items() if ann.get(k) != v}
    if new_ann:
        if "annotations" not in meta or meta.get("annotations") is None:
            p.set(False, "/metadata/annotations", new_ann)
        else:
            for k, v in new_ann.items():
                p.set(k in ann, _ptr("metadata", "annotations", k), v)
    return p.ops, warnings


def review(body: dict, cfg: Config) -> dict:
    """AdmissionReview (admission.k8s.io/v1) request -> response. Never raises
    on bad input: a malformed review is answered allowed=false with the reason."""
    req = body.get("request") if isinstance(body, dict) else None
    uid = (req or {}).get("uid", "") if isinstance(req, dict) else ""
    resp: dict = {"uid": uid, "allowed": True}
    out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}
    if (not isinstance(req, dict) or body.get("apiVersion") != "admission.k8s.io/v1"
            or body.get("kind") != "AdmissionReview" or not uid):
        resp.update(allowed=False, status={"code": 400, "message": "gpuproxy: not an admission.k8s.io/v1 "
                                                                   "AdmissionReview request"})
        return out
    kind = req.get("kind") or {}
    if kind.get("group", "") != "" or kind.get("kind") != "Pod" or req.get("operation") != "CREATE" \
            or req.get("subResource"):
        return out
    pod = req.get("object")
    if not isinstance(pod, dict):
        resp.update(allowed=False, status={"code": 400, "message": "gpuproxy: the review carries no Pod object"})
        return out
    ns = req.get("namespace") or (pod.get("metadata") or {}).get("namespace") or ""
    try:
        ops, warnings = mutate_pod(pod, ns, cfg)
    except Refusal as e:
        resp.update(allowed=False, status={"code": 403, "reason": "Forbidden", "message": f"gpuproxy: {e}"})
        return out
    if ops:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    if warnings:
        # The API server takes warnings of at most 256 characters each (AdmissionResponse.warnings).
        resp["warnings"] = [("gpuproxy: " + w)[:256] for w in warnings]
    return out
