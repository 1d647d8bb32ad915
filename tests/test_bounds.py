"""The supervisor's admission rules (proxyd/supervisor/bounds.py, proxyd/core/peercred.py)
and the log's token redaction (proxyd/core/logredact.py), without a daemon:
per-user session and pending-HELLO bounds, the HELLO's claim checked against
the kernel's credentials, libzmq's peer address parsed, tokens replaced by
their public ids. The same rules end to end: tests/test_second_user.py."""
from __future__ import annotations

import logging
import os
from types import SimpleNamespace

from gpuproxy.proxyd.core import logredact
from gpuproxy.proxyd.supervisor.bounds import Bounds, sender_uid
from gpuproxy.proxyd.core.peercred import OWN_PIDNS, Peer, check_hello, ipc_peer
from gpuproxy.proxyd.core.shm_names import channel_name, public_id


class Frame:
    def __init__(self, addr):
        self.addr = addr

    def get(self, key):
        if key != "Peer-Address" or self.addr is None:
            raise KeyError(key)
        return self.addr


def entries(*specs):
    """{token: entry} of (owner, state, opened)."""
    return {f"t{i}": SimpleNamespace(owner=o, state=s, opened=op) for i, (o, s, op) in enumerate(specs)}


def test_peer_address_parsed():
    assert ipc_peer(Frame("localhost:1000:1001:4242")) == Peer(1000, 1001, 4242)
    assert ipc_peer(Frame(":0:0:1")) == Peer(0, 0, 1)
    for bad in (None, "127.0.0.1", "localhost:a:b:c", 5):
        assert ipc_peer(Frame(bad)) is None


def test_hello_claims_checked():
    me = Peer(1000, 1000, os.getpid())
    assert check_hello(me, os.getpid(), OWN_PIDNS) is None
    assert "claims pid 1" in check_hello(me, 1, OWN_PIDNS)
    assert "not in it" in check_hello(Peer(1000, 1000, 0), 5, OWN_PIDNS)
    # another namespace: its pid is not ours to compare, but the namespace is
    assert "namespace" in check_hello(me, 7, "pid:[1]")


def test_bounds():
    b = Bounds(max_sessions=3, max_pending=2, hello_timeout_s=5)
    me = Peer(1000, 1000, os.getpid())
    ok = dict(pid=os.getpid(), pidns=OWN_PIDNS, cred=me, tcp=False)
    assert b.check_new(entries((1000, "running", True), (1000, "starting", False)), 1000, **ok) is None
    why = b.check_new(entries((1000, "running", False), (1000, "starting", False)), 1000, **ok)
    assert "still opening" in why
    why = b.check_new(entries(*[(1000, "running", True)] * 3), 1000, **ok)
    assert "3 sessions" in why
    # other users' and dead sessions do not count
    assert b.check_new(entries(*[(2000, "running", True)] * 5, *[(1000, "dead", False)] * 5), 1000, **ok) is None
    # no credentials on ipc: refused; tcp needs none (the key is the identity)
    assert "no peer credentials" in b.check_new({}, 1000, os.getpid(), OWN_PIDNS, None, False)
    assert b.check_new({}, 1000, 1, OWN_PIDNS, None, True) is None
    assert Bounds(max_sessions=0, max_pending=0).check_new(entries(*[(1000, "running", False)] * 100), 1000,
                                                           **ok) is None


def test_sender_uid():
    assert sender_uid(False, None, Peer(5, 5, 9)) == 5
    assert sender_uid(False, "7", None) is None
    assert sender_uid(True, "7", Peer(5, 5, 9)) == 7
    assert sender_uid(True, "supervisor", None) is None


def test_public_id_has_no_token():
    token = "0123456789abcdef-4242"
    pid = public_id(token)
    assert pid.endswith("-4242") and len(pid) == 16 + 5 and "0123456789abcdef" not in pid
    assert channel_name(token) == f"/gpuproxy-{pid}-chan"
    assert public_id("0123456789abcdee-4242") != pid


def test_log_redacts_live_tokens(caplog):
    live = {"0123456789abcdef-4242"}
    f = logredact.TokenRedactor(lambda: live)
    rec = logging.LogRecord("proxyd", logging.INFO, __file__, 1, "session %s: pid %s from %r",
                            ("0123456789abcdef-4242", 4242, b"c:0123456789abcdef-4242"), None)
    assert f.filter(rec)
    msg = rec.getMessage()
    assert "0123456789abcdef" not in msg and msg.count(public_id("0123456789abcdef-4242")) == 2, msg
