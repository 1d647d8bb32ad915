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

from ..core.ratelog import RATE
from .engine import CheckpointError, Engine

log = logging.getLogger("proxyd")


def register(server, ctl):
    engine = Engine(server)
    server.checkpoint_engine = engine

    def find(pid: int):
        for s in server.sessions.values():
            if s.pid == pid:
                return s
        raise CheckpointError(f"no session of pid {pid} in this proxyd (see proxy-cli status)")

    def worker(rid, seq, name, fn):
        def run():
            try:
                result = fn()
                server.ctl_reply(rid, seq, result, threaded=True)
            except CheckpointError as e:
                RATE.event("checkpoint command refused", "%s: %s", name, e)
                server.ctl_reply(rid, seq, error=str(e), threaded=True)
            except OSError as e:
                # the filesystem's answer (a full disk, a missing folder): one line, no traceback
                RATE.event("checkpoint command failed", "%s failed: %s", name, e)
                server.ctl_reply(rid, seq, error=f"{name} failed: {e}", threaded=True)
            except Exception as e:
                if getattr(server, "closed", False):
                    # the session's process exited during the command and
                    # the worker is stopping (server.close): not a bug
                    log.info("%s stopped: the session ended (its process exited)", name)
                    server.ctl_reply(rid, seq, error=f"{name} failed: the session ended", threaded=True)
                    return
                RATE.internal_error("internal error in a checkpoint command", f"{name} failed", e)
                server.ctl_reply(rid, seq, error=f"{name} failed: {e}", threaded=True)
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

            def run():
                try:
                    return engine.dump(s, args["dir"], kind=kind, leave_running=bool(args.get("leave_running")),
                                       concurrent=bool(args.get("concurrent")), parent=args.get("parent"),
                                       compress=args.get("compress"))
                finally:
                    s.ckpt_busy = False
            worker(rid, seq, kind, run)
        return handler

    ctl("pre-dump")(dump_cmd("pre-dump"))
    ctl("dump")(dump_cmd("dump"))

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
