"""`.ci/run` is the README's test command (issue 26): it runs the same
pytest command the README names, with -rs so that skip reasons are listed,
and it says what it is doing before each step (no minutes of silence while
pip compiles the shim)."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_readme_and_ci_run_the_same_tests():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    readme = (REPO / "README.md").read_text()
    run = [ln.strip() for ln in ci if ln.strip().startswith("python3 -m pytest")]
    assert len(run) == 1, run
    assert "-rs" in run[0].split()
    assert f"`{run[0]}`" in readme.replace("\n", " "), f"README does not name {run[0]!r}"


def test_ci_announces_every_step():
    lines = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    steps = [i for i, ln in enumerate(lines)
             if re.match(r"(python3 -m (pip install|pytest)|scripts/install-(criu|pycuda))", ln)]
    assert len(steps) >= 4, lines
    for i in steps:
        before = lines[max(0, i - 3):i]
        assert any(ln.startswith('echo "CI:') for ln in before), f"no announcement before {lines[i]!r}"
        assert " -q " not in f" {lines[i]} " or lines[i].startswith("python3 -m pytest"), lines[i]
