"""proxy-cli's checkpoint commands, served by proxyd (message type CTL):
pre-dump, dump, restore, migrate. Each runs on a worker thread and answers
when it is done; the main loop keeps serving every other session meanwhile.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time

from ..core.ratelog import RATE
from .background import BackgroundWrites
from .engine import CheckpointError, Engine

log = logging.getLogger("proxyd")
# for tests only: a dump that waits this long before it starts (its proxyd is killed meanwhile)
TEST_DUMP_DELAY_S = float(os.environ.get("GPUPROXY_TEST_DUMP_DELAY_S", "0"))


def register(server, ctl):
    engine = Engine(server)
    server.checkpoint_engine = engine
    writes = BackgroundWrites()

    def find(pid: int):
        for s in server.sessions.values():
            if s.pid == pid:
                return s
        raise CheckpointError(f"no session of pid {pid} in this proxyd (see proxy-cli status)")

    def worker(rid, seq, name, fn, reply=None):
        if reply is None:
            def reply(rid, seq, result=None, error=None, threaded=True):
                server.ctl_reply(rid, seq, result, error=error, threaded=threaded)

        def run():
            try:
                result = fn()
                reply(rid, seq, result, threaded=True)
            except CheckpointError as e:
                RATE.event("checkpoint command refused", "%s: %s", name, e)
                reply(rid, seq, error=str(e), threaded=True)
            except OSError as e:
                # the filesystem's answer (a full disk, a missing folder): one line, no traceback
                RATE.event("checkpoint command failed", "%s failed: %s", name, e)
                reply(rid, seq, error=f"{name} failed: {e}", threaded=True)
            except Exception as e:
                if getattr(server, "closed", False):
                    # the session's process exited during the command and
                    # the worker is stopping (server.close): not a bug
                    log.info("%s stopped: the session ended (its process exited)", name)
                    reply(rid, seq, error=f"{name} failed: the session ended", threaded=True)
                    return
                RATE.internal_error("internal error in a checkpoint command", f"{name} failed", e)
                reply(rid, seq, error=f"{name} failed: {e}", threaded=True)
        threading.Thread(target=run, name=f"gpuproxy-{name}", daemon=True).start()

    def reserve(pid, freeze_now=False):
        """Claims the session for one checkpoint (main loop). The engine
        freezes it itself once its preparations are done."""
        s = find(int(pid))
        if s.frozen or s.ckpt_busy:
            raise CheckpointError(f"session of pid {pid} is busy (a checkpoint is running, or it was dumped "
                                  f"and waits for a restore)")
        s.ckpt_busy = True
        if freeze_now:
            s.frozen = True
        return s

    def dump_cmd(kind):
        def handler(rid, seq, args):
            try:
                s = reserve(args["pid"])
            except (CheckpointError, KeyError) as e:
                server.ctl_reply(rid, seq, error=str(e))
                return

            bg = kind == "dump" and bool(args.get("background"))
            job = writes.start(args["dir"]) if bg else None
            state = {"replied": False}

            def captured(stats):
                # the state is captured and the session runs: answer now, write on
                state["replied"] = True
                server.ctl_reply(rid, seq, dict(stats, captured=True, background=True), threaded=True)

            def run():
                if TEST_DUMP_DELAY_S:       # tests: a dump that stalls (its proxyd killed meanwhile)
                    time.sleep(TEST_DUMP_DELAY_S)
                try:
                    res = engine.dump(s, args["dir"], kind=kind, leave_running=bool(args.get("leave_running")),
                                      concurrent=bool(args.get("concurrent")), parent=args.get("parent"),
                                      compress=args.get("compress"), on_captured=captured if bg else None)
                except BaseException as e:
                    if job is not None:
                        job.finish(None, str(e) or type(e).__name__)
                    raise
                finally:
                    s.ckpt_busy = False
                if job is not None:
                    job.finish(res, None)
                return res

            def reply(rid, seq, result=None, error=None, threaded=True):
                if not state["replied"]:      # (after the capture, dump-wait tells the rest)
                    server.ctl_reply(rid, seq, result, error=error, threaded=threaded)
            worker(rid, seq, kind, run, reply=reply)
        return handler

    ctl("pre-dump")(dump_cmd("pre-dump"))
    ctl("dump")(dump_cmd("dump"))

    @ctl("dump-wait")
    def dump_wait(rid, seq, args):
        """Answers when the background write of a dump (args: dir) is done
        (background.py), or after timeout_s (default 600) with an error."""
        def run():
            try:
                res, why = writes.wait(str(args["dir"]), float(args.get("timeout_s", 600)))
            except (KeyError, TypeError, ValueError):
                res, why = None, "dump-wait needs dir (and a numeric timeout_s)"
            server.ctl_reply(rid, seq, res, error=why, threaded=True)
        threading.Thread(target=run, name="gpuproxy-dump-wait", daemon=True).start()

    @ctl("restore")
    def restore(rid, seq, args):
        def run():
            sess, stats = engine.restore(args["dir"], args.get("device_map"),
                                         allow_foreign=bool(args.get("allow_foreign")))
            return stats
        worker(rid, seq, "restore", run)

    @ctl("migrate")
    def migrate(rid, seq, args):
        try:
            to = int(args["to_device"])
            if not 0 <= to < server.backend.device_count():
                raise CheckpointError(f"no device {to} (this proxyd has {server.backend.device_count()})")
            s = reserve(args["pid"])
        except (CheckpointError, KeyError) as e:
            server.ctl_reply(rid, seq, error=str(e))
            return

        def run():
            # a dump to host memory, then a restore onto the other device
            tmp = tempfile.mkdtemp(prefix="gpuproxy-migrate-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
            try:
                try:
                    d = engine.dump(s, tmp, kind="dump", leave_running=False)
                finally:
                    s.ckpt_busy = False
                _, r = engine.restore(tmp, {str(dv): to for dv in range(server.backend.device_count())})
                return {"dump": d, "restore": r, "to_device": to,
                        "stop_ms": round(d["total_ms"] + r["total_ms"], 3)}
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        worker(rid, seq, "migrate", run)
