"""Whole-process checkpoints: proxyd saves the GPU state, CRIU the app's
process tree, into one image directory (docs/checkpoint.md). A library:
proxy-cli calls it, and so can anything else that orchestrates checkpoints
(a node agent, a multi-rank coordinator). Functions take plain arguments
and a control client (gpuproxy.proxyd.client.ControlClient, or anything
with its `call`), return their results as dicts and raise
WholeProcessError with a one-line reason; they print nothing (`notify`,
where given, receives the lines worth telling a person).

    dump     check CRIU, privileges and the pid  (nothing touched yet)
             -> park (the shim closes its sockets and unmaps the memory it
                shares with proxyd; the app's CUDA calls wait in the shim)
             -> GPU state captured (proxyd answers once it is in host
                staging; the image is written in the background)
             -> criu dump of the tree into DIR/criu
             -> --leave-running: resume, then wait for the GPU image and
                put the CRIU record into DIR's manifest (pending.py marks
                DIR until then); otherwise CRIU left the tree stopped, the
                GPU image is waited for, the tree ended, the record added:
                the app is gone and proxyd has released its GPU state.
             Any failure before CRIU has finished leaves the app running:
             GPU state put back if it was released, then resume.
    pre-dump GPU pre-dump, then CRIU's pre-dump where the kernel tracks
             dirty memory (parking around it only if CRIU refuses the app
             as it runs); otherwise one line says so.
    restore  check the image and CRIU -> GPU restore (proxyd answers the
             session's token) and criu restore (detached, same pids) at
             the same time (overlap.py) -> resume with the token once both
             are done: the shim reconnects to this proxyd.

proxyd's control commands used: status, park, dump, pre-dump, restore,
resume (docs/protocol.md).
"""
from __future__ import annotations

import os
import time
from typing import Callable

from gpuproxy.proxyd.checkpoint import criu
from gpuproxy.proxyd.checkpoint.image import Image, ImageError, read_manifest

from ...client import ControlError
from ...core import procinfo
from . import pending, predump
from .criu_record_call import record as record_criu

PARK_TIMEOUT_S = float(os.environ.get("GPUPROXY_PARK_TIMEOUT_S", "60"))


class WholeProcessError(Exception):
    pass


