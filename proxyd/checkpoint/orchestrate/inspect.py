"""Reading and verifying a checkpoint image for a person or a tool
(`proxy-cli inspect`): structure always, every chunk's gp64 and every
module's sha256 on request, the process part CRIU saved, and whose seal it
carries. The report is data; the CLI formats it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import criu
from ..image import FLAG_GLOBAL, Image, ImageError  # noqa: F401  (Image, ImageError: the report's types)


class InspectError(Exception):
    """The image cannot be read at all (one line)."""


@dataclass
class Report:
    image: Image                 # open; the caller closes it (report.image.close())
    problems: list[str]
    process: dict                # criu.state(): present, complete, problem, record
    seal_ours: bool
    seal: str                    # whose seal, in words
    verified: bool               # chunk and module hashes checked


def open_image(path: str) -> Image:
    try:
        return Image.open(path)
    except ImageError as e:
        raise InspectError(str(e)) from None


def check(img: Image, verify: bool = True, progress: Callable[[int, int], None] | None = None) -> Report:
    """Verifies img (deep: re-hashes its data when verify) and reads its
    process part and seal."""
    problems = img.verify(deep=verify, progress=progress)
    proc = criu.state(img.path, img.manifest)
    if proc["problem"]:
        problems.append(f"process part: {proc['problem']}")
    ours, what = seal(img)
    return Report(img, problems, proc, ours, what, verify)


def seal(img: Image) -> tuple[bool, str]:
    """Whether the image (and its chain) carries this user's seal: the key of
    the user running inspect (core/keys.py; proxyd running as this user has
    the same key). Not having a key is not an error here: no key is created."""
    from ...core.keys import KeyError_, seal_key
    try:
        key = seal_key(create=False)
    except (OSError, KeyError_) as e:
        return False, f"foreign image: cannot read this user's seal key ({e})"
    except Exception as e:  # noqa: BLE001 -- inspect shows what it can
        return False, f"foreign image: {e}"
    return img.chain_seal(key)


def chunks(img: Image) -> list:
    """The image's chunk records, [] where its chunk index cannot be read."""
    try:
        return img.chunks()
    except ImageError:
        return []


def json_report(img: Image, problems: list[str], verified: bool) -> dict:
    refs = chunks(img)
    return {
        "path": img.path,
        "ok": not problems,
        "verified": verified,
        "problems": problems,
        "manifest_sha256": img.digest,
        "manifest": img.manifest,
        "chain": [{"path": a.path, "kind": a.kind, "created": a.manifest.get("created"),
                   "manifest_sha256": a.digest} for a in img.chain],
        "modules": img.modules(),
        "chunks": [{"addr": r.addr, "length": r.length, "flags": r.flags, "global": bool(r.flags & FLAG_GLOBAL),
                    "hash": f"{r.hash:016x}", "image": r.image, "offset": r.offset} for r in refs],
    }


def process_lines(proc: dict) -> list[str]:
    """The process part in words (criu.describe_record)."""
    return criu.describe_record(proc)
