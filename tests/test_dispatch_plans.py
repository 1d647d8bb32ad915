"""The round-trip path's precomputed forms (issue 13, target 4) against the
general code they stand in for: the argument check of every spec'd function
(dispatch.args_fit against dispatch.bad_argument), and the reply packer's
walk for large byte strings (protocol._has_big against a plain recursive
definition written here). No daemon, no timing."""
from __future__ import annotations

import itertools

import msgpack

from gpuproxy.proxyd.worker import dispatch
from gpuproxy.proxyd.core import protocol as P
from gpuproxy.proxyd._generated import FUNCTIONS

# one value of every type a decoded message can hold in an argument slot
SAMPLES = [None, 0, -1, 1 << 40, True, 1.5, "s", b"x", bytearray(b"y"), memoryview(b"z"), [], [1, 2],
           {"a": 1}, P.ShmRef(1, 0, 4), P.FrameRef(1), P.ContentRef(b"\0" * 32, 8)]


def test_args_fit_agrees_with_bad_argument_for_every_function():
    checked = 0
    for fid, fn in FUNCTIONS.items():
        if fn.handler == "library" or not fn.params:
            continue
        checks = dispatch._arg_checks(fn)
        n = len(fn.params)
        # each parameter in turn takes every sample while the others hold a
        # value that fits them (None is never refused)
        for i, v in itertools.product(range(n), SAMPLES):
            args = [None] * n
            args[i] = v
            want = dispatch.bad_argument(fn, args) is None
            assert dispatch.args_fit(checks, args) == want, (fn.name, fn.params[i][:2], type(v).__name__)
            checked += 1
    assert checked > 1000


def _big(x, depth, limit):
    """The definition: a byte string of `limit` bytes or more within depth
    levels of lists; a list nested deeper counts as big."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        return len(x) >= limit
    if isinstance(x, (list, tuple)):
        if depth == 0:
            return True
        return any(_big(v, depth - 1, limit) for v in x)
    return False


def test_reply_packer_finds_large_byte_strings():
    big = b"\1" * P.Packer.INLINE_MAX
    small = b"\2" * 10
    shapes = [
        [1, 0, None, 0, 0, ""],
        [1, 0, [small], 0, 0, ""],
        [1, 0, [big], 0, 0, ""],
        [1, 0, [[big]], 0, 0, ""],
        [1, 0, [[small]], 0, 0, ""],
        [1, 0, [memoryview(big)], 0, 0, "", b"printed"],
        [1, 0, [bytearray(big), 5, None], 0, 0, ""],
        (2, big),
        big,
        "text",
        7,
    ]
    for obj in shapes:
        assert P._has_big(obj, 2) == _big(obj, 2, P.Packer.INLINE_MAX)
        frames = P.Packer().pack(obj)
        # what comes back decodes to the same values, large strings as frames
        back = P.decode([bytes(frames[0])] + [bytes(f) for f in frames[1:]])
        norm = msgpack.unpackb(msgpack.packb(obj, use_bin_type=True), raw=False)

        def same(a, b):
            if isinstance(b, list):
                return isinstance(a, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
            return bytes(a) == b if isinstance(b, bytes) else a == b
        assert same(back, norm)
        assert (len(frames) > 1) == _big(obj, 99, P.Packer.INLINE_MAX)


def test_small_reply_shortcut_packs_as_the_packer_does():
    """server.execute packs a reply whose outs pass protocol.small_values
    with one msgpack call: that must be what Packer.pack makes of it."""
    big = b"\1" * P.Packer.INLINE_MAX
    for outs in (None, [], [None], [7, -1, 1 << 60], [b"abc", "s", 1.5, True], [bytearray(b"x" * 1000)],
                 [big], [[1]], [memoryview(big)], (1, 2), [{"a": 1}]):
        reply = [3, 0, outs, 0, 0, ""]
        if P.small_values(outs):
            assert P.Packer().pack(reply) == [msgpack.packb(reply, use_bin_type=True)]
        else:
            # only what the general walk must see is refused
            assert outs is not None and (not isinstance(outs, list) or any(
                isinstance(v, (list, dict)) or (isinstance(v, (bytes, bytearray, memoryview)) and len(v) >= len(big))
                for v in outs))
