"""Public names of a session's shared memory (issue 21).

A session's token is a capability (with it, the session's user reaches its
worker), and /dev/shm can be listed by every local user, so no name there
carries it. Segments, the fast channel and the park/resume flags are named
by the session's public id instead:

    public id = first 16 hex digits of SHA-256("gpuproxy shm\\0" + token), '-', the client's pid

The shim computes the same (interceptor/shm_name.c). The hash cannot be
turned back into the token (2^64 guesses for its random part), and the
shape (16 hex digits, '-', pid) is the one shm_sweep.py parses, so the
sweep's proof of death (the pid and the staging segment's lock) is
unchanged.

Locking: none (pure functions)."""
from __future__ import annotations

import hashlib

DOMAIN = b"gpuproxy shm\0"


def public_id(token: str) -> str:
    pid = token.rsplit("-", 1)[1] if "-" in token else "0"
    return hashlib.sha256(DOMAIN + token.encode()).hexdigest()[:16] + "-" + pid


def channel_name(token: str) -> str:
    """The fast channel's POSIX shm name (interceptor/channel.c)."""
    return f"/gpuproxy-{public_id(token)}-chan"
