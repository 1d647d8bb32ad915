"""Checkpoint object kinds: the table the checkpoint engine walks.

Each API family registers the kinds of objects it owns (families/*.py, at
import): what to record of them while the session is frozen (`describe`
for manifest fields, `capture` for contents kept as image pieces,
`module_images` for module images, `pieces` for device memory), what makes
a dump impossible (`check`), what makes an image's fields unfit for this
proxyd before a restore starts (`precheck`), and how to build them again
(`rebuild`) at which point of a restore (`stage`). The engine (checkpoint/engine.py)
imports no family: at a dump it runs `check`, then `describe`,
`module_images`, `capture` and `pieces` of every kind in the table's order
and writes what they return (its own work there is generic: freezing,
copying, hashing, writing the image); at a restore it runs `rebuild` of
every kind in ascending stage (ties: by name). It registers its own steps
(contexts, streams and events, context settings, replayed settings, the
device memory's contents, the client-facing state) in the same table, with
the manifest fields they describe: the manifest is nothing but the kinds' fields, and a
restore nothing but this walk. A new family adds itself here without
touching the engine.

The manifest's fields stay described in one place, checkpoint/
manifest_schema.py (SESSION), which the supervisor and `proxy-cli inspect`
read without loading any family; a kind names the fields it writes
(`keys`), and tests/test_layering.py checks that each has a schema entry.

Locking: the table is filled at import time and only read afterwards.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable


class CheckpointError(Exception):
    """A dump or restore that cannot be done; the message says why (one line)."""


def jsonable(a):
    """A call argument as JSON: bytes become {"bytes": base64}."""
    if isinstance(a, (bytes, bytearray, memoryview)):
        return {"bytes": base64.b64encode(bytes(a)).decode()}
    return a


def unjson(a):
    """jsonable's inverse."""
    if isinstance(a, dict) and "bytes" in a:
        return base64.b64decode(a["bytes"])
    return a


class Stage(IntEnum):
    """The restore order: why each step comes where it does."""
    NONE = 0                 # kinds that rebuild nothing (dump checks only)
    CONTEXTS = 100           # engine: contexts with their flags, under their ids
    MODULES = 200            # modules in the app's load order, before any memory is mapped: the
                             # driver then places __device__ variables where it placed them before
    GLOBALS = 250            # every __device__ variable checked against its recorded address (families/device_vars.py)
    ARENA = 300              # the arena's chunks mapped again at their addresses (families/memory.py)
    POOLS = 400              # stream-ordered pools (their allocations are arena allocations)
    VMM = 410                # the app's physical allocations (cuMemCreate) and their mappings
    GRAPH_MEM = 420          # graph memory nodes' allocations (in the arena)
    GRAPHS = 500             # graphs and executable graphs (name pools, allocations)
    ARRAYS = 600             # CUDA arrays with contents, then texture/surface objects on them
    FUNCTIONS = 700          # kernels by name from the reloaded modules, layouts checked
    STREAMS_EVENTS = 800     # engine: streams and events through their creating calls
    CONTEXT_SETTINGS = 850   # engine: context limits, special streams' attributes
    LIBRARIES = 900          # cuBLAS/cuBLASLt handles and descriptors (streams, workspaces exist)
    CUDNN = 910              # cuDNN backend descriptors: their calls replayed
    REPLAY = 1000            # engine: `restore: replay` settings, now that what they name exists
    LIBCAPTURE = 1100        # library calls captured into graphs, made again from snapshots
    NCCL = 1200              # NCCL communicators, pending: the job's coordinator makes them again after the
                             # restore, with a new unique id (families/nccl_cut.py)
    MEMORY = 1500            # engine: the arena's contents uploaded and checked against the image's hashes
                             # (every device allocation lives in the arena: cuMemAlloc's, pools', VMM
                             # mappings, graph memory nodes'), once everything that maps it exists
    DEVICE_VARS = 1600       # __device__ variables' contents written into the reloaded modules (families/device_vars.py)
    AFTER_MEMORY = 2000      # kinds whose rebuild reads device memory (cuSPARSE analyses replayed)
    SESSION_STATE = 3000     # engine: the client-facing state (sequence number, last reply, ids, async error)
    HOST_MEMORY = 3100       # the client's shared segments registered again, GPU-visible host memory
                             # mapped at its address, the fast channel (families/hostmap.py)


