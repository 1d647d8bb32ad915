"""proxy-cli never shows a traceback (the developers' guide): every error is
one line on stderr and a non-zero exit status, whatever the input (bad
options, a missing daemon, a missing file, hostile images); output piped
into a reader that stops early ends quietly; `proxy-cli run PROG ARGS`
leaves the program's arguments alone.

Every subcommand is run here with bad input (cli/args.py is the guard)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_image_security import make  # noqa: E402


def cli(proxy_cli, *args, env=None, **kw):
    e = dict(os.environ)
    e.pop("GPUPROXY_DEBUG", None)
    e.update(env or {})
    return subprocess.run([*proxy_cli, *args], capture_output=True, text=True, timeout=60, env=e, **kw)


def one_line_failure(r, *words):
    """r failed with exactly one line on stderr, no traceback, naming words."""
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A sound sealed image, one whose manifest is deeply nested JSON (with
    a correct digest), and one whose seal holds a non-ASCII byte."""
    from gpuproxy.proxyd.core.keys import seal_key
    root = tmp_path_factory.mktemp("cli-errors")
    key = seal_key(create=True)
    good = root / "good"
    make(good, key=key)
    nested = root / "nested"
    make(nested, key=key)
    body = ("[" * 200000 + "]" * 200000).encode()
    first = (good / "manifest").read_bytes().split(b"\n", 1)[0]
    (nested / "manifest").write_bytes(first + b"\n" + body + b"\nsha256 " +
                                      hashlib.sha256(body).hexdigest().encode() + b"\n")
    badseal = root / "badseal"
    make(badseal, key=key)
    seal = next(p for p in badseal.iterdir() if p.name.startswith("seal"))
    raw = bytearray(seal.read_bytes())
    raw[-3] = 0xE9                       # inside the MAC: a non-ASCII byte
    seal.write_bytes(bytes(raw))
    return {"good": str(good), "nested": str(nested), "badseal": str(badseal), "root": root}


NO_DAEMON = "ipc:///tmp/gpuproxy-test-nodaemon-here.sock"


def test_bad_global_options_are_refused(proxy_cli):
    for t in ("0", "-1", "nan", "inf", "soon"):
        one_line_failure(cli(proxy_cli, "--timeout", t, "status"), "--timeout")
    one_line_failure(cli(proxy_cli, "--endpoint", "bogus", "status"), "bad endpoint 'bogus'")
    one_line_failure(cli(proxy_cli, "--endpoint", "tcp://host", "status"), "tcp://HOST:PORT")
    one_line_failure(cli(proxy_cli, "status", env={"GPUPROXY_ENDPOINT": "bogus"}), "bad endpoint")
    one_line_failure(cli(proxy_cli, "--dump", "--pid", "1", "--dir", "/tmp/x", "--timeout", "0"), "--timeout")
    one_line_failure(cli(proxy_cli, "no-such-command"), "invalid choice")


@pytest.mark.parametrize("args,words", [
    (["status"], ["no proxyd at"]),
    (["status", "--json"], ["no proxyd at"]),
    (["--dump", "--pid", "0", "--dir", "/tmp/x"], ["--pid"]),
    (["--dump", "--pid", "-5", "--dir", "/tmp/x"], ["--pid"]),
    (["--dump", "--pid", "1", "--dir", "/tmp/x"], ["no proxyd at"]),
    (["--dump", "--pid", "1", "--dir", "/tmp/x", "--gpu-only"], ["no proxyd at"]),
    (["--dump", "--pid", "1", "--dir", "/tmp/x", "--compress", "lz4"], ["lz4"]),
    # a job's whole-process form, by its root or its ranks (docs/multigpu.md)
    (["dump", "--job", "1", "--dir", "/tmp/x"], ["no proxyd at"]),
    (["--dump", "--pids", "1,2", "--dir", "/tmp/x"], ["no proxyd at"]),
    (["--pre-dump", "--pid", "abc", "--dir", "/tmp/x"], ["--pid"]),
    (["--pre-dump", "--pid", "1", "--dir", "/tmp/x"], ["no proxyd at"]),
    (["--restore", "--dir", "/nonexistent"], ["no proxyd at"]),
    (["--restore", "--dir", "/tmp", "--device-map", "0"], ["OLD=NEW"]),
    (["--restore", "--dir", "/tmp", "--device-map", "a=b"], ["device index"]),
    (["--restore", "--dir", "/tmp", "--device-map", "0=-1"], ["device index"]),
    (["migrate", "--pid", "1", "--to-device", "-1"], ["device index"]),
    (["migrate", "--pid", "1", "--to-device", "1"], ["no proxyd at"]),
    (["profile", "/nonexistent"], ["/nonexistent"]),
    (["profile", "/etc/hostname", "--top", "0"], ["--top"]),
    (["inspect", "/nonexistent"], ["/nonexistent"]),
    (["inspect"], ["dir"]),
    (["run"], ["no command"]),
    (["run", "--", "/nonexistent/program"], ["/nonexistent/program"]),
    (["keygen", "--out", "/nonexistent/dir/key"], ["keygen"]),
])
def test_every_command_fails_in_one_line(proxy_cli, args, words):
    one_line_failure(cli(proxy_cli, "--endpoint", NO_DAEMON, *args), *words)


