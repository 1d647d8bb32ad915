"""proxyd/core/addrspace.py's gate between the driver zone's windows and the
worker's own mapping work: no shared work runs inside a window, a waiting
window goes before new shared work (the restore's image readers must not
keep a module load waiting until all of them are done), and the window's
own thread passes through both forms again."""
from __future__ import annotations

import threading
import time

from gpuproxy.proxyd.core.addrspace import _Gate


def test_windows_exclude_shared_work_and_go_first():
    g, log = _Gate(), []
    lock = threading.Lock()

    def note(*e):
        with lock:
            log.append(e)

    def reader(i, hold):
        with g.shared():
            note("s+", i)
            time.sleep(hold)
            note("s-", i)

    def window():
        with g.exclusive():
            note("x+")
            time.sleep(0.05)
            with g.exclusive(), g.shared():      # re-entered by its own thread
                pass
            note("x-")

    early = [threading.Thread(target=reader, args=(i, 0.2)) for i in range(3)]
    for t in early:
        t.start()
    time.sleep(0.05)                 # the readers hold the gate
    w = threading.Thread(target=window)
    w.start()
    time.sleep(0.05)                 # the window waits for them
    late = threading.Thread(target=reader, args=(9, 0.0))
    late.start()
    for t in early + [w, late]:
        t.join(10)
        assert not t.is_alive()
    i, j = log.index(("x+",)), log.index(("x-",))
    assert not [e for e in log[i:j] if e[0] == "s+"], log          # nothing shared inside the window
    assert {e for e in log[:i]} >= {("s-", 0), ("s-", 1), ("s-", 2)}, log   # it waited for the early readers
    assert log.index(("s+", 9)) > j, log                           # the late reader waited behind it
