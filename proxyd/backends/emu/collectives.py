"""Emulated NCCL (issue 22): collectives between sessions, in numpy, for CI.

Each rank of a job is its own application process with its own worker, so
the ranks' workers must meet. They meet the way NCCL's ranks do: through
the unique id. ncclGetUniqueId in a worker starts (once per worker) a
**hub**: a thread listening on an abstract unix socket with a random name,
and registers a fresh communicator key with it; the 128-byte id carries the
socket's name and the key (layout below). Every rank's worker connects to
the hub named in the id when it initialises its communicator
(ncclCommInitRank, on a helper thread of the worker: proxyd/families/nccl.py) and
says (key, nranks, rank); the hub answers each rank once all nranks have
joined. A collective sends the rank's contribution (the bytes of its send
buffer) to the hub, which, once every rank's contribution for that
collective (the communicator's sequence number) is in, computes every
rank's result with numpy and sends it back; the worker writes it to the
receive buffer. ncclSend/ncclRecv go through the hub too: a send is posted
at once, a receive waits for the matching send (same peer pair, in order).
ncclCommSplit is a collective of the parent (each rank's color and key)
answered with a new key per color.

The emulated backend executes stream work at once, so a collective blocks
the calling worker until every rank has called it (as a GPU stream would
wait in NCCL's kernel). A rank whose connection closes (its process or
worker ended) breaks the communicator: every rank waiting on it gets
ncclRemoteError, never a hang; so does one that waits longer than
GPUPROXY_NCCL_TIMEOUT_S (default 600 s).

Security: the hub answers only connections from processes of its own user
(SO_PEERCRED), and messages are length-prefixed msgpack, never pickle.

Wire format, both ways: 4-byte little-endian length, then a msgpack map.

Locking: the hub thread owns its tables; a communicator's socket is used by
one thread at a time (the worker's main loop or its helper thread, which
proxyd/families/nccl.py never run on the same communicator at once).
"""
from __future__ import annotations

import logging
import os
import secrets
import select
import socket
import struct
import threading
import time

import msgpack
import numpy as np

log = logging.getLogger("proxyd")

# nccl.h ncclResult_t
NCCL_SUCCESS, NCCL_SYSTEM_ERROR, NCCL_INTERNAL_ERROR = 0, 2, 3
NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_REMOTE_ERROR = 4, 5, 6
NCCL_VERSION_CODE = 23203      # the nccl.h the spec was made from (2.32.3)
ID_MAGIC = b"GPXNCCL1"         # the emulated unique id: magic, socket name length, name, key
UNIQUE_ID_BYTES = 128
TIMEOUT_S = float(os.environ.get("GPUPROXY_NCCL_TIMEOUT_S", "600"))

# nccl.h ncclDataType_t -> numpy dtype (bfloat16: uint16 bits, reduced in float32)
DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
          6: np.float16, 7: np.float32, 8: np.float64, 9: "bf16"}
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4      # nccl.h ncclRedOp_t


class NcclFailure(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def itemsize(dtype: int) -> int:
    t = DTYPES.get(int(dtype))
    if t is None:
        raise NcclFailure(NCCL_INVALID_ARGUMENT, f"data type {dtype} is not emulated")
    return 2 if t == "bf16" else np.dtype(t).itemsize


def _bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(f: np.ndarray) -> np.ndarray:
    u = f.astype(np.float32).view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)          # round to nearest even
    return (rounded >> 16).astype(np.uint16)


def reduce_arrays(parts: list[bytes], dtype: int, op: int) -> bytes:
    """The element-wise reduction of the ranks' buffers, in rank order."""
    t = DTYPES.get(int(dtype))
    if t is None:
        raise NcclFailure(NCCL_INVALID_ARGUMENT, f"data type {dtype} is not emulated")
    bf = t == "bf16"
    arrs = [_bf16_to_f32(np.frombuffer(p, np.uint16)) if bf else np.frombuffer(p, t) for p in parts]
    with np.errstate(over="ignore", invalid="ignore"):
        acc = arrs[0].copy()
        for a in arrs[1:]:
            if op in (SUM, AVG):
                acc = acc + a
            elif op == PROD:
                acc = acc * a
            elif op == MAX:
                acc = np.maximum(acc, a)
            elif op == MIN:
                acc = np.minimum(acc, a)
            else:
                raise NcclFailure(NCCL_INVALID_ARGUMENT, f"reduction {op} is not emulated")
        if op == AVG:
            if np.issubdtype(acc.dtype, np.integer):
                acc = acc // len(arrs)
            else:
                acc = acc / len(arrs)
        acc = acc.astype(np.float32 if bf else t)
    return (_f32_to_bf16(acc) if bf else acc).tobytes()


