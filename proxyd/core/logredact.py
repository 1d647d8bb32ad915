"""No session token in proxyd's log (issue 21).

A session's token is what a client names its session with; the log may be
read by others than proxyd's user (a journal, a shared file), so every log
line that would carry a live token carries the session's public id instead
(shm_names.py: the name its shared memory has in /dev/shm, which is public
anyway, so log lines and /dev/shm still match up when debugging).

install(tokens) adds a filter to the handlers of the root logger; tokens()
returns the tokens to hide (the supervisor's sessions, a worker's session).

Locking: a filter runs on the logging thread; tokens() must be safe to call
from any thread (it reads a dict's keys once, which CPython does atomically
enough for this: a token missed by a race is a token being added or gone)."""
from __future__ import annotations

import logging

from .shm_names import public_id


class TokenRedactor(logging.Filter):
    def __init__(self, tokens):
        super().__init__()
        self.tokens = tokens

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            toks = [t for t in list(self.tokens()) if isinstance(t, str) and len(t) >= 8]
        except Exception:
            return True
        if not toks:
            return True
        try:
            msg = record.getMessage()
        except Exception:
            return True
        hit = False
        for t in toks:
            if t in msg:
                msg = msg.replace(t, "id " + public_id(t))
                hit = True
        if hit:
            record.msg, record.args = msg, None
        return True


def install(tokens) -> TokenRedactor:
    f = TokenRedactor(tokens)
    for h in logging.getLogger().handlers:
        h.addFilter(f)
    return f
