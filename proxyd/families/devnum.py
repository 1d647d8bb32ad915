"""The application's device numbers after a restore onto other GPUs
(issue 22; docs/multigpu.md, "Checkpoints").

A restore with a device map (`--device-map OLD=NEW`) puts the session's
contexts and memory on other physical devices, but the application keeps
its own numbering: the shim answers cudaGetDevice, cuCtxGetDevice and
pointer attributes from its own records, and every later call that names a
device (cuDevicePrimaryCtxRetain for a device first used after the
restore, cuCtxCreate, cuDeviceGetAttribute, cuDeviceCanAccessPeer, ...)
must reach the device that now stands for that number. `sess.dev_map`
(application ordinal -> physical ordinal; empty: the same) does that: the
dispatcher translates every argument the specs declare a device handle
(kind `device`) before the call runs (physical_args), and the map goes
into the image (`dev_map`) so that a second restore composes with it.

The map given to a restore is completed to a permutation of the
machine's devices: a device the map does not name goes to the first
device no named one went to (a job on 0 and 1 restored onto 2 and 3 finds
its never-used numbers 2 and 3 on 0 and 1), so two application devices
never share a physical one.

Not translated (known limit): device ordinals inside structures (VMM and
pool location ids: cuMemCreate's CUmemAllocationProp, cuMemPoolCreate's
props) name physical devices; a restored application that makes new VMM or
pool memory after a remapping restore gets it on the physical device of
that number.

Locking: read and written on the worker's main loop (and by a restore,
which builds a detached session).
"""
from __future__ import annotations

from ..core.kinds import Kind, Stage, register

_DEVICE_ARGS: dict[int, tuple[int, ...]] = {}


def _indices(fn) -> tuple[int, ...]:
    idx = _DEVICE_ARGS.get(id(fn))
    if idx is None:
        idx = _DEVICE_ARGS[id(fn)] = tuple(i for i, p in enumerate(fn.params)
                                           if p[1] == "handle" and p[2] == "device")
    return idx


def physical_args(sess, fn, args: list) -> list:
    """args with every device handle in the application's numbering
    replaced by its physical device."""
    idx = _indices(fn)
    if not idx:
        return args
    out = list(args)
    m = sess.dev_map
    for i in idx:
        if i < len(out) and type(out[i]) is int:
            out[i] = m.get(out[i], out[i])
    return out


def app_device(sess, phys: int) -> int:
    """The application's number of a physical device."""
    for a, p in sess.dev_map.items():
        if p == phys:
            return a
    return phys


def complete(device_map: dict, count: int) -> dict[int, int]:
    """device_map (old physical -> new physical) as a permutation of
    range(count) (module docstring)."""
    m = {int(k): int(v) for k, v in (device_map or {}).items()}
    free = [d for d in range(count) if d not in m.values()]
    for d in range(count):
        if d not in m:
            m[d] = free.pop(0) if free else d
    return m


def compose(old: dict, device_map: dict, count: int) -> dict[int, int]:
    """The application's map after a restore: its map at the dump (app ->
    old physical), then the restore's (old physical -> new physical)."""
    perm = complete(device_map, count)
    apps = set(range(count)) | set(old)
    new = {a: perm.get(old.get(a, a), old.get(a, a)) for a in apps}
    return {a: p for a, p in new.items() if a != p}


def _describe(sess) -> dict:
    m = getattr(sess, "dev_map", None)
    return {"dev_map": {str(a): p for a, p in m.items()}} if m else {}


def _rebuild(r) -> None:
    old = {int(k): int(v) for k, v in (r.desc.get("dev_map") or {}).items()}
    r.sess.dev_map = compose(old, r.device_map, r.backend.device_count()) if (old or r.device_map) else {}


register(Kind("device_numbers", Stage.CONTEXTS, ("dev_map",), describe=_describe, rebuild=_rebuild, owner=__name__))
