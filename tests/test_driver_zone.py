"""The driver zone (proxyd/backends/driver_zone.py): a session's context
lands at the top of address space reserved for it, the same in the worker
that served the app and the one that restores it, whatever else either
mapped meanwhile (issue 23, target 5: on the GPU, every restored
`__device__` variable had moved by 64 MiB). The driver's part is a plain
top-down mmap, so these checks stand a plain mmap in for cuCtxCreate; the
GPU check is tests/test_globals_placement.py (marker gpu)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

PROG = textwrap.dedent("""
    import ctypes, sys
    from gpuproxy.proxyd.backends import driver_zone as dz
    libc = dz._libc
    MB = 1 << 20

    def mmap(n):
        p = libc.mmap(None, n, 3, dz.MAP_PRIVATE | dz.MAP_ANONYMOUS, -1, 0)
        assert p not in (None, dz.MAP_FAILED)
        return int(p)

    z = dz.Zone.reserve(256 * MB)
    lo, hi = z.base, z.base + z.size
    assert dz._mappings_in(lo, hi) == [(lo, hi)]          # all of it held
    outside = mmap(64 * MB)                              # closed: goes elsewhere
    assert not lo <= outside < hi, hex(outside)
    with z.open():                                       # the "context" lands at the zone's top
        first = mmap(96 * MB)
    assert first + 96 * MB == hi, (hex(first), hex(hi))
    assert dz._mappings_in(lo, hi) == [(lo, first), (first, hi)]     # the rest held again: no gap
    assert z.held == [(lo, first)]
    other = mmap(32 * MB)                                # closed again: elsewhere
    assert not lo <= other < hi
    with z.open():                                       # a second one: right below the first
        second = mmap(64 * MB)
    assert second + 64 * MB == first, (hex(second), hex(first))
    assert z.held == [(lo, second)]
    reads = z.maps_reads
    for _ in range(50):                                  # windows in which nothing is mapped (a kernel
        with z.open():                                   # lookup): the ranges held again, no maps read
            pass
    assert z.maps_reads == reads and z.held == [(lo, second)]
    assert dz._mappings_in(lo, hi) == [(lo, second), (second, hi)]      # the two "contexts" merge in maps
    libc.munmap(first, 96 * MB)                          # the first goes (cuCtxDestroy): the backend says so
    z.note_freed()
    with z.open():
        pass
    assert (first, hi) in z.held and z.maps_reads == reads + 1
    with z.open():                                       # a third: at the top again (the first's place),
        third = mmap(16 * MB)                            # the maps read again
    assert third + 16 * MB == hi and z.maps_reads == reads + 2
    assert z.held == [(lo, second), (first, third)], [(hex(a), hex(b)) for a, b in z.held]
    print("ok")
""")


def test_contexts_land_at_the_zone_top_and_nothing_else_does():
    r = subprocess.run([sys.executable, "-c", PROG], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_zone_off():
    r = subprocess.run([sys.executable, "-c", "from gpuproxy.proxyd.backends import driver_zone as dz; "
                        "print(dz.make())"], capture_output=True, text=True, timeout=60,
                       env={"GPUPROXY_DRIVER_ZONE_MB": "0", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stdout + r.stderr
