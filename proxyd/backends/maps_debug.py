"""A diagnostic for where the driver places module memory (issue 23, target
5): with GPUPROXY_DEBUG_MAPS=DIR, the worker copies its /proc/self/maps and
its threads' names into DIR before each of its first context creations and
module loads. The driver takes module code and `__device__` variables from
address space it maps next to the process's other mappings, so a worker that
restores an image and moved every variable by one offset differs from the
worker that served the app by some mapping made before the first load; the
two files name it. Off (one environment lookup) unless set.

Locking: a module-level counter under a lock (the restore may load on
several threads)."""
from __future__ import annotations

import os
import threading

_DIR = os.environ.get("GPUPROXY_DEBUG_MAPS")
_LOCK = threading.Lock()
_COUNT: dict[str, int] = {}
FIRST = 3          # events of each kind recorded per process


def note(event: str) -> None:
    if not _DIR:
        return
    with _LOCK:
        n = _COUNT.get(event, 0)
        if n >= FIRST:
            return
        _COUNT[event] = n + 1
    pid = os.getpid()
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
        threads = []
        for t in sorted(os.listdir("/proc/self/task")):
            try:
                with open(f"/proc/self/task/{t}/comm") as f:
                    threads.append(f"{t} {f.read().strip()}")
            except OSError:
                pass
        os.makedirs(_DIR, mode=0o700, exist_ok=True)
        # a new file, ours alone, never through a link another user put in DIR
        fd = os.open(os.path.join(_DIR, f"maps-{pid}-{event}-{n}.txt"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"# pid {pid} {event} #{n} thread {threading.current_thread().name}\n# threads: "
                    f"{'; '.join(threads)}\n{maps}")
    except OSError:
        pass
