"""Recording CRIU's part in a GPU image by proxyd (checkpoint/criu_record.py):
what proxy-cli (whole_process.py, the preemption contract) and the CRIU
plugin's helper (criu_hooks.py) call once CRIU has finished. A proxyd that
does not know the command (an older one) gets the former way: the record is
added here and sealed with this user's key when it is proxyd's."""
from __future__ import annotations

import os


def record(client, image_dir: str, rec: dict) -> None:
    from gpuproxy.proxyd.client import ControlError
    from .. import criu
    try:
        client.call("record-criu", {"dir": os.path.abspath(image_dir), "record": rec})
    except ControlError as e:
        if "unknown command" not in str(e):
            raise
        criu.record_in_manifest(image_dir, rec)
