"""scripts/suite_compare.py, the runner that compares a third-party test
suite natively and proxied test by test (issue 26), on two tiny suites made
here: a test that passes natively and fails "proxied" is a regression; a
run stopped for time still compares what both modes finished and says so;
a suite where nothing ran is a failure, not a pass. The "proxied" mode here
is only another environment (no GPU needed)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import suite_compare  # noqa: E402

import pytest  # noqa: E402

SUITE = '''
import os, time, pytest
def test_same():
    assert True
@pytest.mark.parametrize("k", [1, 2])
def test_param(k):
    assert True
def test_breaks_proxied():
    assert os.environ.get("FAKE_PROXIED") != "1"
def test_skipped():
    pytest.skip("machine")
def test_slow_proxied():
    if os.environ.get("FAKE_PROXIED") == "1" and os.environ.get("FAKE_SLOW") == "1":
        time.sleep(60)
'''


def proxied(env):
    env["FAKE_PROXIED"] = "1"
    return env


@pytest.mark.slow
def test_regressions_found_and_partial_runs_compared(tmp_path):
    tdir = tmp_path / "suite"
    tdir.mkdir()
    (tdir / "test_a.py").write_text(SUITE)
    (tdir / "test_b.py").write_text("def test_b():\n    assert True\n")
    (tdir / "test_c.py").write_text("import no_such_module_here\n")
    out = tmp_path / "out"
    out.mkdir()
    lines = []
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    # test_c.py does not import: the other files of the run still count
    rows = suite_compare.compare(lines.append, out, "fake", tdir, ["test_a.py", "test_b.py", "test_c.py"], proxied,
                                 env, 60, together=True)
    assert rows == [("fake 3 files proxied >= native", "FAIL (1)")], rows
    rec = json.loads((out / "fake.json").read_text())["test_a.py test_b.py test_c.py"]
    assert rec["pass_natively_not_proxied"] == ["test_a.py::test_breaks_proxied"]
    assert rec["native"] == {"passed": 6, "failed": 0, "skipped": 1}
    assert rec["proxied"] == {"passed": 5, "failed": 1, "skipped": 1}
    # one file per run; the proxied run stops at the time limit: what both finished is compared
    rows = suite_compare.compare(lines.append, out, "slow", tdir, ["test_b.py", "test_a.py"], proxied,
                                 dict(env, FAKE_SLOW="1"), 8)
    assert rows[0] == ("slow test_b.py proxied >= native", "PASS"), rows
    assert rows[1][1].startswith("FAIL (1) (partial: ") and "compared" in rows[1][1], rows
    rec = json.loads((out / "slow.json").read_text())["test_a.py"]
    assert rec["timed_out"] == ["proxied"] and rec["compared"] == 5, rec
    # nothing collected is a failure
    rows = suite_compare.compare(lines.append, out, "none", tdir, ["test_missing.py"], proxied, env, 30)
    assert rows == [("none test_missing.py", "FAIL (no test ran)")], rows