# ------------------------------------------------------------------ wire

def send_msg(sock: socket.socket, obj: dict):
    data = msgpack.packb(obj, use_bin_type=True)
    sock.sendall(struct.pack("<I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket) -> dict:
    (n,) = struct.unpack("<I", _recv_exact(sock, 4))
    if n > 1 << 34:
        raise ConnectionError(f"message of {n} bytes")
    return msgpack.unpackb(_recv_exact(sock, n), raw=False)


# ------------------------------------------------------------------- hub

class _Comm:
    def __init__(self, nranks: int):
        self.nranks = nranks
        self.members: dict[int, socket.socket] = {}
        self.pending: dict[int, dict[int, dict]] = {}       # seq -> rank -> message
        self.sends: dict[tuple[int, int], list[bytes]] = {}  # (src, dst) -> posted data
        self.recvs: dict[tuple[int, int], list[socket.socket]] = {}
        self.broken = ""


class Hub:
    """The rendezvous and reduction service of the communicators whose ids
    this worker made (one thread; see the module's docstring)."""

    def __init__(self):
        self.name = f"gpuproxy-nccl-{os.getpid()}-{secrets.token_hex(8)}"
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind("\0" + self.name)
        self.lsock.listen(64)
        self.keys: dict[bytes, _Comm | None] = {}           # registered keys; a _Comm once the first rank joins
        self.conn_comm: dict[socket.socket, tuple[bytes, int]] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, name="nccl-hub", daemon=True).start()

    def new_key(self) -> bytes:
        key = secrets.token_bytes(16)
        with self.lock:
            self.keys[key] = None
        return key

    def _serve(self):
        conns: list[socket.socket] = []
        while True:
            r, _, _ = select.select([self.lsock] + conns, [], [], 1.0)
            for s in r:
                if s is self.lsock:
                    c, _ = self.lsock.accept()
                    uid = struct.unpack("3i", c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                    if uid != os.getuid():
                        c.close()                    # another user's process: never served
                        continue
                    conns.append(c)
                    continue
                try:
                    msg = recv_msg(s)
                except (ConnectionError, OSError, ValueError, msgpack.UnpackException):
                    conns.remove(s)
                    self._gone(s)
                    s.close()
                    continue
                try:
                    self._handle(s, msg)
                except (KeyError, TypeError, ValueError, NcclFailure) as e:
                    self._reply(s, {"code": getattr(e, "code", NCCL_INVALID_USAGE), "error": str(e)})

    def _reply(self, s: socket.socket, obj: dict):
        try:
            send_msg(s, obj)
        except OSError:
            pass            # the rank is gone; its connection's close breaks the communicator

    def _gone(self, s: socket.socket):
        key_rank = self.conn_comm.pop(s, None)
        if key_rank is None:
            return
        key, rank = key_rank
        c = self.keys.get(key)
        if c is None:
            return
        c.members.pop(rank, None)
        if not c.broken:
            c.broken = f"rank {rank} left the communicator"
        # ranks waiting for a collective or a receive learn it now; the
        # others at their next call on the communicator (_handle)
        waiting = {r for per in c.pending.values() for r in per}
        socks = {c.members[r] for r in waiting if r in c.members}
        socks |= {x for lst in c.recvs.values() for x in lst}
        for m in socks:
            self._reply(m, {"code": NCCL_REMOTE_ERROR, "error": c.broken, "broken": True})
        c.pending.clear()
        c.recvs.clear()
        if not c.members:
            with self.lock:
                self.keys.pop(key, None)     # every rank has left: the id is spent

    def _handle(self, s: socket.socket, msg: dict):
        op = msg["op"]
        key = bytes(msg["key"])
        with self.lock:
            if key not in self.keys:
                raise NcclFailure(NCCL_INVALID_ARGUMENT, "unknown communicator id")
            c = self.keys[key]
        if op == "join":
            nranks, rank = int(msg["nranks"]), int(msg["rank"])
            if c is None:
                c = self.keys[key] = _Comm(nranks)
            if c.nranks != nranks or not 0 <= rank < nranks or rank in c.members:
                raise NcclFailure(NCCL_INVALID_ARGUMENT, f"rank {rank} of {nranks} does not fit the communicator "
                                                         f"({c.nranks} ranks, joined: {sorted(c.members)})")
            c.members[rank] = s
            self.conn_comm[s] = (key, rank)
            if len(c.members) == c.nranks:
                for m in c.members.values():
                    self._reply(m, {"code": NCCL_SUCCESS})
            return
        if c is None or self.conn_comm.get(s, (None,))[0] != key:
            raise NcclFailure(NCCL_INVALID_USAGE, "not a member of this communicator")
        if c.broken:
            raise NcclFailure(NCCL_REMOTE_ERROR, c.broken)
        rank = self.conn_comm[s][1]
        if op == "send":
            pair = (rank, int(msg["peer"]))
            waiting = c.recvs.get(pair)
            if waiting:
                self._reply(waiting.pop(0), {"code": NCCL_SUCCESS, "data": msg["data"]})
            else:
                c.sends.setdefault(pair, []).append(msg["data"])
            return
        if op == "recv":
            pair = (int(msg["peer"]), rank)
            posted = c.sends.get(pair)
            if posted:
                self._reply(s, {"code": NCCL_SUCCESS, "data": posted.pop(0)})
            else:
                c.recvs.setdefault(pair, []).append(s)
            return
        seq = int(msg["seq"])
        per = c.pending.setdefault(seq, {})
        per[rank] = msg
        if len(per) < c.nranks:
            return
        del c.pending[seq]
        kinds = {m["op"] for m in per.values()}
        if len(kinds) != 1:
            err = f"collective {seq} differs between ranks ({', '.join(sorted(kinds))})"
            for r in per:
                self._reply(c.members[r], {"code": NCCL_INVALID_USAGE, "error": err})
            return
        for r, out in self._compute(op, per, c).items():
            self._reply(c.members[r], {"code": NCCL_SUCCESS, **out})

    def _compute(self, op: str, per: dict[int, dict], c: _Comm) -> dict[int, dict]:
        n = c.nranks
        m0 = per[0]
        if op == "allreduce":
            data = reduce_arrays([per[r]["data"] for r in range(n)], m0["dtype"], m0["redop"])
            return {r: {"data": data} for r in range(n)}
        if op == "reduce":
            root = int(m0["root"])
            data = reduce_arrays([per[r]["data"] for r in range(n)], m0["dtype"], m0["redop"])
            return {r: {"data": data if r == root else b""} for r in range(n)}
        if op == "broadcast":
            data = per[int(m0["root"])]["data"]
            return {r: {"data": data} for r in range(n)}
        if op == "allgather":
            data = b"".join(per[r]["data"] for r in range(n))
            return {r: {"data": data} for r in range(n)}
        if op == "reducescatter":
            full = reduce_arrays([per[r]["data"] for r in range(n)], m0["dtype"], m0["redop"])
            part = len(full) // n
            return {r: {"data": full[r * part:(r + 1) * part]} for r in range(n)}
        if op == "split":
            # ranks of the same color form a communicator, ordered by (key, old rank)
            groups: dict[int, list[tuple[int, int]]] = {}
            for r in range(n):
                color = int(per[r]["color"])
                if color >= 0:
                    groups.setdefault(color, []).append((int(per[r]["skey"]), r))
            out = {r: {"newkey": None} for r in range(n)}
            for color, members in groups.items():
                k = self.new_key()
                for newrank, (_, r) in enumerate(sorted(members)):
                    out[r] = {"newkey": k, "nranks": len(members), "rank": newrank}
            return out
        raise NcclFailure(NCCL_INVALID_USAGE, f"unknown collective {op}")


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub()
        return _hub


def make_unique_id() -> bytes:
    h = hub()
    name = h.name.encode()
    raw = ID_MAGIC + bytes([len(name)]) + name + h.new_key()
    return raw.ljust(UNIQUE_ID_BYTES, b"\0")


def parse_unique_id(uid: bytes) -> tuple[str, bytes]:
    uid = bytes(uid)
    if len(uid) != UNIQUE_ID_BYTES or not uid.startswith(ID_MAGIC):
        raise NcclFailure(NCCL_INVALID_ARGUMENT, "not a unique id from ncclGetUniqueId under gpuproxy's emulated "
                                                 "backend")
    n = uid[len(ID_MAGIC)]
    name = uid[len(ID_MAGIC) + 1:len(ID_MAGIC) + 1 + n].decode()
    key = uid[len(ID_MAGIC) + 1 + n:len(ID_MAGIC) + 1 + n + 16]
    return name, key


# ------------------------------------------------------------ rank side

class EmuComm:
    """One rank's membership of an emulated communicator."""

    def __init__(self, name: str, key: bytes, nranks: int, rank: int, device: int):
        self.name, self.key, self.nranks, self.rank, self.device = name, key, nranks, rank, device
        self.seq = 0
        self.premul: dict[int, tuple] = {}      # ncclRedOpCreatePreMulSum ops: value -> (scalar, dtype)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.error = NCCL_SUCCESS
        try:
            self.sock.connect("\0" + name)
        except OSError as e:
            self.sock.close()
            raise NcclFailure(NCCL_SYSTEM_ERROR, f"the communicator's rendezvous ({name}) cannot be reached: {e}; "
                                                 f"its unique id's maker has ended") from None
        self.ask({"op": "join", "nranks": nranks, "rank": rank})

    def post(self, msg: dict):
        """Sends one request; its answer is read by result(), in order."""
        if self.error:
            raise NcclFailure(self.error, "the communicator is broken")
        try:
            send_msg(self.sock, {"key": self.key, **msg})
        except OSError as e:
            self.error = NCCL_REMOTE_ERROR
            raise NcclFailure(NCCL_REMOTE_ERROR, f"the communicator's rendezvous is gone: {e}") from None

    def result(self) -> dict:
        try:
            r = recv_msg(self.sock)
        except socket.timeout:
            self.error = NCCL_REMOTE_ERROR
            raise NcclFailure(NCCL_REMOTE_ERROR, f"no answer from the other ranks within {TIMEOUT_S:.0f} s "
                                                 f"(GPUPROXY_NCCL_TIMEOUT_S)") from None
        except (ConnectionError, OSError) as e:
            self.error = NCCL_REMOTE_ERROR
            raise NcclFailure(NCCL_REMOTE_ERROR, f"the communicator's rendezvous is gone: {e}") from None
        if r.get("code", 0) != NCCL_SUCCESS:
            if r.get("broken"):
                self.error = int(r["code"])
            raise NcclFailure(int(r["code"]), r.get("error", "collective failed"))
        return r

    def ask(self, msg: dict) -> dict:
        self.post(msg)
        return self.result()

    def post_collective(self, op: str, **fields):
        self.seq += 1
        self.post({"op": op, "seq": self.seq, **fields})

    def collective(self, op: str, **fields) -> dict:
        self.post_collective(op, **fields)
        return self.result()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class EmuNccl:
    """The engine proxyd/families/nccl.py drives on the emulated backend (the same
    methods as its RealNccl)."""

    def __init__(self, backend, api: str = "nccl"):
        self.b = backend
        self.api = api
        self.group = 0
        self.queued: list = []       # ops of an open group, run at ncclGroupEnd

    def _mem(self, addr: int, n: int) -> np.ndarray:
        return self.b.resolve(int(addr), int(n))

    def version(self) -> int:
        return NCCL_VERSION_CODE

    def unique_id(self) -> bytes:
        return make_unique_id()

    def init_rank(self, nranks: int, uid: bytes, rank: int, cfg: dict | None, device: int) -> EmuComm:
        name, key = parse_unique_id(uid)
        return EmuComm(name, key, nranks, rank, device)

    def split(self, comm: EmuComm, color: int, key: int, cfg: dict | None) -> EmuComm | None:
        r = comm.collective("split", color=int(color), skey=int(key))
        if r.get("newkey") is None:
            return None
        return EmuComm(comm.name, bytes(r["newkey"]), int(r["nranks"]), int(r["rank"]), comm.device)

    def count(self, comm: EmuComm) -> int:
        return comm.nranks

    def user_rank(self, comm: EmuComm) -> int:
        return comm.rank

    def premul_create(self, comm: EmuComm, scalar, dtype: int) -> int:
        """nccl.h: a custom op's value is past the built-in ones (ncclNumOps,
        5) and belongs to its communicator."""
        itemsize(dtype)
        op = 5 + len(comm.premul)
        while op in comm.premul:
            op += 1
        comm.premul[op] = (scalar, int(dtype))
        return op

    def premul_destroy(self, comm: EmuComm, op: int):
        if comm.premul.pop(int(op), None) is None:
            raise NcclFailure(NCCL_INVALID_ARGUMENT, f"reduction {op} is not a pre-multiplied sum of this "
                                                     f"communicator")

    def _contribution(self, comm: EmuComm, data: bytes, dtype: int, op: int) -> tuple[bytes, int]:
        """A pre-multiplied sum: this rank's values times the scalar (read
        now: a device scalar at the collective, as NCCL reads it), then a sum."""
        if op < 5:
            return data, op
        if op not in comm.premul:
            raise NcclFailure(NCCL_INVALID_ARGUMENT, f"reduction {op} is not an operation of this communicator")
        scalar, sdtype = comm.premul[op]
        if sdtype != int(dtype):
            raise NcclFailure(NCCL_INVALID_ARGUMENT, "the pre-multiplied sum was made for another data type")
        raw = bytes(self._mem(scalar, itemsize(dtype))) if isinstance(scalar, int) else bytes(scalar)
        t = DTYPES[int(dtype)]
        if t == "bf16":
            prod = _bf16_to_f32(np.frombuffer(data, np.uint16)) * _bf16_to_f32(np.frombuffer(raw, np.uint16))[0]
            return _f32_to_bf16(prod).tobytes(), SUM
        with np.errstate(over="ignore"):
            prod = (np.frombuffer(data, t) * np.frombuffer(raw, t)[0]).astype(t)
        return prod.tobytes(), SUM

    def finalize(self, comm: EmuComm):
        pass            # nothing is in flight: emulated collectives complete when called

    def destroy(self, comm: EmuComm):
        comm.close()

    def abort(self, comm: EmuComm):
        comm.close()

    def async_error(self, comm: EmuComm) -> int:
        return comm.error

    # collectives: run now, or at ncclGroupEnd inside a group. Each _op posts
    # its request and returns the function that takes its answer, so that a
    # group's operations -- also on several communicators of this process,
    # which the single-process form (ncclCommInitAll) has -- are all posted
    # before any waits.
    def run(self, name: str, args: tuple):
        if self.group:
            self.queued.append((name, args))
            return
        getattr(self, "_" + name)(*args)()

    def group_start(self):
        self.group += 1

    def group_end(self):
        if self.group == 0:
            raise NcclFailure(NCCL_INVALID_USAGE, "ncclGroupEnd without ncclGroupStart")
        self.group -= 1
        if self.group:
            return
        ops, self.queued = self.queued, []
        finish = [getattr(self, "_" + name)(*args) for name, args in ops]
        for f in finish:
            f()

    def _write(self, addr, n):
        def done(r):
            self._mem(addr, n)[:] = np.frombuffer(r["data"], np.uint8)
        return done

    def _then(self, comm: EmuComm, use):
        return lambda: use(comm.result())

    def _ncclAllReduce(self, send, recv, count, dtype, op, comm, stream):
        n = int(count) * itemsize(dtype)
        data, op = self._contribution(comm, self._mem(send, n).tobytes(), dtype, int(op))
        comm.post_collective("allreduce", dtype=int(dtype), redop=op, data=data)
        return self._then(comm, self._write(recv, n))

    def _ncclReduce(self, send, recv, count, dtype, op, root, comm, stream):
        n = int(count) * itemsize(dtype)
        data, op = self._contribution(comm, self._mem(send, n).tobytes(), dtype, int(op))
        comm.post_collective("reduce", dtype=int(dtype), redop=op, root=int(root), data=data)
        mine = comm.rank == int(root)
        return self._then(comm, self._write(recv, n) if mine else (lambda r: None))

    def _ncclBroadcast(self, send, recv, count, dtype, root, comm, stream):
        n = int(count) * itemsize(dtype)
        data = self._mem(send, n).tobytes() if comm.rank == int(root) else b""
        comm.post_collective("broadcast", root=int(root), data=data)
        return self._then(comm, self._write(recv, n))

    def _ncclBcast(self, buff, count, dtype, root, comm, stream):
        return self._ncclBroadcast(buff, buff, count, dtype, root, comm, stream)

    def _ncclAllGather(self, send, recv, count, dtype, comm, stream):
        n = int(count) * itemsize(dtype)
        comm.post_collective("allgather", data=self._mem(send, n).tobytes())
        return self._then(comm, self._write(recv, n * comm.nranks))

    def _ncclReduceScatter(self, send, recv, count, dtype, op, comm, stream):
        n = int(count) * itemsize(dtype)
        data, op = self._contribution(comm, self._mem(send, n * comm.nranks).tobytes(), dtype, int(op))
        comm.post_collective("reducescatter", dtype=int(dtype), redop=op, data=data)
        return self._then(comm, self._write(recv, n))

    def _ncclSend(self, send, count, dtype, peer, comm, stream):
        n = int(count) * itemsize(dtype)
        comm.post({"op": "send", "peer": int(peer), "data": self._mem(send, n).tobytes()})
        return lambda: None

    def _ncclRecv(self, recv, count, dtype, peer, comm, stream):
        n = int(count) * itemsize(dtype)
        comm.post({"op": "recv", "peer": int(peer)})

        def done(r):
            if len(r["data"]) != n:
                raise NcclFailure(NCCL_INVALID_USAGE, f"ncclRecv of {n} bytes from rank {peer}, which sent "
                                                      f"{len(r['data'])}")
            self._mem(recv, n)[:] = np.frombuffer(r["data"], np.uint8)
        return self._then(comm, done)
