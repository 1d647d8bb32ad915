"""GPUCheckpoint and GPUCheckpointSchedule objects: names, new objects,
status from the node agent's answer, when a schedule is due, and which
records garbage collection removes. Pure functions on plain dicts.

GPUCheckpoint (namespaced):
    spec:   podName, reason (OnDemand | Drain | SpotNotice | Schedule), timeoutSeconds
    status: phase (Pending | Running | Succeeded | Failed), node, image, sizeBytes,
            size, checkpointTime, durationMs, stallMs, stall, message
GPUCheckpointSchedule (namespaced):
    spec:   selector (a label selector of pods), intervalSeconds, keep, suspend
    status: lastScheduleTime, lastCheckpoints, message
"""
from __future__ import annotations

import datetime
import hashlib
import re

from .config import (ANN_DIR, CR_LABEL_KEY, CR_LABEL_POD, CR_LABEL_REASON, CR_LABEL_SCHEDULE, GROUP, VERSION,
                     Config)

API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPUCheckpoint"
SCHEDULE_KIND = "GPUCheckpointSchedule"
PLURAL = "gpucheckpoints"
SCHEDULE_PLURAL = "gpucheckpointschedules"
REASONS = ("OnDemand", "Drain", "SpotNotice", "Schedule")
PHASES = ("Pending", "Running", "Succeeded", "Failed")
MIN_INTERVAL_S = 60


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def rfc3339(t: datetime.datetime) -> str:
    return t.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> datetime.datetime | None:
    if not s:
        return None
    try:
        t = datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=datetime.timezone.utc)


def fmt_size(n: int | None) -> str:
    if n is None:
        return ""
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{int(v)} B" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return str(n)


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return ""
    return f"{ms:.0f}ms" if ms < 1000 else f"{ms / 1000:.1f}s"


def _label_value(s: str) -> str:
    """A label value (at most 63 characters, alphanumeric at both ends)."""
    s = re.sub(r"[^A-Za-z0-9_.-]", "-", s)[:63]
    return s.strip("-_.")


def cr_name(pod: str, reason: str, t: datetime.datetime) -> str:
    """<pod>-<reason>-<YYYYmmdd-HHMMSS>, a DNS subdomain name; a long pod name
    is cut and marked with a hash so names stay unique."""
    tail = f"-{reason.lower()}-{t.astimezone(datetime.timezone.utc).strftime('%Y%m%d-%H%M%S')}"
    base = pod.lower()
    if len(base) + len(tail) > 253:
        h = hashlib.sha256(pod.encode()).hexdigest()[:8]
        base = base[:253 - len(tail) - 9].rstrip("-.") + "-" + h
    return base + tail


def new_checkpoint(pod: dict, reason: str, t: datetime.datetime, cfg: Config, schedule: str | None = None) -> dict:
    """A GPUCheckpoint object for pod (the controller creates it, then acts on it)."""
    if reason not in REASONS:
        raise ValueError(f"reason {reason!r}: one of {', '.join(REASONS)}")
    meta = pod.get("metadata") or {}
    key = (meta.get("annotations") or {}).get(ANN_DIR, "").rstrip("/").rsplit("/", 1)[-1]
    labels = {CR_LABEL_POD: _label_value(meta.get("name", "")), CR_LABEL_REASON: reason}
    if key:
        labels[CR_LABEL_KEY] = _label_value(key)
    if schedule:
        labels[CR_LABEL_SCHEDULE] = _label_value(schedule)
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": cr_name(meta.get("name", "pod"), reason, t), "namespace": meta.get("namespace"),
                     "labels": labels},
        "spec": {"podName": meta.get("name"), "reason": reason, "timeoutSeconds": cfg.checkpoint_timeout_s},
    }


def status_running(node: str, t: datetime.datetime) -> dict:
    return {"phase": "Running", "node": node, "startTime": rfc3339(t), "message": "checkpoint requested from the "
                                                                                  "node agent"}


def status_failed(message: str, node: str | None = None) -> dict:
    st = {"phase": "Failed", "message": message[:1024]}
    if node:
        st["node"] = node
    return st


def status_from_agent(answer: dict, node: str) -> dict:
    """The status of a GPUCheckpoint from the agent's answer to a checkpoint
    request (agent.checkpoint_pod). One image per wrapped container; the
    status shows the first and their total size."""
    imgs = answer.get("images") or []
    if not imgs:
        return status_failed(answer.get("message") or "the agent reported no image", node)
    first = imgs[0]
    size = sum(int(i.get("sizeBytes") or 0) for i in imgs)
    stall = first.get("stallMs")
    st = {
        "phase": "Succeeded", "node": node, "image": first.get("path"), "sizeBytes": size, "size": fmt_size(size),
        "checkpointTime": first.get("created") or answer.get("time"), "durationMs": first.get("durationMs"),
        "message": f"{len(imgs)} image(s) written by the pod's wrapper",
    }
    if stall is not None:
        st["stallMs"] = stall
        st["stall"] = fmt_ms(stall)
    elif first.get("criuMs") is not None:
        st["stallMs"] = first["criuMs"]
        st["stall"] = fmt_ms(first["criuMs"]) + " (CRIU)"
    if len(imgs) > 1:
        st["images"] = [i.get("path") for i in imgs]
    return {k: v for k, v in st.items() if v is not None}


def schedule_due(spec: dict, status: dict | None, t: datetime.datetime) -> bool:
    """A schedule is due when it is not suspended and intervalSeconds (at least
    MIN_INTERVAL_S) have passed since its last run (or it never ran)."""
    if spec.get("suspend"):
        return False
    every = max(MIN_INTERVAL_S, int(spec.get("intervalSeconds") or 0))
    last = parse_time((status or {}).get("lastScheduleTime"))
    return last is None or (t - last).total_seconds() >= every


def selector_matches(selector: dict | None, labels: dict | None) -> bool:
    """metav1.LabelSelector semantics (matchLabels and matchExpressions with
    In, NotIn, Exists, DoesNotExist). An empty selector matches nothing here:
    a schedule must say which pods it checkpoints."""
    if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return False
    labels = labels or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        k, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and k in labels and labels[k] in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def records_to_delete(crs: list[dict], keep: int) -> list[str]:
    """Names of GPUCheckpoint objects that garbage collection removes: per
    checkpoint name (label gpuproxy.io/checkpoint-name, else the pod), all
    but the `keep` newest; never one still Pending or Running, never the
    newest Succeeded one (it describes the image a restore uses)."""
    keep = max(1, int(keep))
    groups: dict[str, list[dict]] = {}
    for cr in crs:
        labels = (cr.get("metadata") or {}).get("labels") or {}
        g = labels.get(CR_LABEL_KEY) or "pod:" + str((cr.get("spec") or {}).get("podName"))
        groups.setdefault(g, []).append(cr)
    out = []
    for items in groups.values():
        items.sort(key=lambda c: ((c.get("metadata") or {}).get("creationTimestamp") or "",
                                  (c.get("metadata") or {}).get("name") or ""), reverse=True)
        newest_ok = next((c for c in items if (c.get("status") or {}).get("phase") == "Succeeded"), None)
        for c in items[keep:]:
            phase = (c.get("status") or {}).get("phase")
            if c is newest_ok or phase in (None, "Pending", "Running"):
                continue
            out.append(c["metadata"]["name"])
    return out
