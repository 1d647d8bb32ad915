"""Leave-running whole-process dumps write the GPU image after the app goes
on (proxyd/checkpoint/background.py, orchestrate/pending.py): the image is
complete only when everything is durable, and an interrupted write leaves
the previous image as the latest.

The flow tests use real CRIU on a plain process and test_whole_process_flow's
stand-in for proxyd (which, like the engine, moves DIR's image into
DIR/parent before writing); the last test asks a real proxyd (emulated
backend) for a background dump and its dump-wait. No timing in any check.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from gpuproxy.proxyd.checkpoint import criu
from gpuproxy.proxyd.checkpoint.image import Image
from gpuproxy.proxyd.checkpoint.orchestrate import pending
from gpuproxy.proxyd.checkpoint.orchestrate import whole_process as W
from gpuproxy.proxyd.client import ControlError

sys.path.insert(0, str(Path(__file__).parent))
from test_criu import lines, start_counter, wait_lines  # noqa: E402
from test_whole_process_flow import Proxyd, args  # noqa: E402


class Engine(Proxyd):
    """Moves DIR's image into DIR/parent when a dump starts, as
    engine._prepare_dir does."""

    def call(self, cmd, a=None, timeout_s=None):
        a = dict(a or {})
        if cmd == "dump" and os.path.exists(os.path.join(a["dir"], "manifest")):
            d = a["dir"]
            os.rename(d, d + ".moving")
            os.makedirs(d)
            os.rename(d + ".moving", os.path.join(d, "parent"))
        return super().call(cmd, a, timeout_s)


def digest(p: Path) -> str:
    return hashlib.sha256((p / "manifest").read_bytes()).hexdigest()


@pytest.fixture
def app(tmp_path):
    p, out = start_counter(tmp_path, new_session=True)
    yield p, out
    p.kill()
    p.wait()


def test_image_complete_only_after_the_background_write(usable_criu, tmp_path, app):
    p, out = app
    img = tmp_path / "img"
    seen = {}

    def at_resume(_a):
        # the app goes on here; its image is not written yet
        seen["manifest_at_resume"] = (img / "manifest").exists()
        seen["marked_at_resume"] = os.path.exists(pending.marker(str(img)))

    def at_wait(_a):
        seen["app_ran_before_write"] = p.poll() is None
    px = Engine(p.pid, background=True, hooks={"resume": at_resume, "dump-wait": at_wait})
    res = W.dump(px, "ipc://test", **args(p.pid, img, leave=True))
    assert px.names() == ["status", "park", "dump", "resume", "dump-wait", "record-criu"]
    assert px.calls[2][1]["background"] is True
    assert seen == {"manifest_at_resume": False, "marked_at_resume": True, "app_ran_before_write": True}
    assert not os.path.exists(pending.marker(str(img)))
    st = W.restore_state(str(img))
    assert st["complete"], st
    assert res["app_stopped_ms"] == 2.0 and res["stages_ms"]["app_window_ns"] == [1, 2000001]
    for k in ("park", "gpu_capture", "criu_dump", "resume", "gpu_write_after_resume"):
        assert k in res["stages_ms"], res["stages_ms"]
    with Image.open(img) as im:
        assert im.verify() == [] and im.manifest["criu"]["complete"]
    n = len(lines(out))
    wait_lines(out, n + 2)          # and it kept running


def test_failed_background_write_keeps_the_previous_image(usable_criu, tmp_path, app):
    p, _out = app
    img = tmp_path / "img"
    W.dump(Engine(p.pid, background=True), "ipc://test", **args(p.pid, img, leave=True))
    first = digest(img)
    px = Engine(p.pid, background=True, fail_on="dump-wait")
    with pytest.raises(W.WholeProcessError) as e:
        W.dump(px, "ipc://test", **args(p.pid, img, leave=True))
    assert "the app runs on" in str(e.value) and "previous image" in str(e.value)
    assert p.poll() is None
    assert digest(img) == first and not (img / "parent").exists()
    assert not os.path.exists(pending.marker(str(img)))
    assert W.restore_state(str(img))["complete"]


def test_dump_killed_mid_write_leaves_the_previous_image_latest(usable_criu, tmp_path, app):
    """The orchestrator dies while the image is written (here: an exception
    that nothing catches, as a kill would leave it): the next restore (or
    dump) of DIR finds the marker, says so, and puts the previous image back."""
    p, _out = app
    img = tmp_path / "img"
    W.dump(Engine(p.pid, background=True), "ipc://test", **args(p.pid, img, leave=True))
    first = digest(img)

    class Killed(BaseException):
        pass

    def die(_a):
        raise Killed()
    with pytest.raises(Killed):
        W.dump(Engine(p.pid, background=True, hooks={"dump-wait": die}), "ipc://test",
               **args(p.pid, img, leave=True))
    assert os.path.exists(pending.marker(str(img)))
    assert not (img / "manifest").exists()          # nothing that looks like an image
    said = []
    st = W.restore_state(str(img), notify=said.append)
    assert st["complete"] and digest(img) == first
    assert said and "did not finish" in said[0] and "previous image" in said[0]
    assert not os.path.exists(pending.marker(str(img)))


def test_interrupted_first_dump_leaves_no_image(usable_criu, tmp_path, app):
    p, _out = app
    img = tmp_path / "img"
    img.mkdir()
    (img / "notes.txt").write_text("the owner's file\n")
    with pytest.raises(W.WholeProcessError):
        W.dump(Engine(p.pid, background=True, fail_on="dump-wait"), "ipc://test", **args(p.pid, img, leave=True))
    assert sorted(os.listdir(img)) == ["notes.txt"]
    with pytest.raises(W.WholeProcessError, match="image refused"):
        W.restore_state(str(img))


def test_a_dump_in_progress_is_not_undone_by_another(tmp_path):
    img = tmp_path / "img"
    img.mkdir()
    pending.begin(str(img), parent_given=False)
    m = Path(pending.marker(str(img)))
    m.write_text('{"pid": 1, "previous": null}')        # pid 1 lives: that dump still runs
    with pytest.raises(W.WholeProcessError, match="still being written"):
        W.restore_state(str(img))
    assert m.exists()
    shutil.rmtree(img)
    m.unlink()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_final_dump_ends_the_app_only_once_its_image_is_written(usable_criu, tmp_path, app):
    """A final dump writes the GPU image while CRIU dumps the process; CRIU
    leaves the tree stopped until that write is done, then it is ended."""
    p, _out = app
    img = tmp_path / "img"
    seen = {}

    def at_wait(_a):
        # (CRIU detaches with SIGSTOP pending: the task may show R for a moment
        # on its way into the stop, without running the app's code)
        end = time.monotonic() + 5
        while _state(p.pid) not in ("T", "t") and time.monotonic() < end:
            time.sleep(0.01)
        seen["state_while_writing"] = _state(p.pid)
    px = Engine(p.pid, background=True, hooks={"dump-wait": at_wait})
    res = W.dump(px, "ipc://test", **args(p.pid, img))
    assert px.names() == ["status", "park", "dump", "dump-wait", "record-criu"]
    assert seen["state_while_writing"] in ("T", "t"), seen        # stopped, not gone, while the image is written
    p.wait(10)
    assert res["criu"]["options"]["leave_running"] is False
    assert "gpu_write_wait" in res["stages_ms"]
    assert W.restore_state(str(img))["complete"]


def test_final_dump_whose_write_fails_leaves_the_app_running(usable_criu, tmp_path, app):
    p, out = app
    img = tmp_path / "img"
    px = Engine(p.pid, background=True, fail_on="dump-wait")
    with pytest.raises(W.WholeProcessError) as e:
        W.dump(px, "ipc://test", **args(p.pid, img))
    assert "The app runs on" in str(e.value)
    assert px.names()[-1] == "resume"
    n = len(lines(out))
    wait_lines(out, n + 2)           # it runs again (CRIU had left it stopped)
    assert p.poll() is None and _state(p.pid) not in ("T", "t")
