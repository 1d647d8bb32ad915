"""The schema of a checkpoint manifest (docs/image-format.md): every field
that gpuproxy reads, with its type and range, checked before any of it is
used. An image is untrusted input: its manifest names files (module keys),
shared-memory objects (the session token, the channel), addresses and sizes,
and a restore acts on all of them.

The tables are per field and meant to be extended: a new manifest field is
one entry in MANIFEST (top level) or SESSION (the engine's `session`). Keys
not in a table are allowed (new keys may be added within a format version)
but nothing may rely on them before they are given an entry.

    validate_manifest(body)                 # raises SchemaError
    validate_session(session, strict=True)  # what a restore needs, all present

A SchemaError's message is one line naming the field:
    manifest field session.modules[0].image: expected a sha256 key (64 lower-case hex digits), got '../../etc/shadow'
"""
from __future__ import annotations

import re


class SchemaError(Exception):
    def __init__(self, path: str, what: str):
        super().__init__(f"manifest field {path}: {what}")
        self.path = path


def _show(v) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


class Spec:
    def check(self, v, path: str, strict: bool) -> None:
        raise NotImplementedError


class Any_(Spec):
    def check(self, v, path, strict):
        pass


class Int(Spec):
    def __init__(self, lo: int = 0, hi: int = (1 << 64) - 1):
        self.lo, self.hi = lo, hi

    def check(self, v, path, strict):
        if type(v) is not int:
            raise SchemaError(path, f"expected an integer, got {_show(v)}")
        if not self.lo <= v <= self.hi:
            raise SchemaError(path, f"{v} is outside [{self.lo}, {self.hi}]")


class Bool(Spec):
    def check(self, v, path, strict):
        if type(v) is not bool:
            raise SchemaError(path, f"expected true or false, got {_show(v)}")


class Str(Spec):
    def __init__(self, maxlen: int = 4096, pattern: str | None = None, what: str | None = None):
        self.maxlen = maxlen
        self.pattern = re.compile(pattern) if pattern else None
        self.what = what

    def check(self, v, path, strict):
        if type(v) is not str:
            raise SchemaError(path, f"expected {self.what or 'a string'}, got {_show(v)}")
        if len(v) > self.maxlen:
            raise SchemaError(path, f"string of {len(v)} characters, at most {self.maxlen}")
        if "\0" in v or (self.pattern is not None and not self.pattern.fullmatch(v)):
            raise SchemaError(path, f"expected {self.what or 'a string of ' + self.pattern.pattern}, got {_show(v)}")


class Enum(Spec):
    def __init__(self, *values):
        self.values = values

    def check(self, v, path, strict):
        if v not in self.values or type(v) is bool:
            raise SchemaError(path, f"expected one of {list(self.values)}, got {_show(v)}")


class Opt(Spec):
    """null or spec."""

    def __init__(self, spec: Spec):
        self.spec = spec

    def check(self, v, path, strict):
        if v is not None:
            self.spec.check(v, path, strict)


class List(Spec):
    def __init__(self, of: Spec, maxlen: int = 1 << 20):
        self.of, self.maxlen = of, maxlen

    def check(self, v, path, strict):
        if type(v) is not list:
            raise SchemaError(path, f"expected a list, got {_show(v)}")
        if len(v) > self.maxlen:
            raise SchemaError(path, f"list of {len(v)} entries, at most {self.maxlen}")
        for i, x in enumerate(v):
            self.of.check(x, f"{path}[{i}]", strict)


class Tuple(Spec):
    """A list of fixed length with a spec per position."""

    def __init__(self, *items: Spec):
        self.items = items

    def check(self, v, path, strict):
        if type(v) is not list or len(v) != len(self.items):
            raise SchemaError(path, f"expected a list of {len(self.items)} entries, got {_show(v)}")
        for i, (x, s) in enumerate(zip(v, self.items)):
            s.check(x, f"{path}[{i}]", strict)


class Map(Spec):
    """An object whose keys follow `keys` and values `values`."""

    def __init__(self, keys: Str, values: Spec, maxlen: int = 1 << 20):
        self.keys, self.values, self.maxlen = keys, values, maxlen

    def check(self, v, path, strict):
        if type(v) is not dict:
            raise SchemaError(path, f"expected an object, got {_show(v)}")
        if len(v) > self.maxlen:
            raise SchemaError(path, f"object of {len(v)} entries, at most {self.maxlen}")
        for k, x in v.items():
            self.keys.check(k, f"{path} key {_show(k)}", strict)
            self.values.check(x, f"{path}.{k}", strict)


