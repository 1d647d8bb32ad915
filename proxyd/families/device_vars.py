"""__device__ variables as checkpoint object kinds (core/kinds.py): their
contents read while the session is frozen, as image pieces keyed by address
(registered with the modules kind, so that they are captured in the
modules' order, before the arrays' pieces); at a restore, each variable of
the reloaded modules checked against its recorded address (Stage.GLOBALS,
right after the modules) and its contents written back by name once the
memory is restored (Stage.DEVICE_VARS). The manifest's record of them:
the modules' "globals" ({name: [address, size]}) and "addr_map" (addresses
earlier restores moved).

Locking: the checkpoint engine's thread, while the session is frozen (dump)
or not yet served (restore).
"""
from __future__ import annotations

import logging

from ..core import protocol as P
from ..core.kinds import CheckpointError, Kind, Stage, register
from ..core.session import CudaError
from .placement import explain

log = logging.getLogger("proxyd")


def capture(backend, sess, desc: dict) -> list:
    """Contents of every __device__ variable of every loaded module, as
    image pieces keyed by address (flags 0: the engine adds FLAG_GLOBAL);
    where each is goes into its module's entry of desc ("globals")."""
    out = []
    for md, o in zip(desc["modules"], sess.of_kind(P.K_MODULE)):
        ctx = sess.contexts.get(o.ctx)
        if ctx is not None:
            backend.make_current(ctx.real)
        for name in sorted(o.info["parsed"].globals):
            try:
                addr, size = backend.module_global(o.real, name)
            except CudaError:
                continue     # declared but not kept in this image (e.g. optimised out)
            buf = bytearray(size)
            if size:
                backend.dtoh(buf, addr, size, 0, True)
            md["globals"][name] = [addr, size]
            out.append((addr, bytes(buf), 0))
    return out


def _check(r) -> None:
    """Compares every __device__ variable of the reloaded modules with its
    recorded address (Stage.GLOBALS). One that moved is translated where the
    app passes its address to an API call (Session.addr_map), but not where
    the app stored it in device memory (a pointer table) or passes it inside
    kernel arguments (a parameter layout gives offsets and sizes, not which
    parameters are pointers): the restore output lists each moved variable
    so that this is never silent."""
    b, sess, desc = r.backend, r.sess, r.desc
    moved = []
    for md in desc["modules"]:
        mod = sess.objects[(P.K_MODULE, md["id"])]
        b.make_current(sess.contexts[md["ctx"]].real)
        for name, (old_addr, size) in md["globals"].items():
            addr, nsize = b.module_global(mod.real, name)
            if nsize != size:
                raise CheckpointError(f"__device__ variable {name} changed size ({size} -> {nsize} bytes)")
            if addr != old_addr:
                log.warning("session %s: __device__ variable %s moved from %#x to %#x on restore; API calls "
                            "that pass its old address are translated, copies of it kept in device memory "
                            "or passed in kernel arguments are not", sess.token, name, old_addr, addr)
                moved.append({"name": name, "old": old_addr, "new": addr, "size": size, "module": md["id"]})
    st = r.stats
    st["globals"] = sum(len(md["globals"]) for md in desc["modules"])
    st["moved_globals"] = moved
    # why they moved, from the pattern (placement.py); the count is in the output either way
    st["moved_globals_why"] = explain(moved, desc["modules"], st.get("modules_mode"))
    for line in st["moved_globals_why"]:
        log.warning("session %s: %d of %d __device__ variables moved: %s", sess.token, len(moved),
                    st["globals"], line)


def _write(r) -> None:
    """__device__ variables' contents (Stage.DEVICE_VARS): by name into the
    reloaded modules, each checked against its hash in the image."""
    b, sess, desc = r.backend, r.sess, r.desc
    for md in desc["modules"]:
        mod = sess.objects[(P.K_MODULE, md["id"])]
        b.make_current(sess.contexts[md["ctx"]].real)
        for name, (old_addr, size) in md["globals"].items():
            data = r.read_key(old_addr, f"__device__ variable {name}")
            if data is None:
                raise CheckpointError(f"image lacks the contents of __device__ variable {name}")
            addr, nsize = b.module_global(mod.real, name)
            if size:
                b.htod(addr, data, size, 0, True)
            mod.info["globals"][name] = (addr, size)
            # the client may hold this variable's address from before this
            # restore, or from before an earlier one: all lead here now. The
            # image's address first, its chained origins after: the last
            # entry is the app's own (Session.app_address)
            if addr != old_addr:
                sess.addr_map.append((old_addr, size, addr))
            for orig, osize, mid in desc.get("addr_map", []):
                if mid == old_addr and orig != addr:
                    sess.addr_map.append((orig, osize, addr))
    for c in list(sess.contexts.values()):
        b.ctx_sync(c.real)


register(Kind("globals", Stage.GLOBALS, rebuild=_check, owner=__name__))
# addresses of __device__ variables that earlier restores moved
register(Kind("device_vars", Stage.DEVICE_VARS, ("addr_map",),
              describe=lambda sess: {"addr_map": [list(x) for x in sess.addr_map]}, rebuild=_write,
              owner=__name__))
