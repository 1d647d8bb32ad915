"""Names and policies shared by the webhook, the controller and the node agent.

Everything a cluster administrator may want to change is read from the
environment of the controller (or the agent) by `Config.from_env`; the
defaults match the manifests in docker/k8s/base.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

GROUP = "gpuproxy.io"
VERSION = "v1alpha1"

# The opt-in label (the webhook's objectSelector matches it too).
LABEL = "gpuproxy.io/checkpoint"

# Pod annotations a user may set.
ANN_COMMAND = "gpuproxy.io/command"            # JSON list: the ENTRYPOINT of a container without `command`
ANN_CONTAINERS = "gpuproxy.io/containers"      # comma list of the containers to wrap
ANN_GRACE = "gpuproxy.io/grace-period"         # seconds the dump may take after SIGTERM
ANN_EVERY = "gpuproxy.io/checkpoint-every"     # seconds between periodic --leave-running checkpoints
ANN_KEEP = "gpuproxy.io/keep"                  # images kept in the checkpoint folder
ANN_NAME = "gpuproxy.io/checkpoint-name"       # the checkpoint folder's name, instead of the owner's
ANN_WRAP = "gpuproxy.io/wrap"                  # "false": shim and endpoint only, command untouched

# Pod annotations the webhook writes (the controller and the agent read them).
ANN_DIR = "gpuproxy.io/checkpoint-dir"
ANN_WRAPPED = "gpuproxy.io/wrapped-containers"

# Labels on GPUCheckpoint objects, so `kubectl get gpucheckpoints -l gpuproxy.io/pod=NAME` lists a pod's.
CR_LABEL_POD = "gpuproxy.io/pod"
CR_LABEL_KEY = "gpuproxy.io/checkpoint-name"
CR_LABEL_REASON = "gpuproxy.io/reason"
CR_LABEL_SCHEDULE = "gpuproxy.io/schedule"

# Taints that drains and node termination handlers put on a node that is about
# to go: the cordon of `kubectl drain` (node.kubernetes.io/unschedulable, added by
# the node lifecycle controller when spec.unschedulable is set), the cluster
# autoscaler's scale-down taint, Karpenter's disruption taint (1.x and before), the four taints of
# AWS node termination handler (with its TAINT_NODE option), the impending-
# termination taint of GKE's preemptible nodes, the out-of-service taint.
DEFAULT_DRAIN_TAINTS = (
    "node.kubernetes.io/unschedulable",
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",            # Karpenter 1.x
    "karpenter.sh/disruption",           # Karpenter before 1.0
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/rebalance-recommendation",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "cloud.google.com/impending-node-termination",
    "node.kubernetes.io/out-of-service",
)
# Annotations a spot or maintenance notifier of the cluster's own may set instead
# (value: anything non-empty).
DEFAULT_NOTICE_ANNOTATIONS = (
    "gpuproxy.io/termination-notice",
)


def _split(v: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in v.split(",") if x.strip())


@dataclass(frozen=True)
class Config:
    # Host folder the DaemonSet fills (shim libraries in lib/, proxyd's socket in run/);
    # mounted at the same path in proxyd's pod and in every opted-in pod.
    host_dir: str = "/var/lib/gpuproxy"
    # Host folder (on the host's /dev/shm, a tmpfs) mounted as /dev/shm in proxyd's pod
    # and in opted-in pods: the shim and proxyd share memory segments there (proxyd/shm.py).
    shm_host_dir: str = "/dev/shm/gpuproxy"
    endpoint: str = "ipc:///var/lib/gpuproxy/run/proxyd.sock"
    # Shared (ReadWriteMany) volume of checkpoint images, one claim of this name per namespace.
    checkpoint_claim: str = "gpuproxy-checkpoints"
    checkpoint_mount: str = "/checkpoints"
    proxy_cli: str = "proxy-cli"
    default_grace_s: int = 300
    max_grace_s: int = 86400
    default_keep: int = 2
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu",)
    # Where proxyd runs: the webhook adds this node selector, the DaemonSet uses it.
    node_label: str = "gpuproxy.io/node"
    node_label_value: str = "true"
    # privileged | capabilities | none: what the webhook grants a wrapped container so that
    # CRIU can dump and restore its processes inside it (docs/kubernetes.md, "Privileges").
    pod_security: str = "privileged"
    # A cordon (spec.unschedulable) counts as a drain. Off: only the taints and
    # annotations below do (the evictions' SIGTERM dumps still happen).
    watch_cordon: bool = True
    # At most one wrapped pod per node (a required pod anti-affinity the webhook adds):
    # every app's device 0 is the node's first GPU. (Pids no longer mix pods up: proxyd
    # keeps a pod's client under the pid the kernel shows it, docs/kubernetes.md.)
    one_pod_per_node: bool = True
    drain_taints: tuple[str, ...] = DEFAULT_DRAIN_TAINTS
    notice_annotations: tuple[str, ...] = DEFAULT_NOTICE_ANNOTATIONS
    # The node agent (in the DaemonSet).
    agent_port: int = 8471
    agent_label: str = "app.kubernetes.io/name=gpuproxy-node"
    agent_namespace: str = "gpuproxy-system"
    checkpoint_timeout_s: int = 600
    # Garbage collection: GPUCheckpoint objects kept per checkpoint name.
    keep_records: int = 5

    @property
    def shim_dir(self) -> str:
        return self.host_dir.rstrip("/") + "/lib"

    @classmethod
    def from_env(cls, env=None) -> "Config":
        """GPUPROXY_K8S_<FIELD> overrides a field (tuples: comma lists, ints: decimal)."""
        env = os.environ if env is None else env
        kw = {}
        for f in fields(cls):
            v = env.get("GPUPROXY_K8S_" + f.name.upper())
            if v is None:
                continue
            default = f.default
            if isinstance(default, bool):
                if v.strip().lower() not in ("true", "false", "1", "0"):
                    raise ValueError(f"GPUPROXY_K8S_{f.name.upper()}={v!r}: true or false")
                kw[f.name] = v.strip().lower() in ("true", "1")
            elif isinstance(default, tuple):
                kw[f.name] = _split(v)
            elif isinstance(default, int):
                try:
                    kw[f.name] = int(v)
                except ValueError:
                    raise ValueError(f"GPUPROXY_K8S_{f.name.upper()}={v!r}: not an integer") from None
            else:
                kw[f.name] = v
        cfg = cls(**kw)
        if cfg.pod_security not in ("privileged", "capabilities", "none"):
            raise ValueError(f"GPUPROXY_K8S_POD_SECURITY={cfg.pod_security!r}: one of privileged, capabilities, none")
        return cfg
