"""proxyd reaching a client's own /dev/shm (proxyd/supervisor/client_view.py):
a restored app in a container with its own IPC namespace waits there for its
resume, which proxyd writes through /proc/PID/root. Where it cannot look
(not root, another user's process), the resume fails with one line naming
the fixes instead of writing where the app never looks. Tested with podman
in tests/test_cluster_podman.py (containers without --ipc host)."""
from __future__ import annotations

import os
import pytest

from gpuproxy.proxyd.supervisor import client_view


def test_own_process_is_reachable():
    assert client_view.unreachable(os.getpid()) is None
    assert client_view.shm_dir(os.getpid()) == "/dev/shm"
    assert client_view.unreachable(2 ** 22 + 12345) is None     # no such process: not this error


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to look as another user")
def test_another_users_process_is_not_and_the_line_names_the_fixes():
    me = os.getpid()
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:          # look at this process as nobody
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(wfd, str(client_view.unreachable(me)).encode())
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd) as f:
        line = f.read()
    os.waitpid(child, 0)
    assert "\n" not in line and f"pid {me}" in line and "uid 65534" in line, line
    assert "--ipc host" in line and "as root" in line, line
