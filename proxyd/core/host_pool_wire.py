"""The messages between the supervisor and a worker about the shared host
pool (proxyd/supervisor/host_pool.py holds it, proxyd/backends/shared_pool.py
uses it; docs/architecture.md, "Shared host pool").

One SOCK_SEQPACKET socket pair per worker, made by the supervisor when it
starts the worker (the worker's end is passed down, its number in
$GPUPROXY_HOST_POOL_FD). Each message is one packet: a msgpack map, with
file descriptors as SCM_RIGHTS ancillary data where it says so. The worker
asks, the supervisor answers, one exchange at a time:

    {"op": "lease", "kind": K, "size": N}
        -> {"ok": true, "kind": K, "size": N'} + the pool's descriptor
           (the pool of the worker's session user, N' >= N, now lent to it)
        -> {"ok": false, "why": "...", "may_give": bool}
    {"op": "give", "kind": K, "size": N} + the descriptor of memory the
        worker made: held for the worker's session user, lent to it at once
        -> {"ok": true} | {"ok": false, "why": "..."} (the supervisor closed it)
    {"op": "return"}   the lease ends (so does the worker's exit)
        -> {"ok": true}
    {"op": "keep", "keep": {"image": P, "digest": D, "runs": [[addr, off, n], ...]}}
        the holder's pool holds the memory of image P (its manifest's
        sha256, checkpoint/memory_restore.py; device range
        [addr, addr+n) at pool offset off; D: checkpoint/memory_restore.py's
        digest of those chunks' hashes), or "keep": None (it writes again)
        -> {"ok": true} | {"ok": false, "why": "..."}
    {"op": "lease", "kind": K, "size": N, "image": P}   a restore's lease:
        only the pool that holds P's memory, with its note
        -> {"ok": true, "kind": K, "size": N', "kept": {...}} + descriptor
        -> {"ok": false, "why": "...", "may_give": false}

K: "memfd" (a memfd, mapped by mmap: the emulated backend) or "cuda"
(cuMemCreate host memory exported as a POSIX file descriptor).
"""
from __future__ import annotations

import socket

import msgpack

ENV_FD = "GPUPROXY_HOST_POOL_FD"
MAX_MSG = 64 << 10        # a keep note of up to 1024 runs fits
MAX_FDS = 4


def send(sock: socket.socket, msg: dict, fds=()) -> None:
    data = msgpack.packb(msg, use_bin_type=True)
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """(message, descriptors); (None, []) when the other end is gone. A
    malformed packet gives ({}, descriptors) (the caller refuses it and
    closes them)."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MSG, MAX_FDS)
    if not data and not fds:
        return None, []
    try:
        msg = msgpack.unpackb(data, raw=False)
        if not isinstance(msg, dict):
            msg = {}
    except Exception:
        msg = {}
    return msg, list(fds)
