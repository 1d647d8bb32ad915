"""A restore's checks of an image's own fields before anything is built are
the kinds' (core/kinds.py, Kind.precheck; the engine walks them): the arena
(families/memory.py) must be the session slot's range, its chunks inside it
without overlap and within each device's memory; the fast channel
(families/hostmap.py) the session's own. One line naming the field each."""
from __future__ import annotations

import copy

import pytest

from gpuproxy.proxyd.core import kinds
from gpuproxy.proxyd.core.arena import ARENA_BASE, SLOT_SIZE
from gpuproxy.proxyd.core.kinds import CheckpointError
from gpuproxy.proxyd.core.shm_names import channel_name
from gpuproxy.proxyd.families import load_all

load_all()

TOKEN = "0123456789abcdef0123456789abcdef-4242"
MiB = 1 << 20


class Backend:
    """Devices with 64 MiB each (the only backend fact a precheck reads)."""
    def device_total_mem(self, d: int) -> int:
        return 64 * MiB


def session(slot: int = 2) -> dict:
    base = ARENA_BASE + slot * SLOT_SIZE
    return {"token": TOKEN, "slot": slot, "channel": channel_name(TOKEN),
            "arena": {"base": base, "size": SLOT_SIZE,
                      "chunks": [[base, 2 * MiB, 0, False], [base + 4 * MiB, 2 * MiB, 1, False]]}}


def test_the_arena_and_channel_kinds_carry_the_prechecks():
    assert kinds.KINDS["arena"].precheck is not None
    assert kinds.KINDS["host_memory"].precheck is not None


def test_a_fitting_session_passes():
    kinds.precheck(session(), Backend(), {})
    old = session()
    old["channel"] = f"/gpuproxy-{TOKEN}-chan"        # images from before public ids
    kinds.precheck(old, Backend(), {})


def bad(edit):
    d = session()
    edit(d)
    return d


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["arena"].update(base=d["arena"]["base"] + SLOT_SIZE),
     "manifest field session.arena: [0x{:x}, +0x{:x}) is not the address slot 2"),
    (lambda d: d["arena"].update(size=SLOT_SIZE // 2), "manifest field session.arena: "),
    (lambda d: d["arena"]["chunks"][1].__setitem__(0, d["arena"]["chunks"][0][0] + MiB),
     "manifest field session.arena.chunks[1]: "),
    (lambda d: d["arena"]["chunks"][0].__setitem__(1, 0), "manifest field session.arena.chunks[0]: "),
    (lambda d: d["arena"]["chunks"][1].__setitem__(0, d["arena"]["base"] + SLOT_SIZE - MiB),
     "overlaps another chunk or lies outside the session's slot"),
    (lambda d: (d["arena"]["chunks"][0].__setitem__(1, 65 * MiB),
                d["arena"]["chunks"][1].__setitem__(0, d["arena"]["base"] + 80 * MiB)),
     f"manifest field session.arena.chunks: {65 * MiB} bytes on device 0, which has {64 * MiB}"),
    (lambda d: d.update(channel="/gpuproxy-ffffffffffffffff-1-chan"),
     "manifest field session.channel: '/gpuproxy-ffffffffffffffff-1-chan' is not the session's channel"),
])
def test_unfit_fields_are_refused_in_one_line(edit, message):
    d = bad(edit)
    if "{:x}" in message:
        message = message.format(d["arena"]["base"], SLOT_SIZE)
    with pytest.raises(CheckpointError) as e:
        kinds.precheck(d, Backend(), {})
    assert str(e.value).startswith("image refused: ") and message in str(e.value) and "\n" not in str(e.value)


def test_device_map_counts_chunks_on_the_devices_they_go_to():
    """Two devices' chunks mapped onto one device add up there."""
    d = session()
    d["arena"]["chunks"][0][1] = 40 * MiB
    d["arena"]["chunks"][1][0] = d["arena"]["base"] + 48 * MiB
    d["arena"]["chunks"][1][1] = 40 * MiB
    kinds.precheck(d, Backend(), {})
    with pytest.raises(CheckpointError, match=f"{80 * MiB} bytes on device 0"):
        kinds.precheck(d, Backend(), {1: 0})


def test_the_arena_is_checked_before_the_channel():
    d = bad(lambda d: d.update(channel="/x"))
    d["arena"]["size"] = 1
    with pytest.raises(CheckpointError, match="session.arena:"):
        kinds.precheck(d, Backend(), {})
