"""proxyd's side of recording CRIU's part in a GPU image's manifest.

A whole-process image is a GPU image (written and sealed by proxyd) plus
CRIU's images; the manifest's CRIU record (criu.RECORD_KEY) says where they
are and that CRIU finished. Adding it changes the manifest's digest, so the
image must be sealed again with proxyd's image-seal key. Clients (proxy-cli
in a pod, the CRIU plugin under runc) do not hold that key, so they send the
record to proxyd (the `record-criu` control command, supervisor/record_criu.py),
which checks it here and seals it: no client needs proxyd's key.

Only an image that carries proxyd's own valid seal is changed (one that does
not would stay foreign anyway); the record is checked for shape and size,
and its folder must be relative to the image (CRIU's images live beside or
above the GPU image, never named by an absolute path).
"""
from __future__ import annotations

import json
import os

MAX_RECORD = 1 << 20      # bytes of JSON: a record's written_files list can be long, not this long


class RecordError(ValueError):
    pass


def validate(record) -> dict:
    """record if it has the shape criu.dump() gives (and the CRIU plugin's
    record); else RecordError saying what is wrong."""
    if not isinstance(record, dict):
        raise RecordError("the CRIU record must be a map")
    if len(json.dumps(record, default=str)) > MAX_RECORD:
        raise RecordError(f"the CRIU record is larger than {MAX_RECORD} bytes")
    d = record.get("dir")
    if not isinstance(d, str) or not d or "\0" in d or os.path.isabs(d) or len(d) > 4096:
        raise RecordError("the CRIU record's dir must be a folder relative to the image")
    if record.get("kind") not in ("dump", "pre-dump"):
        raise RecordError(f"the CRIU record's kind must be dump or pre-dump, not {record.get('kind')!r}")
    if not isinstance(record.get("complete"), bool):
        raise RecordError("the CRIU record's complete must be true or false")
    root = record.get("root_pid")
    pids = record.get("pids")
    if not isinstance(root, int) or isinstance(root, bool) or root <= 0:
        raise RecordError("the CRIU record's root_pid must be a positive pid")
    if not isinstance(pids, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pids):
        raise RecordError("the CRIU record's pids must be a list of pids")
    for k in ("size", "files"):
        v = record.get(k, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise RecordError(f"the CRIU record's {k} must be a count")
    if not isinstance(record.get("options", {}), dict):
        raise RecordError("the CRIU record's options must be a map")
    return record


def seal_record(image_dir: str, record) -> None:
    """Adds record to the manifest of the GPU image image_dir and seals it
    again with this proxyd's key; RecordError when the record is malformed
    or the image is not one this proxyd sealed."""
    from ..core import keys
    from . import criu
    from .image import Image, ImageError
    validate(record)
    try:
        key = keys.seal_key(create=False)
    except Exception as e:
        raise RecordError(f"this proxyd has no image-seal key ({e})") from None
    try:
        with Image.open(image_dir) as img:
            ok, why = img.seal(key)
    except (ImageError, OSError) as e:
        raise RecordError(f"{image_dir} is not a GPU image ({e})") from None
    if not ok:
        raise RecordError(f"{image_dir} was not sealed by this proxyd ({why})")
    criu.record_in_manifest(image_dir, record)
