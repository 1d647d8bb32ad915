"""proxyd records CRIU's part in a GPU image and seals it again itself
(checkpoint/criu_record.py, the `record-criu` control command), so clients
without proxyd's key (a pod's proxy-cli, the CRIU plugin under runc) need
none: the record's shape is checked, only an image this proxyd sealed is
changed, and it stays sealed afterwards. The whole flow runs in
test_contract.py, test_criu_plugin.py and test_cluster_podman.py (there
without the key folder in the container)."""
from __future__ import annotations

import pytest

from gpuproxy.proxyd.checkpoint import criu
from gpuproxy.proxyd.checkpoint.criu_record import RecordError, seal_record, validate
from gpuproxy.proxyd.checkpoint.image import Image, ImageWriter
from gpuproxy.proxyd.core import keys

REC = {"dir": "criu", "kind": "dump", "complete": True, "root_pid": 7, "pids": [7, 8], "size": 100, "files": 1,
       "options": {"shell_job": True}}


def image(path, key):
    w = ImageWriter(path, "dump", {"backend": "emu"}, seal_key=key)
    w.add_chunk(1 << 40, b"x" * 4096)
    w.finish({"pid": 7}).close()
    return path


@pytest.mark.parametrize("bad,why", [
    ([], "must be a map"),
    (dict(REC, dir="/etc"), "relative to the image"),
    (dict(REC, dir=""), "relative to the image"),
    (dict(REC, kind="restore"), "dump or pre-dump"),
    (dict(REC, complete="yes"), "true or false"),
    (dict(REC, root_pid=0), "positive pid"),
    (dict(REC, pids=[7, "8"]), "list of pids"),
    (dict(REC, size=-1), "must be a count"),
    (dict(REC, options=[]), "must be a map"),
    (dict(REC, written_files=["x" * 1024] * 1100), "larger than"),
])
def test_malformed_records_are_refused(bad, why):
    with pytest.raises(RecordError, match=why):
        validate(bad)


def test_proxyd_seals_the_record_of_its_own_image(tmp_path):
    key = keys.seal_key(create=True)
    img = image(tmp_path / "img", key)
    seal_record(str(img), dict(REC, dir="../.."))
    with Image.open(img) as again:
        assert again.manifest[criu.RECORD_KEY]["dir"] == "../.."
        assert again.seal(key)[0] and again.verify() == []


def test_an_image_another_key_sealed_is_refused_unchanged(tmp_path):
    keys.seal_key(create=True)
    img = image(tmp_path / "img", b"k" * 32)
    before = (img / "manifest").read_bytes()
    with pytest.raises(RecordError, match="not sealed by this proxyd"):
        seal_record(str(img), REC)
    assert (img / "manifest").read_bytes() == before
    with pytest.raises(RecordError, match="not a GPU image"):
        seal_record(str(tmp_path), REC)