def test_profile_of_a_file_that_is_not_a_profile(proxy_cli, tmp_path):
    p = tmp_path / "prof"
    p.write_text("1 2 3\nnot a profile\n")
    one_line_failure(cli(proxy_cli, "profile", str(p)), "not a call profile line")
    p.write_bytes(b"\xff\xfe\x00garbage")
    one_line_failure(cli(proxy_cli, "profile", str(p)), "cannot read")


def test_hostile_images_are_refused_in_one_line(proxy_cli, images):
    assert cli(proxy_cli, "inspect", images["good"]).returncode == 0
    one_line_failure(cli(proxy_cli, "inspect", images["nested"]), "nested too deeply")
    r = cli(proxy_cli, "inspect", "--json", images["nested"])
    assert r.returncode == 1 and "Traceback" not in r.stderr and "nested too deeply" in r.stdout
    r = cli(proxy_cli, "inspect", images["badseal"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "foreign image" in r.stdout and "is not a seal" in r.stdout


def test_hostile_images_are_refused_by_restore(proxy_cli, images, fresh_daemon):
    d = fresh_daemon()
    for name, words in (("nested", ["nested too deeply"]), ("badseal", ["seal"]), ("good", [])):
        r = cli(proxy_cli, "--endpoint", d.endpoint, "--restore", "--gpu-only", "--dir", images[name])
        line = one_line_failure(r, *words)
        assert "restore" in line
        r = cli(proxy_cli, "--endpoint", d.endpoint, "--restore", "--dir", images[name])
        one_line_failure(r, *words)
    assert "Traceback" not in d.log()


def test_output_into_a_closed_pipe_ends_quietly(proxy_cli, images):
    """`proxy-cli inspect DIR | head -n 1`: the reader is gone before
    proxy-cli writes; it ends like any Unix tool (SIGPIPE), silently."""
    for args in (["inspect", images["good"]], ["--help"], ["inspect", "--json", images["good"]]):
        p = subprocess.Popen([*proxy_cli, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.close()                  # the reader leaves at once
        err = p.stderr.read().decode()
        rc = p.wait(60)
        p.stderr.close()
        assert "Traceback" not in err and "BrokenPipe" not in err, err
        assert rc in (0, -13, 141), (rc, err)
    r = subprocess.run(["bash", "-c", f"set -o pipefail; {' '.join(proxy_cli)} inspect {images['good']} | head -n 1"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("image ") and "Traceback" not in r.stderr, r.stderr


def test_run_leaves_the_programs_arguments_alone(proxy_cli):
    r = cli(proxy_cli, "run", "/bin/echo", "a", "--endpoint", "X", "--timeout", "0", "--dump")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "a --endpoint X --timeout 0 --dump\n"
    r = cli(proxy_cli, "run", "--endpoint", "ipc:///tmp/elsewhere.sock", "--", "sh", "-c",
            'echo "$GPUPROXY_ENDPOINT" "$@"', "sh", "--endpoint", "Y")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ipc:///tmp/elsewhere.sock --endpoint Y\n"
    r = cli(proxy_cli, "--endpoint", "ipc:///tmp/e2.sock", "run", "sh", "-c", 'echo "$GPUPROXY_ENDPOINT"')
    assert r.stdout == "ipc:///tmp/e2.sock\n", r.stderr
    # the program gets SIGPIPE's default disposition, as from a shell
    r = cli(proxy_cli, "run", "sh", "-c", "grep SigIgn /proc/self/status")
    assert int(r.stdout.split()[1], 16) & (1 << 12) == 0, r.stdout
