"""Park files (parkheld, ran, lease) left in /dev/shm by a proxyd that died
are removed when the next one starts, only where their client is gone
(proxyd/supervisor/park_sweep.py); a live client's, another user's, a
lease a running supervisor renews, and a released session's marker stay."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from gpuproxy.proxyd.core import procinfo
from gpuproxy.proxyd.supervisor import markers, park_sweep


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def put(d, name: str, body: str = "", age_s: float = 60) -> str:
    p = d / name
    p.write_text(body)
    t = time.time() - age_s
    os.utime(p, (t, t))
    return name


def test_files_of_gone_clients_are_removed_and_the_rest_kept(tmp_path):
    dead, me = dead_pid(), os.getpid()
    gone = [put(tmp_path, f"gpuproxy-{k}-0123456789abcdef-{dead}") for k in ("parkheld", "ran", "lease")]
    gone.append(put(tmp_path, f"gpuproxy-ran-0123456789abcdef-{dead}.tmp"))
    gone.append(put(tmp_path, f"gpuproxy-lease-1111111111111111-{dead}", "0 0\n"))     # a container's lease
    kept = [
        put(tmp_path, f"gpuproxy-parkheld-2222222222222222-{me}", age_s=0),    # live client (written after it started)
        put(tmp_path, f"gpuproxy-released-4444444444444444-{dead}"),          # a marker: markers.py's
        put(tmp_path, f"gpuproxy-resume-4444444444444444-{dead}"),            # (restored copies get a new one)
        put(tmp_path, f"gpuproxy-4444444444444444-{dead}-chan"),             # a segment: shm_sweep.py's
        put(tmp_path, "gpuproxy-lease-nothex-1"),                             # not our shape
        # a lease a running supervisor (this process, with its start ticks) holds
        put(tmp_path, f"gpuproxy-lease-5555555555555555-{dead}", f"{me} {procinfo.start_time(me)}\n"),
    ]
    assert sorted(park_sweep.stale(str(tmp_path), min_age_s=0)) == sorted(gone)
    assert park_sweep.sweep(str(tmp_path), min_age_s=0) == len(gone)
    assert sorted(os.listdir(tmp_path)) == sorted(kept)


def test_a_new_file_is_kept(tmp_path):
    """A park being set up: its files are younger than MIN_AGE_S."""
    put(tmp_path, f"gpuproxy-ran-3333333333333333-{dead_pid()}", age_s=0)
    assert park_sweep.stale(str(tmp_path)) == []


def test_a_reused_pid_is_not_the_files_client(tmp_path):
    """The pid exists, but its process started after the file was written."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        old = put(tmp_path, f"gpuproxy-parkheld-0123456789abcdef-{child.pid}", age_s=3600)
        put(tmp_path, f"gpuproxy-ran-0123456789abcdef-{child.pid}", age_s=0)   # written after it started
        assert park_sweep.stale(str(tmp_path), min_age_s=0) == [old]
    finally:
        child.kill()
        child.wait()


def test_a_held_staging_lock_keeps_the_files(tmp_path):
    """A client of another pid namespace: its pid means nothing here, its
    lock on its staging segment says it lives."""
    dead = dead_pid()
    put(tmp_path, f"gpuproxy-0123456789abcdef-{dead}-0", "\0" * 64)
    name = put(tmp_path, f"gpuproxy-parkheld-0123456789abcdef-{dead}")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDONLY); "
                               "fcntl.flock(fd, fcntl.LOCK_SH); print('ok', flush=True); time.sleep(60)",
                               str(tmp_path / f"gpuproxy-0123456789abcdef-{dead}-0")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        assert park_sweep.stale(str(tmp_path)) == []
    finally:
        holder.kill()
        holder.wait()
    assert park_sweep.stale(str(tmp_path)) == [name]


def test_another_users_files_are_left_to_root(tmp_path, monkeypatch):
    dead = dead_pid()
    name = put(tmp_path, f"gpuproxy-ran-0123456789abcdef-{dead}")
    if os.geteuid() == 0:
        os.chown(tmp_path / name, 4242, 4242)
        monkeypatch.setattr(park_sweep.os, "geteuid", lambda: 4343)     # proxyd as another, unprivileged user
        assert park_sweep.stale(str(tmp_path)) == []
        monkeypatch.setattr(park_sweep.os, "geteuid", lambda: 0)        # root: the owner's process is gone
        assert park_sweep.stale(str(tmp_path)) == [name]
    else:
        assert park_sweep.stale(str(tmp_path)) == [name]                # our own file


def test_a_released_sessions_marker_stays(tmp_path):
    """A released session waits for its restore: its client lives, and
    neither sweep removes its marker."""
    name = put(tmp_path, f"gpuproxy-released-0123456789abcdef-{os.getpid()}", "ipc:///x\n", age_s=0)
    assert park_sweep.sweep(str(tmp_path), min_age_s=0) == 0
    assert markers.sweep(str(tmp_path), min_age_s=0) == 0
    assert os.listdir(tmp_path) == [name]


def test_proxyd_sweeps_them_when_it_starts(fresh_daemon):
    """main() runs the sweep before it serves; the real /dev/shm, names of
    this test's own (random ids)."""
    from pathlib import Path
    shm = Path("/dev/shm")
    dead = put(shm, f"gpuproxy-parkheld-{os.urandom(8).hex()}-{dead_pid()}")
    live = put(shm, f"gpuproxy-ran-{os.urandom(8).hex()}-{os.getpid()}", age_s=0)
    try:
        fresh_daemon()
        assert not (shm / dead).exists()
        assert (shm / live).exists()
    finally:
        for n in (dead, live):
            try:
                os.unlink(shm / n)
            except OSError:
                pass
