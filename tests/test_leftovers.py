"""A test run leaves no files behind (issue 26): no /tmp/gpuproxy-test-*
folders (conftest.py puts every temporary folder of the run under one root
removed at the end), no gpuproxy-workers-<pid> folders of killed daemons,
no /dev/shm/gpuproxy-* files (client segments, session markers).

A few test files that kill daemons and clients are run in a private mount
namespace with a fresh /tmp and /dev/shm (tmpfs), so that other processes
of the machine cannot blur the comparison; the corpus build cache is
carried in. Needs root and unshare(1); skipped with the reason otherwise."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import corpus

REPO = Path(__file__).resolve().parent.parent
FILES = ["tests/test_daemon_restart.py", "tests/test_cli_errors.py"]


@pytest.mark.slow
def test_test_files_leave_no_files_behind(shim_installed, nvcc):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private /tmp and /dev/shm")
    cache = Path(os.environ.get(corpus.BUILD_DIR_ENV) or corpus.default_build_dir())
    cache.mkdir(parents=True, exist_ok=True)
    holder = tempfile.mkdtemp(prefix="gpuproxy-leftovers-", dir="/var/tmp")
    script = f"""
set -e
mount --bind '{cache}' '{holder}'
mount -t tmpfs gpuproxy-test-tmp /tmp
mount -t tmpfs gpuproxy-test-shm /dev/shm
mkdir -p '{cache}'
mount --move '{holder}' '{cache}'
cd '{REPO}'
set +e
'{sys.executable}' -m pytest -q -x -p no:cacheprovider {' '.join(FILES)} >/tmp/.inner.log 2>&1
rc=$?
set -e
echo "== rc $rc"
echo "== tmp"; ls -A /tmp | grep -v -x -e .inner.log -e '{cache.name}' -e 'pytest-of-.*' || :
echo "== shm"; ls -A /dev/shm || :
[ $rc = 0 ] || tail -n 40 /tmp/.inner.log
"""
    # the inner run makes its own key and cache folders (conftest.py), in its /tmp
    env = {k: v for k, v in os.environ.items() if k not in ("GPUPROXY_KEY_DIR", "GPUPROXY_CACHE_DIR")}
    env[corpus.BUILD_DIR_ENV] = str(cache)
    try:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                           capture_output=True, text=True, timeout=1200, env=env)
    finally:
        os.rmdir(holder)
    if r.returncode != 0 and "== rc" not in r.stdout:
        pytest.skip(f"cannot make a private /tmp and /dev/shm here: {r.stderr.strip()[-300:]}")
    out = r.stdout
    assert "== rc 0" in out, out
    tmp_part = out.split("== tmp", 1)[1].split("== shm", 1)[0].split()
    shm_part = out.split("== shm", 1)[1].split()
    assert tmp_part == [], f"left in /tmp: {tmp_part}"
    assert shm_part == [], f"left in /dev/shm: {shm_part}"