class Obj(Spec):
    """An object with known fields: {key: spec} (required) and optional ones.
    strict: required fields must be present; otherwise only the fields that
    are present are checked (inspect shows what it can of any image)."""

    def __init__(self, fields: dict[str, Spec], optional: dict[str, Spec] | None = None):
        self.fields, self.optional = fields, optional or {}

    def check(self, v, path, strict):
        if type(v) is not dict:
            raise SchemaError(path, f"expected an object, got {_show(v)}")
        for k, s in self.fields.items():
            if k in v:
                s.check(v[k], f"{path}.{k}" if path else k, strict)
            elif strict:
                raise SchemaError(f"{path}.{k}" if path else k, "missing")
        for k, s in self.optional.items():
            if k in v:
                s.check(v[k], f"{path}.{k}" if path else k, strict)


# ------------------------------------------------------------------ pieces

U64 = Int(0, (1 << 64) - 1)
COUNT = Int(0, (1 << 63) - 1)
SIZE = Int(0, 1 << 48)               # bytes of one object: far above any device's memory, far below overflow
ID = Int(0, (1 << 32) - 1)           # a per-session object id (the low half of a handle)
DEVICE = Int(0, 1023)
HEX64 = Str(64, r"[0-9a-f]{64}", "a sha256 key (64 lower-case hex digits)")
# a name that becomes part of a file or shared-memory object name: no '/', no
# '..', nothing but letters, digits and - _ .
PLAIN = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
TOKEN = Str(64, PLAIN, "a session token (letters, digits, '-', '_', '.')")
CHANNEL = Str(96, r"/gpuproxy-" + PLAIN + r"-chan", "a channel name /gpuproxy-<token>-chan")
SYMBOL = Str(1024, r"[^\x00-\x1f]+", "a symbol name (printable)")
# base64 as b64encode writes it (RFC 4648 section 4: groups of four, '='
# only as the last group's padding), so that decoding it cannot fail later
B64 = Str(1 << 24, r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?", "base64 text")
NUM = Str(20, r"[0-9]+", "a number")   # JSON object keys that stand for numbers
HANDLE_ARGS = List(Any_(), 64)       # re-checked by the dispatcher's argument types when replayed

# ------------------------------------------------------------------ tables

SESSION = Obj({
    "token": TOKEN,
    "pid": Int(0, 1 << 22),                  # Linux pid_max is at most 2^22
    "slot": Int(0, 62),                      # a session slot (slot 63 is proxyd's own)
    "last_seq": COUNT,
    "last_reply": Opt(List(B64, 64)),
    "next_id": Map(Str(2, r"[0-9]+", "a kind number"), ID, 64),
    "async_error": Opt(Tuple(Int(-(1 << 31), (1 << 31) - 1), Int(0, 1 << 20), Str(1 << 16))),
    "contexts": List(Obj({"id": ID, "device": DEVICE, "primary": Bool(), "flags": ID, "refcount": ID},
                         optional={"limits": Map(NUM, U64, 64),
                                   "stream_attrs": Map(NUM, Map(NUM, Any_(), 64), 8)}), 4096),
    # seq: the place of a module load / first kernel lookup in the app's
    # order of them (families/modrestore.py replays it)
    "modules": List(Obj({"id": ID, "ctx": ID, "size": SIZE, "image": HEX64, "kernels": List(SYMBOL, 1 << 16),
                         "globals": Map(SYMBOL, Tuple(U64, SIZE), 1 << 16)},
                        optional={"seq": ID}), 1 << 16),
    "functions": List(Obj({"id": ID, "ctx": ID, "module": ID, "name": SYMBOL,
                           "layout": List(Tuple(Int(0, 1 << 16), Int(0, 1 << 16)), 4096)},
                          optional={"seq": ID}), 1 << 20),
    "streams": List(Obj({"id": ID, "ctx": ID, "create": Tuple(Int(0, 1 << 20), U64, HANDLE_ARGS)},
                        optional={"attrs": Map(NUM, Any_(), 64)}), 1 << 16),
    "events": List(Obj({"id": ID, "ctx": ID, "create": Tuple(Int(0, 1 << 20), U64, HANDLE_ARGS)},
                       optional={"recorded": Bool()}), 1 << 20),
    "arena": Obj({"base": U64, "size": U64,
                  "chunks": List(Tuple(U64, SIZE, DEVICE, Bool()), 1 << 22),
                  "allocations": List(Tuple(U64, SIZE, SIZE), 1 << 24)},
                 optional={"reservations": List(Tuple(U64, SIZE), 1 << 20),     # the app's VMM (vmm.py)
                           "vmm_chunks": List(U64, 1 << 22)}),
    "shm": Obj({"staging": Opt(ID), "registered": List(ID, 1 << 16)},
               # GPU-visible host segments (docs/host-memory.md): segment, address, length, kind, flags
               optional={"maps": List(Tuple(ID, Int(4096, (1 << 48) - 1), Int(1, 1 << 47), Int(1, 3),
                                            Int(0, (1 << 32) - 1)), 1 << 16)}),
    "channel": Opt(CHANNEL),
    "addr_map": List(Tuple(U64, SIZE, U64), 1 << 16),
}, optional={
    "exe": Str(4096),
    "pidns": Opt(Str(64, r"pid:\[[0-9]+\]", "a pid namespace pid:[N]")),
    "start_time": Opt(COUNT),               # the process's start time (clock ticks after boot)
    "uid": Opt(Int(0, (1 << 32) - 1)),
    "owner_uid": Opt(Int(0, (1 << 32) - 1)),   # the user the worker served (proxyd/worker/gate.py)
    # settings recorded from `restore: replay` calls (docs/spec-format.md):
    # [function id, context handle, arguments], re-checked by the dispatcher
    "replay": List(Tuple(Int(0, 1 << 20), U64, HANDLE_ARGS), 1 << 16),
    "primary_flags": Map(NUM, ID, 1024),
    # stream-ordered allocator pools (proxyd/families/mempool.py) and each device's current pool
    "mem_pools": List(Obj({"id": ID, "device": DEVICE, "default": Bool(), "attrs": Map(NUM, U64, 16),
                           "access": Map(NUM, Int(0, 3), 1024), "allocs": List(Tuple(U64, SIZE), 1 << 24),
                           "used_high": U64},
                          # exportable pools (proxyd/families/mempool_ipc.py): CUmemAllocationHandleType bits
                          optional={"handle_types": Int(0, 15)}), 1 << 16),
    "mem_pool_current": Map(NUM, ID, 1024),
    # the application's physical allocations (cuMemCreate, proxyd/families/vmm.py)
    "mem_handles": List(Obj({"id": ID, "size": SIZE, "device": DEVICE, "mapped": Opt(U64), "used": Bool(),
                             "prop": Str(64, r"[0-9a-f]*", "hex bytes")},
                            # access the application set for other devices (proxyd/families/vmm.py): [device, flags]
                            optional={"access": List(Tuple(DEVICE, Int(0, 3)), 1024)}), 1 << 20),
    # graphs and executable graphs (proxyd/families/graphs.py): their ops, re-checked
    # by the dispatcher's argument types when launched
    "graphs": List(Obj({"id": ID, "kind": Enum("graph", "exec"), "ctx": ID,
                        "nodes": List(Tuple(Int(0, 1 << 20), U64, HANDLE_ARGS), 1 << 20)},
                       optional={"origin": U64, "capturing": Bool(), "graph": ID,
                                 # graph allocations it holds (proxyd/families/graph_mem.py), instantiate flags
                                 "mem": List(U64, 1 << 20), "flags": U64,
                                 # graphs built explicitly (proxyd/families/graph_nodes.py): their nodes,
                                 # and per executable graph where each node's ops are
                                 "xnodes": List(Obj({"id": ID, "type": Int(0, 13), "deps": List(ID, 1 << 20)},
                                                    optional={"ops": List(Tuple(Int(0, 1 << 20), U64, HANDLE_ARGS), 2),
                                                              "child": List(Tuple(Int(0, 1 << 20), U64,
                                                                                  HANDLE_ARGS), 1 << 20),
                                                              # edges' data other than the default
                                                              # (graph_edges.py): [upstream, from, to, type]
                                                              "edata": List(Tuple(ID, Int(0, 2), Int(0, 0),
                                                                                  Int(0, 1)), 1 << 20)}),
                                                1 << 20),
                                 "index": List(Tuple(ID, List(Int(0, 1 << 31), 1 << 20)), 1 << 20),
                                 "node_order": List(ID, 1 << 20),
                                 # nodes of an executable graph disabled (proxyd/families/graph_exec_nodes.py)
                                 "disabled": List(ID, 1 << 20),
                                 # math-library calls captured into the graph (proxyd/families/graph_libcapture.py):
                                 # node index, capturing stream, snapshots of the library objects named
                                 "libcaptures": List(Tuple(Int(0, 1 << 20), Obj({
                                     "stream": U64,
                                     "objects": List(Obj({"param": Int(0, 64), "kind": Str(64, r"[a-z_]+", "a kind"),
                                                          "ctx": ID, "value": U64,
                                                          "create": Tuple(Int(0, 1 << 20), U64, HANDLE_ARGS),
                                                          "settings": List(Tuple(Int(0, 1 << 20), HANDLE_ARGS),
                                                                           1 << 16)}), 64)})), 1 << 20),
                                 "sig": List(List(Any_(), 3), 1 << 20)}), 1 << 16),
    # graph memory nodes' allocations (proxyd/families/graph_mem.py): address, size,
    # device, live; per device the high-water mark of graph memory
    "graph_mem": Obj({"allocs": List(Tuple(U64, SIZE, DEVICE, Bool()), 1 << 20), "high": Map(NUM, U64, 1024)}),
    # conditional graph nodes (proxyd/families/graph_cond.py): per graph its handles
    # [value, default, flags, context handle]; per node [id, handle, type, size,
    # body graphs]; per body graph its node; per executable graph its defaults
    # [handle, value]; the handles' current values; body snapshots
    "graph_conds": Obj({"graphs": List(Tuple(ID, List(Tuple(U64, U64, Int(0, 1), U64), 1 << 16)), 1 << 16),
                        "nodes": List(Tuple(ID, U64, Int(0, 2), Int(1, 1 << 16), List(ID, 1 << 16)), 1 << 16),
                        "bodies": List(Tuple(ID, ID), 1 << 20),
                        "execs": List(Tuple(ID, List(Tuple(U64, U64), 1 << 16)), 1 << 16),
                        "values": List(Tuple(U64, U64), 1 << 16),
                        # the bodies as an executable graph holds them: graph id, defaults,
                        # [body node id, [positions of its ops]]
                        "snaps": List(Tuple(ID, List(Tuple(U64, U64), 1 << 16),
                                            List(Tuple(ID, List(Int(0, 1 << 31), 1 << 20)), 1 << 20)), 1 << 16)},
                       # nodes added to a graph while it was captured (graph_cond_capture.py)
                       {"captured": List(ID, 1 << 16)}),
    "capture": Map(NUM, ID, 1 << 16),
    "capture_events": Map(NUM, ID, 1 << 16),
    # CUDA arrays (proxyd/families/arrays.py; contents: FLAG_ARRAY chunks) and texture /
    # surface objects under the driver's values, with their descriptors as hex
    "arrays": List(Obj({"id": ID, "ctx": ID, "width": SIZE, "height": SIZE, "depth": SIZE,
                        "format": Int(0, 0xFF), "channels": Int(1, 4), "flags": ID},
                       # mipmapped arrays (their number of levels), and the level
                       # arrays the app fetched: (mipmapped array id, level)
                       optional={"mipmap_levels": Int(1, 32), "level_of": Tuple(ID, Int(0, 31))}), 1 << 20),
    "tex_objects": List(Obj({"kind": Enum("texture", "surface"), "value": U64, "ctx": ID,
                             "res": Str(288, r"[0-9a-f]*", "hex bytes"),
                             "tex": Opt(Str(208, r"[0-9a-f]*", "hex bytes")),
                             "view": Opt(Str(224, r"[0-9a-f]*", "hex bytes"))},
                            optional={"gone": Bool()}), 1 << 20),
    # library handles and descriptors (proxyd/families/libraries.py): the creating
    # call and the settings, re-checked by the library path when replayed
    "libraries": List(Obj({"kind": Enum("cublas_handle", "cublaslt_handle", "cublaslt_matmul_desc",
                                        "cublaslt_layout", "cublaslt_preference", "cudnn_handle",
                                        "cudnn_desc", "cufft_plan",
                                        "curand_generator", "cusparse_handle", "cusparse_spmat",
                                        "cusparse_dnvec", "cusparse_dnmat", "cusolver_dn_handle",
                                        "cusolver_dn_params", "cusolver_syevj_info",
                                        "cusolver_gesvdj_info", "cusparse_spgemm", "cusparse_spsv", "cusparse_spsm",
                                        "cusparse_spvec"),
                           "id": ID, "ctx": ID, "create": Tuple(Int(0, 1 << 20), U64, HANDLE_ARGS),
                           "settings": List(Tuple(Int(0, 1 << 20), HANDLE_ARGS), 1 << 16)},
                          # cuRAND generators: numbers generated since the last
                          # seed/offset setting (libraries.curand_position)
                          optional={"generated": U64}), 1 << 16),
    # cuDNN backend descriptors (proxyd/families/cudnn.py): the log of the calls that
    # made them, [function id, context handle, arguments], replayed by the
    # cuDNN path (which re-checks them); last [0, 0, handles destroyed after]
    "cudnn_backend": List(Tuple(Int(0, 1 << 20), U64, List(Any_(), 1 << 20)), 1 << 22),
    # the application's device numbers -> physical ones after a restore onto
    # other devices (proxyd/families/devnum.py)
    "dev_map": Map(NUM, DEVICE, 1024),
    # NCCL communicators of a job's consistent cut (proxyd/families/nccl_cut.py):
    # made again at the restore with a new unique id, as the same rank
    "nccl_comms": List(Obj({"comm": U64, "ident": Str(32, r"[0-9a-f]{32}", "a communicator identity"),
                            "nranks": Int(1, 1 << 20), "rank": Int(0, 1 << 20), "ctx": ID, "seq": COUNT,
                            "blocking": Bool()}), 4096),
})

MANIFEST = Obj({
    "format_version": Int(1, 2),
    "kind": Enum("pre-dump", "dump"),
    "created": Str(64),
    "parent": Opt(Obj({"path": Str(4096), "manifest_sha256": HEX64})),
    "ancestors": List(HEX64, 1 << 16),
    "chunk_size": Int(1, 1 << 32),
    "hash": Enum("gp64"),
    "session": Obj({}),                      # its fields: SESSION, below
    "modules": Map(HEX64, Obj({"size": SIZE, "image": Int(0, 1 << 16)}), 1 << 16),
    "memory": Obj({k: COUNT for k in ("chunks", "bytes", "stored_chunks", "stored_bytes")},
                  optional={k: COUNT for k in ("referenced_chunks", "referenced_bytes", "global_chunks",
                                               "global_bytes")}),
    "files": Obj({"chunks.idx": Obj({"size": SIZE, "sha256": HEX64}), "memory.bin": Obj({"size": SIZE})}),
    "stats": Obj({}),
}, optional={
    "gpuproxy_version": Str(64),
    "backend": Opt(Str(16, r"[a-z0-9_]+", "a backend name")),
    "driver_version": Opt(Int(0, 1 << 31)),
    "devices": List(Obj({"index": DEVICE, "name": Str(256), "total_memory": SIZE},
                        optional={"uuid": Str(64)}), 1024),
    # format 2: how chunks were compressed (each compressed chunk says so in chunks.idx)
    "compression": Obj({"codec": Enum("zstd"), "level": Int(-7, 19)},
                       optional={k: COUNT for k in ("chunks", "bytes", "stored_bytes")}),
})


def validate_manifest(body: dict) -> None:
    """Checks a manifest body (top level strictly, the session's fields where
    present); SchemaError naming the first bad field."""
    MANIFEST.check(body, "", True)
    SESSION.check(body["session"], "session", False)


def validate_session(session: dict, strict: bool = True) -> None:
    """Checks the engine's session description; strict: every field a
    restore needs must be present."""
    SESSION.check(session, "session", strict)
