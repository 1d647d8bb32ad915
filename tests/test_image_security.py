"""Images are private and untrusted (docs/security.md): modes and owners,
every manifest field validated before use, the keyed seal, and restores that
would leave a phantom session refused."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuproxy.proxyd.checkpoint.image import Image, ImageError, ImageWriter, encode_manifest
from conftest import short_dir
from test_image_format import CHUNK, META, MOD_A, rand, write_image  # noqa: F401

import numpy as np

BASE = 0x2000_0000_0000 + 3 * (1 << 40)


def make(path, key=None, owner=None, kind="dump"):
    rng = np.random.default_rng(1)
    w = ImageWriter(path, kind, META, chunk_size=CHUNK, seal_key=key, owner=owner)
    sha = w.add_module(MOD_A)
    w.add_chunk(BASE, rand(rng))
    sess = {"token": "abcdef0123456789-4242", "pid": 4242, "slot": 3, "last_seq": 1, "last_reply": None,
            "next_id": {"1": 2}, "async_error": None,
            "contexts": [{"id": 1, "device": 0, "primary": True, "flags": 0, "refcount": 1}],
            "modules": [{"id": 1, "ctx": 1, "size": len(MOD_A), "image": sha, "kernels": ["k"], "globals": {}}],
            "functions": [], "streams": [], "events": [],
            "arena": {"base": BASE, "size": 1 << 40, "chunks": [[BASE, CHUNK, 0, False]],
                      "allocations": [[BASE, CHUNK, CHUNK]]},
            "shm": {"staging": 0, "registered": []}, "channel": "/gpuproxy-abcdef0123456789-4242-chan",
            "addr_map": []}
    return w.finish(sess, {})


def test_modes(tmp_path):
    img = make(tmp_path / "img", key=os.urandom(32))
    img.close()
    root = tmp_path / "img"
    seen = 0
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))
        seen += 1
    assert seen >= 6      # dir, modules/, module file, memory.bin, chunks.idx, seal, manifest


def test_existing_directory_made_private(tmp_path):
    d = tmp_path / "open"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    make(d).close()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")
def test_owner_given_to_the_sessions_user(tmp_path):
    make(tmp_path / "img", key=os.urandom(32), owner=(65534, 65534)).close()
    root = tmp_path / "img"
    for p in [root, *root.rglob("*")]:
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (65534, 65534), p


# ------------------------------------------------------------- the schema

def edit(path: Path, change) -> None:
    """Changes the manifest body and recomputes its (unkeyed) digest, as an
    attacker can."""
    raw = (path / "manifest").read_bytes()
    body = json.loads(raw[raw.index(b"\n") + 1:raw.rindex(b"\nsha256 ")])
    change(body)
    (path / "manifest").write_bytes(encode_manifest(body))


def first_module_key(b):
    return next(iter(b["modules"]))


@pytest.mark.parametrize("change,field", [
    (lambda b: b["modules"].update({"../../../../etc/shadow": b["modules"].pop(first_module_key(b))}),
     "modules key '../../../../etc/shadow'"),
    (lambda b: b["session"]["modules"][0].update(image="../../../../etc/shadow"), "session.modules[0].image"),
    (lambda b: b["session"].update(slot="zero"), "session.slot"),
    (lambda b: b["session"].update(slot=63), "session.slot"),
    (lambda b: b["session"].update(channel="/../../etc/passwd"), "session.channel"),
    (lambda b: b["session"].update(token="../x"), "session.token"),
    (lambda b: b["session"]["arena"]["chunks"][0].__setitem__(1, -5), "session.arena.chunks[0][1]"),
    (lambda b: b["session"]["arena"].update(chunks=[[1, 2, 3]]), "session.arena.chunks[0]"),
    (lambda b: b["files"]["memory.bin"].update(size="big"), "files.memory.bin.size"),
    (lambda b: b.update(chunk_size=0), "chunk_size"),
    (lambda b: b.update(parent={"path": "p", "manifest_sha256": "nothex"}), "parent.manifest_sha256"),
    (lambda b: b["devices"][0].update(index=-1), "devices[0].index"),
    (lambda b: b.pop("memory"), "memory: missing"),
])
def test_bad_fields_named_in_one_line(tmp_path, change, field, capsys):
    make(tmp_path / "img").close()
    edit(tmp_path / "img", change)
    with pytest.raises(ImageError) as e:
        Image.open(tmp_path / "img")
    msg = str(e.value)
    assert "\n" not in msg and f"manifest field {field}" in msg, msg
    # inspect says the same, one line, and opens nothing outside the image
    from gpuproxy.cli.main import main
    assert main(["inspect", str(tmp_path / "img")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err


def test_restore_needs_every_session_field(tmp_path):
    from gpuproxy.proxyd.checkpoint.manifest_schema import SchemaError, validate_session
    img = make(tmp_path / "img")
    validate_session(img.session, strict=True)
    s = dict(img.session)
    del s["arena"]
    with pytest.raises(SchemaError, match="session.arena: missing"):
        validate_session(s, strict=True)
    img.close()


@pytest.mark.parametrize("text", ["abcdefghi", "ab=c", "abc", "a==="])
def test_base64_fields_must_decode(tmp_path, text):
    """The answer kept for a resend (last_reply) is base64: text that the
    alphabet allows but that cannot decode is refused by the schema, not by
    the restore's decoding half-way (test_fuzz found one)."""
    from gpuproxy.proxyd.checkpoint.manifest_schema import SchemaError, validate_session
    img = make(tmp_path / "img")
    s = dict(img.session, last_reply=["AAAA", text])
    img.close()
    with pytest.raises(SchemaError, match="last_reply"):
        validate_session(s, strict=True)


