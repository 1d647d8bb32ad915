"""A gate between the driver zone's windows (backends/driver_zone.py) and
the worker's own threads that map or allocate memory meanwhile.

While the zone is open for a context creation or a module load, a mapping
made by another thread of the worker lands at the zone's top, where the
driver was to put the context or the module, and the session's `__device__`
variables come back at other addresses than in the worker that served the
app. Such mappings: client segments and channels mapped by the serving
thread while a restore thread creates contexts (a GPU-only restore whose app
is already calling again), and the restore's helper threads reading and
parsing module images (their buffers, their malloc arenas) while the restore
thread loads the modules before them (families/modrestore.py): on the H100 a
CUDA 11.8 program's variable moved in a whole-process restore while every
context had landed at the same address.

So the zone's windows are exclusive and those threads' mapping or
allocating work is shared: a window waits until no shared work runs, shared
work waits while a window is open. Mappings made by code that takes neither
(a library's own threads) can still land in a window, which is one driver
call long.

Locking: a condition variable; a waiting window goes before new shared
work; exclusive() is re-entrant on its thread, and shared() on the thread
holding the window passes (the window's own work).
Lower than every user: imports nothing of gpuproxy.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager


class _Gate:
    def __init__(self):
        self._cv = threading.Condition()
        self._shared = 0
        self._owner: int | None = None      # thread ident holding the window
        self._depth = 0
        self._waiting = 0                   # windows waiting: new shared work waits behind them

    @contextmanager
    def exclusive(self):
        me = threading.get_ident()
        with self._cv:
            if self._owner == me:
                self._depth += 1
            else:
                self._waiting += 1
                try:
                    while self._owner is not None or self._shared:
                        self._cv.wait()
                finally:
                    self._waiting -= 1
                self._owner, self._depth = me, 1
        try:
            yield
        finally:
            with self._cv:
                self._depth -= 1
                if not self._depth:
                    self._owner = None
                    self._cv.notify_all()

    @contextmanager
    def shared(self):
        me = threading.get_ident()
        with self._cv:
            if self._owner == me:
                mine = False
            else:
                # a window waiting goes first: the restore's image readers
                # would otherwise keep a module load waiting until all of
                # them were done
                while self._owner is not None or self._waiting:
                    self._cv.wait()
                self._shared += 1
                mine = True
        try:
            yield
        finally:
            if mine:
                with self._cv:
                    self._shared -= 1
                    if not self._shared:
                        self._cv.notify_all()


MAP_GATE = _Gate()