@dataclass
class Restore:
    """What a kind's rebuild gets: the session being built (detached until
    the engine installs it), the image's session description, and helpers."""
    engine: Any              # the checkpoint engine (backend, dispatcher)
    sess: Any
    img: Any                 # checkpoint.image.Image
    desc: dict               # the manifest's `session`
    device_map: dict
    stats: dict              # restore figures (the engine's rstats)
    read_key: Callable[[int, str], bytes | None] = None   # a piece by key, hash-checked; None if absent

    @property
    def backend(self):
        return self.engine.backend

    @property
    def dispatcher(self):
        return self.engine.dispatcher

    def dmap(self, d: int) -> int:
        return self.device_map.get(d, d)


@dataclass(frozen=True)
class Kind:
    name: str
    stage: int = Stage.NONE
    keys: tuple[str, ...] = ()                        # manifest `session` fields it writes
    describe: Callable[[Any], dict] | None = None     # sess -> {key: JSON value}, while frozen
    # (backend, sess, desc) -> [(key, bytes, flags)]: contents kept as pieces
    # of the image (key: a 64-bit number unique in the image, e.g. the
    # address; the engine adds FLAG_GLOBAL to flags), read while frozen,
    # after every kind's describe. desc is the manifest's `session` being
    # made: a kind may complete its own fields there with what it read (the
    # modules: where each __device__ variable is). Each piece is stored in
    # full unless the parent image has the same bytes under its key.
    capture: Callable[[Any, Any, dict], list] | None = None
    # (sess, desc) -> [(entry, image bytes)]: module images, each to be
    # stored once in the image's modules folder (by content); the engine
    # sets entry["image"] to the stored name. entry is the kind's own
    # element of desc (the "modules" kind's list).
    module_images: Callable[[Any, dict], list] | None = None
    check: Callable[[Any], None] | None = None        # sess -> None, or RuntimeError: cannot checkpoint
    rebuild: Callable[[Restore], None] | None = None
    # sess -> the device memory it owns, as the engine's pieces (checkpoint/
    # engine.py Piece: address, length, device, mapping), in address order:
    # saved as the image's memory chunks, which the engine copies, hashes and
    # stores (incremental, concurrent, pre-dump alike) and at Stage.MEMORY
    # uploads and checks. The arena's kind ("memory") has every device
    # allocation there is (cuMemAlloc's, pools', VMM mappings', graph memory
    # nodes'); a family whose memory lived elsewhere would add its own.
    pieces: Callable[[Any], list] | None = None
    # (desc, backend, device_map) -> None, or CheckpointError (one line):
    # a check of the kind's own manifest fields against this proxyd before
    # a restore starts, when nothing has been built yet (the arena's range
    # and size, the fast channel's name). desc is the manifest's `session`,
    # already schema-checked (manifest_schema.py); device_map maps the
    # image's devices to this machine's. Run by precheck() below.
    precheck: Callable[[dict, Any, dict], None] | None = None
    owner: str = field(default="", compare=False)     # the registering module, for messages


KINDS: dict[str, Kind] = {}
# Single functions a family offers the engine outside the walk (the engine
# calls them by name): "destroy_context" (release after a dump).
SERVICES: dict[str, Callable] = {}


def register(kind: Kind) -> Kind:
    old = KINDS.get(kind.name)
    if old is not None and old.owner != kind.owner:
        raise ValueError(f"object kind {kind.name} registered twice ({old.owner}, {kind.owner})")
    KINDS[kind.name] = kind
    return kind


def ordered() -> list[Kind]:
    """Every kind in restore order (stage, then name)."""
    return sorted(KINDS.values(), key=lambda k: (int(k.stage), k.name))


def precheck(desc: dict, backend: Any, device_map: dict) -> None:
    """Every kind's check before a restore (Kind.precheck), in restore
    order; the first refusal is raised (CheckpointError)."""
    for k in ordered():
        if k.precheck is not None:
            k.precheck(desc, backend, device_map)


def provide(name: str, fn: Callable) -> None:
    SERVICES[name] = fn


def service(name: str) -> Callable:
    fn = SERVICES.get(name)
    if fn is None:
        raise CheckpointError(f"no API family provides {name} (families not loaded?)")
    return fn