# ----------------------------------------------------------------- the seal

def test_seal(tmp_path):
    key, other = os.urandom(32), os.urandom(32)
    img = make(tmp_path / "img", key=key)
    ok, what = img.seal(key)
    assert ok and "sealed by this daemon's key" in what
    ok, what = img.seal(other)
    assert not ok and "foreign image: sealed with key" in what
    img.close()
    unsealed = make(tmp_path / "plain")
    ok, what = unsealed.seal(key)
    assert not ok and "no seal" in what
    unsealed.close()
    # a hand edit with a recomputed digest passes every integrity check but
    # not the seal
    edit(tmp_path / "img", lambda b: b["session"].update(last_seq=99))
    img = Image.open(tmp_path / "img")
    assert img.verify() == []
    ok, what = img.seal(key)
    assert not ok and "does not match" in what
    img.close()


def test_inspect_shows_foreign(tmp_path, capsys, monkeypatch):
    from gpuproxy.cli.main import main
    from gpuproxy.proxyd.core.keys import seal_key
    monkeypatch.setenv("GPUPROXY_KEY_DIR", str(tmp_path / "keys"))
    make(tmp_path / "mine", key=seal_key()).close()
    make(tmp_path / "theirs", key=os.urandom(32)).close()
    assert main(["inspect", str(tmp_path / "mine")]) == 0
    assert "seal       sealed by this daemon's key" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "theirs")]) == 0
    assert "seal       foreign image: sealed with key" in capsys.readouterr().out
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "keys" / "image-seal.key").stat().st_mode) == 0o600


def test_key_files_of_others_refused(tmp_path, monkeypatch):
    from gpuproxy.proxyd.core.keys import KeyError_, seal_key
    monkeypatch.setenv("GPUPROXY_KEY_DIR", str(tmp_path / "k"))
    seal_key()
    os.chmod(tmp_path / "k" / "image-seal.key", 0o644)
    with pytest.raises(KeyError_, match="mode 0600"):
        seal_key()


# -------------------------------------------- restores through the daemon

HOLDER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from wire import WireClient
c = WireClient(sys.argv[2]); c.hello(); ctx = c.context()
code, outs, _ = c.call("cuMemAlloc_v2", True, 4096, ctx=ctx)
c.call("cuMemcpyHtoD_v2", outs[0], b"k" * 4096, 4096, ctx=ctx)
print(outs[0], flush=True)
time.sleep(600)
"""


def ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=60).call(cmd, args)


def ctl_error(d, cmd, **args) -> str:
    from gpuproxy.proxyd.client import ControlError
    with pytest.raises(ControlError) as e:
        ctl(d, cmd, **args)
    return str(e.value)


@pytest.fixture
def short_tmp():
    with short_dir("gpx-sec") as d:
        yield d


def test_restore_refuses_foreign_and_dead(fresh_daemon, short_tmp):
    d = fresh_daemon(endpoint=f"ipc://{short_tmp}/p.sock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(Path(__file__).parent), d.endpoint],
                              stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()
        st = ctl(d, "status")
        pid = holder.pid
        assert [s["pid"] for s in st["sessions"]] == [pid]
        ctl(d, "dump", pid=pid, dir=str(short_tmp / "img"))
        img = Image.open(short_tmp / "img")
        assert img.session["start_time"] is not None and img.session["pidns"]
        img.close()
        # a copy edited by hand is foreign: refused, unless the caller insists
        shutil.copytree(short_tmp / "img", short_tmp / "edited")
        edit(short_tmp / "edited", lambda b: b["stats"].update(note="edited"))
        err = ctl_error(d, "restore", dir=str(short_tmp / "edited"))
        assert "foreign image" in err and "--allow-foreign" in err, err
        assert ctl(d, "status")["sessions"][0]["released"]
        ctl(d, "restore", dir=str(short_tmp / "edited"), allow_foreign=True)
        ctl(d, "dump", pid=pid, dir=str(short_tmp / "img2"))
    finally:
        holder.kill()
        holder.wait()
    # the process is gone: restoring it would make a phantom session
    deadline = time.monotonic() + 10
    while ctl(d, "status")["sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    err = ctl_error(d, "restore", dir=str(short_tmp / "img2"))
    assert "has exited" in err and str(pid) in err, err
    assert ctl(d, "status")["sessions"] == []
