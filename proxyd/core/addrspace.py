"""One lock for the worker's own large mappings and the driver zone's
windows (backends/driver_zone.py).

While the zone is open for a context creation, a mapping made by another
thread of the worker lands at the zone's top, where the context was to go,
and every module of the session is carved out lower: its `__device__`
variables come back at other addresses than in the worker that served the
app. The worker maps client segments and channels from its serving thread
while a restore thread may be creating contexts (a GPU-only restore whose
app is already calling again), so those mappings take this lock, and the
zone holds it for as long as it is open: one waits for the other, and
neither mapping lands in the other's place.

Locking: re-entrant (a mapping made inside an open window, on the same
thread, is the driver's own business and proceeds). Lower than every user:
imports nothing of gpuproxy.
"""
from __future__ import annotations

import threading

MAP_LOCK = threading.RLock()
