"""When a node is about to go, and which pods on it to checkpoint first.

A node is going when (each configurable, config.Config):
  * it is cordoned: spec.unschedulable becomes true (`kubectl drain` and most
    maintenance tooling cordon before they evict; Config.watch_cordon);
  * it carries one of the drain taints (NoSchedule or NoExecute) that node
    termination handlers, the cluster autoscaler and Karpenter put on it;
  * it carries one of the notice annotations (a spot or maintenance notifier
    of the cluster's own).

The controller acts on the rising edge only (the signal is in the new Node
and not in the old one), so an update of a node that stays cordoned does not
checkpoint its pods again. The evictions that follow a drain send SIGTERM,
on which each wrapped pod dumps itself (the contract); the checkpoint taken
at the notice is the one that survives a node that vanishes before that.

Pure functions on Node and Pod objects as the API server returns them.
"""
from __future__ import annotations

from .config import ANN_DIR, LABEL, Config

_EFFECTS = ("NoSchedule", "NoExecute")


def signals(node: dict | None, cfg: Config) -> dict[str, str]:
    """{signal id: human reason} of everything on node that says it is going."""
    if not node:
        return {}
    out = {}
    spec = node.get("spec") or {}
    if spec.get("unschedulable") and cfg.watch_cordon:
        out["cordon"] = "node cordoned (spec.unschedulable)"
    for t in spec.get("taints") or []:
        key = t.get("key")
        if key in cfg.drain_taints and t.get("effect") in _EFFECTS:
            val = f"={t['value']}" if t.get("value") else ""
            out[f"taint:{key}"] = f"taint {key}{val}:{t.get('effect')}"
    ann = (node.get("metadata") or {}).get("annotations") or {}
    for a in cfg.notice_annotations:
        if ann.get(a):
            out[f"annotation:{a}"] = f"annotation {a}={ann[a]}"
    return out


def going(old: dict | None, new: dict | None, cfg: Config) -> list[str]:
    """Reasons that appear in new and were not in old (empty: nothing new)."""
    before, after = signals(old, cfg), signals(new, cfg)
    return [after[k] for k in sorted(after) if k not in before]


def reason_kind(reasons: list[str]) -> str:
    """The GPUCheckpoint reason for a node event: SpotNotice for a termination
    taint or annotation, Drain for a cordon or a drain taint."""
    spotty = ("spot", "termination", "rebalance", "impending", "notice", "maintenance")
    return "SpotNotice" if any(w in r for r in reasons for w in spotty) else "Drain"


def wrapped(pod: dict) -> bool:
    """The pod opted in and the webhook wrapped it (it names its checkpoint folder)."""
    meta = pod.get("metadata") or {}
    return (meta.get("labels") or {}).get(LABEL) == "true" and bool((meta.get("annotations") or {}).get(ANN_DIR))


def checkpointable(pod: dict) -> bool:
    """Wrapped, running, and not terminating (a terminating pod got SIGTERM
    and is dumping itself)."""
    return ((pod.get("status") or {}).get("phase") == "Running" and not (pod.get("metadata") or {}).get(
        "deletionTimestamp") and wrapped(pod))


def pods_to_checkpoint(pods: list[dict], node_name: str) -> list[dict]:
    """The checkpointable pods on node_name."""
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node_name and checkpointable(p)]
