"""The `record-criu` control command: proxyd adds CRIU's record to a GPU
image it wrote and seals the manifest again with its own key
(checkpoint/criu_record.py says why). Authorised as other commands naming a
folder (daemon.authorise: the image folder must be the asker's). Runs on the
supervisor's loop: it reads and rewrites one manifest, no image data.
"""
from __future__ import annotations

import logging

log = logging.getLogger("proxyd")


def ctl_record_criu(sup, rid, seq, args) -> None:
    from ..checkpoint.criu_record import RecordError, seal_record
    d = args.get("dir")
    if not isinstance(d, str) or not d:
        sup.reply(rid, seq, error="record-criu needs the image folder (dir)")
        return
    try:
        seal_record(d, args.get("record"))
    except (RecordError, OSError) as e:
        sup.reply(rid, seq, error=f"CRIU record not added to {d}: {e}")
        return
    log.info("CRIU record added to %s and sealed", d)
    sup.reply(rid, seq, {"recorded": True})