def _pid_owner(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        raise WholeProcessError(f"no process {pid}") from None


def check_client(client, pid: int, endpoint: str) -> dict:
    """The status entry of pid's session; refuses a pid that is not a
    gpuproxy client of this proxyd."""
    st = client.call("status")
    for s in st.get("sessions", []):
        if int(s.get("pid") or 0) == pid:
            return s
    raise WholeProcessError(f"pid {pid} is not a gpuproxy client of proxyd at {endpoint} (it is not in "
                            f"`proxy-cli status`); nothing was done")


def check_owner(pid: int) -> None:
    """Everything runs as the app's owner or as root."""
    uid, me = _pid_owner(pid), os.geteuid()
    if me != 0 and uid != me:
        raise WholeProcessError(f"pid {pid} belongs to uid {uid}; run proxy-cli as that user or as root")


def check_dumpable(pid: int) -> None:
    """Refuses, before the app is parked, a process CRIU could not dump."""
    try:
        criu.check_dumpable(pid)
    except criu.CriuError as e:
        raise WholeProcessError(f"whole-process checkpoint of pid {pid} impossible: {e}. Nothing was done: "
                                f"the app keeps running (--gpu-only checkpoints its GPU state alone)") from None


def _usable_criu(what: str) -> criu.Criu:
    try:
        return criu.usable()
    except criu.CriuError as e:
        raise WholeProcessError(f"whole-process {what} impossible: {e}. Nothing was done: the app keeps "
                                f"running (--gpu-only checkpoints its GPU state alone)") from None


def _park(client, pid: int, in_call: bool = False) -> dict:
    """in_call: the app may wait inside a call its worker holds at a job's
    cut, and parks there (multirank_wp.py)."""
    try:
        res = client.call("park", {"pid": pid, "timeout_s": PARK_TIMEOUT_S, **({"in_call": True} if in_call else {})})
    except ControlError as e:
        if "unknown command" in str(e):
            raise WholeProcessError(f"this proxyd cannot park its clients ({e}): it predates whole-process "
                                    f"checkpoints; use --gpu-only") from None
        try:
            _resume(client, pid=pid)     # whatever part of it parked goes on
        except ControlError:
            pass
        raise WholeProcessError(f"the app (pid {pid}) did not park: {e}; nothing was dumped") from None
    return res


def _resume(client, **who) -> dict:
    return client.call("resume", who)


def _criu_parent(image_dir: str) -> str | None:
    """criu/ of image_dir if it holds a CRIU dump made with memory tracking
    (a base for --prev-images-dir)."""
    try:
        m, _ = read_manifest(image_dir)
    except ImageError:
        return None
    rec = m.get(criu.RECORD_KEY) or {}
    if rec.get("complete") and (rec.get("options") or {}).get("track_mem"):
        return os.path.join(image_dir, rec.get("dir") or criu.SUBDIR)
    return None


def _parent_dir(path: str, parent: str | None) -> str | None:
    """Where the GPU dump's parent image will be: --parent, or DIR/parent
    when DIR holds an image (the engine moves it there)."""
    if parent:
        return os.path.abspath(parent)
    if os.path.exists(os.path.join(path, "manifest")):
        return os.path.join(path, "parent")
    return None


def _prepare(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def dump(client, endpoint: str, pid: int, dir: str, *, parent: str | None = None, leave_running: bool = False,
         concurrent: bool = False, compress: str | None = None,
         notify: Callable[[str], None] | None = None, pre_dump: bool | None = None) -> dict:
    """Whole-process dump of pid's app into dir (see the module's docstring);
    concurrent implies leave_running. Returns {"gpu": proxyd's dump answer,
    "criu": the CRIU record, "token", "path", "leave_running", "stall_ms":
    how long the app was held as seen from here, from the park to its resume
    (to the end of CRIU's dump when the app does not go on), "app_stopped_ms":
    the same as the app's shim measured it (interceptor/park.c; None from an
    older shim), "stages_ms": where the time went}.

    With leave_running the app goes on once its state is captured (GPU
    memory in host staging or device snapshots, CRIU's dump of the process);
    the GPU image is written after (checkpoint/background.py) and the image
    is complete only once that is durable and the CRIU record is in its
    manifest (pending.py: an interrupted write puts the previous image back).

    pre_dump (None: where the kernel tracks dirty memory, with leave_running;
    False: never; True: always, even where it must fail): CRIU pre-dumps the
    tree before the park, so that the parked dump writes only what changed
    since (predump.py). The result then has "pre_dump" (its record), or
    "pre_dump_skipped" saying why there was none or why it was not used."""
    path = os.path.abspath(dir)
    leave = bool(leave_running or concurrent)
    check_client(client, pid, endpoint)
    check_owner(pid)
    c = _usable_criu("dump")
    check_dumpable(pid)
    _recover_pending(path, notify)
    parent_dir = _parent_dir(path, parent)
    _prepare(path)
    stages: dict = {}
    pre_rec, pre_why = None, predump.unusable(c, leave, pre_dump)
    if pre_why is None:     # the app runs (CRIU freezes it briefly); written beside DIR until the GPU dump
        pre_rec, failed, stages["criu_pre_dump"] = predump.run(c, pid, path)
        if pre_rec is not None and pre_rec.get("frozen_ms") is not None:
            stages["criu_pre_dump_frozen"] = pre_rec["frozen_ms"]     # CRIU's own figure (stats-dump)
        if pre_rec is None:
            pre_why = f"CRIU's pre-dump failed, so the parked dump saved the process memory whole: {failed}"
    pending.begin(path, parent_given=bool(parent))     # until the image is complete and durable
    t_park = time.monotonic()      # the app's threads are held from here
    try:
        parked = _park(client, pid)
    except BaseException:
        predump.discard(path)
        pending.end(path)      # nothing was written
        raise
    token = parked.get("token", "")
    held_ns = parked.get("held_ns")
    t = time.monotonic()
    stages["park"] = _ms(t_park, t)
    gpu = None
    try:
        args = {"pid": pid, "dir": path, "leave_running": leave, "concurrent": bool(concurrent),
                "background": True}
        if compress:
            args["compress"] = compress
        if parent:
            args["parent"] = os.path.abspath(parent)
        gpu = client.call("dump", args)
        t2 = time.monotonic()
        stages["gpu_capture" if gpu.get("captured") else "gpu_dump"] = _ms(t, t2)
        # a final dump whose GPU image is still being written: CRIU leaves the
        # tree stopped, and it is ended only once that image is durable (a
        # full disk fails the dump, never the app)
        overlap = not leave and bool(gpu.get("captured"))
        chain = _criu_parent(parent_dir) if parent_dir else None
        try:
            rec = criu.dump(c, pid, path, leave_running=leave, leave_stopped=overlap,
                            parent_images=predump.place(path) if pre_rec else chain)
        except criu.CriuError as e:
            if pre_rec is None:
                raise
            # still parked: the plain dump is the fallback
            pre_rec, pre_why = None, f"the parked dump on the pre-dump failed ({e}); it was made again without it"
            predump.drop_placed(path)
            rec = criu.dump(c, pid, path, leave_running=leave, leave_stopped=overlap, parent_images=chain)
        if pre_rec is not None and rec.get("prev_images_dir"):
            rec["pre_dump"] = predump.summary(pre_rec)
        elif pre_rec is not None:
            pre_rec, pre_why = None, "CRIU made the parked dump without memory tracking, so not on the pre-dump"
            predump.drop_placed(path)
        t3 = time.monotonic()
        stages["criu_dump"] = _ms(t2, t3)
        if overlap:
            try:
                gpu = dict(client.call("dump-wait", {"pid": pid, "dir": path}), capture=gpu)
            except ControlError:
                criu.continue_tree(rec.get("pids") or [pid])
                raise
            criu.kill_tree(rec.get("pids") or [pid])
            t4 = time.monotonic()
            stages["gpu_write_wait"] = _ms(t3, t4)
            t3 = t4
    except BaseException as e:
        predump.discard(path)
        if gpu is not None and gpu.get("captured"):
            try:     # the write finishes first (a final dump's session is released after it)
                gpu = dict(client.call("dump-wait", {"pid": pid, "dir": path}), capture=gpu)
            except ControlError:
                pass
        resumed = _recover(client, pid, path, gpu, notify)
        _settle_failed(path, notify)
        if isinstance(e, (criu.CriuError, ControlError)):
            # not resumed: proxyd is gone, and the parked app goes on by itself (park_lease.py)
            goes_on = ("The app runs on (resumed)" if resumed else "The app was not resumed from here; a parked "
                       "app whose proxyd is gone goes on by itself within seconds, its CUDA calls failing")
            raise WholeProcessError(f"whole-process dump of pid {pid} failed: {e}. {goes_on}; {path} holds no "
                                    f"usable whole-process image") from None
        raise
    app_stopped = None
    if not leave:
        stall_ms = (t3 - t_park) * 1000.0     # CRIU ended the app
        if held_ns:
            app_stopped = round((time.monotonic_ns() - int(held_ns)) / 1e6 - (time.monotonic() - t3) * 1000, 3)
        record_criu(client, path, rec)     # proxyd seals it (criu_record.py)
        criu.make_private(path)
        pending.end(path)
    else:
        ran = _resume(client, pid=pid, wait_ran=True) or {}
        t4 = time.monotonic()
        stall_ms = (t4 - t_park) * 1000.0
        stages["resume"] = _ms(t3, t4)
        app_stopped = ran.get("app_stopped_ms")
        if ran.get("held_ns") is not None:     # the app's own window (CLOCK_MONOTONIC ns)
            stages["app_window_ns"] = [ran["held_ns"], ran["ran_ns"]]
        if gpu.get("captured"):
            # the app runs; the GPU image is still being written
            try:
                gpu = dict(client.call("dump-wait", {"pid": pid, "dir": path}), capture=gpu)
            except ControlError as e:
                said = pending.rollback(path)
                raise WholeProcessError(f"whole-process dump of pid {pid}: the app runs on, but writing its "
                                        f"GPU image failed ({e}); {said}") from None
            stages["gpu_write_after_resume"] = _ms(t4, time.monotonic())
        record_criu(client, path, rec)     # proxyd seals it (criu_record.py)
        criu.make_private(path)
        pending.end(path)
        stages["complete_after_resume"] = _ms(t4, time.monotonic())
    out = {"gpu": gpu, "criu": rec, "token": token, "path": path, "leave_running": leave,
           "stall_ms": round(stall_ms, 1), "app_stopped_ms": app_stopped, "stages_ms": stages}
    if pre_rec is not None:
        out["pre_dump"] = rec["pre_dump"]
    else:
        out["pre_dump_skipped"] = pre_why
    return out


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1000.0, 3)


def _recover_pending(path: str, notify) -> None:
    try:
        said = pending.recover(path)
    except pending.PendingError as e:
        raise WholeProcessError(f"{e}. Nothing was done") from None
    if said and notify is not None:
        notify(said)


def _settle_failed(path: str, notify) -> None:
    """After a failed dump (its background write waited for):
    the partial image goes, the previous one is DIR again."""
    said = pending.rollback(path)
    if notify is not None:
        notify(said)


def _recover(client, pid: int, path: str, gpu: dict | None, notify=None) -> bool:
    """After a failure before CRIU finished: the app must go on. If the GPU
    dump released the session's GPU state, put it back from the image just
    written, then let the app reconnect. False when it could not."""
    try:
        if gpu is not None and gpu.get("released"):
            client.call("restore", {"dir": path, "device_map": {}})
        _resume(client, pid=pid)
    except ControlError as e:
        if notify is not None:
            notify(f"could not resume pid {pid} after the failure: {e}")
        return False
    return True


def pre_dump(client, endpoint: str, pid: int, dir: str, *, parent: str | None = None,
             compress: str | None = None) -> dict:
    """GPU pre-dump of pid's session into dir, then CRIU's pre-dump where the
    kernel tracks dirty memory. Returns {"gpu", "criu" (None when skipped),
    "criu_skipped" (why, when skipped), "path"}."""
    path = os.path.abspath(dir)
    check_client(client, pid, endpoint)
    check_owner(pid)
    try:
        c = criu.usable()
    except criu.CriuError as e:
        c, why = None, f"CRIU unusable ({e})"
    parent_dir = _parent_dir(path, parent)
    _prepare(path)
    args = {"pid": pid, "dir": path}
    if compress:
        args["compress"] = compress
    if parent:
        args["parent"] = os.path.abspath(parent)
    gpu = client.call("pre-dump", args)
    out = {"gpu": gpu, "criu": None, "path": path}
    if c is not None and not c.mem_tracking():
        why = ("this kernel does not track dirty memory (`criu check --feature mem_dirty_track` fails), so "
               "CRIU cannot pre-dump")
        c = None
    if c is None:
        out["criu_skipped"] = f"GPU pre-dump only: {why}; the next --dump saves the process memory whole"
        criu.make_private(path)
        return out
    prev = _criu_parent(parent_dir) if parent_dir else None
    try:
        rec = criu.dump(c, pid, path, leave_running=True, pre=True, parent_images=prev)
    except criu.CriuError as first:
        # CRIU may refuse the app's live sockets or shared mappings: park and retry
        _park(client, pid)
        try:
            rec = criu.dump(c, pid, path, leave_running=True, pre=True, parent_images=prev)
        except criu.CriuError as e:
            raise WholeProcessError(f"CRIU pre-dump failed ({first}; parked: {e}); the GPU pre-dump in {path} "
                                    f"stands, the app runs on") from None
        finally:
            _resume(client, pid=pid)
    record_criu(client, path, rec)     # proxyd seals it (criu_record.py)
    criu.make_private(path)
    out["criu"] = rec
    return out


def _check_pids_free(rec: dict) -> None:
    """CRIU restores the tree under its old pids: they must be free."""
    for p in rec.get("pids") or [rec.get("root_pid")]:
        if not os.path.exists(f"/proc/{p}"):
            continue
        if criu.pid_alive(int(p)):
            try:
                exe = os.readlink(f"/proc/{p}/exe")
            except OSError:
                exe = "?"
            raise WholeProcessError(f"pid {p} is in use ({exe}): CRIU restores the app under its old pids, so "
                                    f"that process must end first (if it is the app itself, it still runs: "
                                    f"restore a running app's GPU state with --gpu-only)")
        raise WholeProcessError(f"pid {p} is a zombie {_reaper_of(int(p))} has not reaped yet; CRIU needs the pid "
                                f"free (a container whose PID 1 never reaps orphans keeps them: run it with an "
                                f"init, e.g. `docker run --init`, or restore after that process ends)")


def _reaper_of(pid: int) -> str:
    """Who owes pid's exit status: its parent, named."""
    try:
        ppid = int(procinfo.stat_fields(pid)[1])
        exe = os.readlink(f"/proc/{ppid}/exe")
    except (OSError, IndexError, TypeError, ValueError):
        return "its parent"
    return f"its parent (pid {ppid}, {exe})"


def _check_files(rec: dict, rollback: bool) -> None:
    """Files the app had open for writing must have their size at the dump
    (CRIU checks it). One that grew since (a periodic checkpoint's app ran
    on) is cut back with rollback: what the app wrote after the checkpoint
    goes, and the restored app writes it again."""
    grown, bad = [], []
    for f in rec.get("written_files") or []:
        try:
            now = os.stat(f["path"]).st_size
        except OSError:
            bad.append(f"{f['path']} is missing")
            continue
        if now > f["size"]:
            grown.append((f["path"], f["size"], now))
        elif now < f["size"]:
            bad.append(f"{f['path']} has {now} bytes, {f['size']} at the dump")
    if bad:
        raise WholeProcessError("files the app had open changed since the dump: " + "; ".join(bad))
    if grown and not rollback:
        raise WholeProcessError("files the app had open grew since the dump: " + "; ".join(
            f"{p} ({s} -> {n} bytes)" for p, s, n in grown) + ". CRIU restores the app as it was at the dump: "
            "pass --rollback-files to cut them back (what it wrote after the checkpoint is dropped; it writes it "
            "again)")
    for p, s, _n in grown:
        os.truncate(p, s)


def restore_state(path: str, notify: Callable[[str], None] | None = None) -> dict:
    """The image's CRIU state (criu.state), refusing an unreadable image. A
    dump into path that was interrupted while its image was written is
    undone first (pending.py): the previous image is the one restored."""
    _recover_pending(os.path.abspath(path), notify)
    try:
        with Image.open(path) as img:
            return criu.state(path, img.manifest)
    except ImageError as e:
        raise WholeProcessError(f"image refused: {e}") from None


def restore(client, endpoint: str, path: str, device_map: dict, st: dict, rollback_files: bool = False,
            allow_foreign: bool = False, inherit: dict | None = None) -> dict:
    """Whole-process restore of the image at path (st: restore_state());
    inherit: files of ours the restored app gets (criu.restore)."""
    if not st["complete"]:
        raise WholeProcessError(f"the process part of {path} is not restorable: {st['problem']}. Nothing was "
                                f"restored (--gpu-only restores the GPU state alone)")
    rec = st["record"]
    if rec.get("kind") != "dump":
        raise WholeProcessError(f"{path} holds a CRIU {rec.get('kind')}, not a dump: restore needs a dump")
    c = _usable_criu("restore")
    _check_pids_free(rec)
    _check_files(rec, rollback_files)
    # the GPU state and the process at the same time (overlap.py); the app
    # waits parked until both are back
    from . import overlap
    both = overlap.run_both(
        lambda: client.call("restore", {"dir": path, "device_map": device_map, "allow_foreign": allow_foreign}),
        lambda: criu.restore(c, path, rec, inherit=inherit),
        sequential_why=overlap.precheck(path, allow_foreign) if overlap.enabled() else None)
    gpu, pid, ms = both["gpu"], both["pid"], both["criu_ms"]
    token = gpu.get("token") if isinstance(gpu, dict) else None
    if both["gpu_error"] is not None:
        e = both["gpu_error"]
        if pid is None or not isinstance(e, (ControlError, OSError)):
            raise e          # CRIU did not run: as before overlapping
        ended = overlap.end_restored(rec.get("pids") or [pid])
        after = (f"the process CRIU had restored meanwhile (pids {', '.join(map(str, ended)) or pid}, still "
                 f"parked) was ended; nothing was restored")
        raise WholeProcessError(f"GPU restore failed: {e}; {after}") from None
    if both["criu_error"] is not None:
        e = both["criu_error"]
        # nothing will attach to the restored GPU state: release it now, so
        # that the restore can be tried again at once (proxyd/supervisor/discard.py)
        try:
            client.call("discard", {"token": token}) if token else None
            after = "the GPU state it had restored into proxyd was released again; the restore can be retried"
        except ControlError as x:
            after = (f"the GPU state was restored into proxyd at {endpoint} but could not be released ({x}); "
                     f"proxyd ends it after GPUPROXY_ATTACH_GRACE_S")
        raise WholeProcessError(f"{e}. The process was not restored: {after}") from None
    # pid_here: where the restored app waits (its /dev/shm may be a
    # container's own, which proxyd reaches through /proc/PID/root)
    here = {"pid_here": pid} if isinstance(pid, int) and pid > 0 else {}
    if token:
        _resume(client, token=token, **here)
    else:
        _resume(client, pid=pid)
    return {"gpu": gpu, "pid": pid, "criu_ms": ms, "token": token, "path": path,
            "gpu_ms": both["gpu_ms"], "both_ms": both["wall_ms"], "overlapped": both["overlapped"],
            **({"sequential_why": both["sequential_why"]} if not both["overlapped"] else {})}
