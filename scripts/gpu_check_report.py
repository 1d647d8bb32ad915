"""What the stand-alone GPU check scripts (gpu_check_restlat.py,
gpu_check_torch.py) do around their run(): a log that prints each line and
appends it to a file in the output folder, and the closing table of results
whose exit status says whether every row passed."""
from __future__ import annotations

import sys
from pathlib import Path


def appending_log(path: Path):
    """log(*parts): one line, printed at once and appended to path (a rerun
    into the same folder adds to what an earlier run wrote)."""
    def log(*parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        with open(path, "a") as f:
            f.write(line + "\n")
    return log


def report_and_exit(results: list[tuple[str, str]], log, passing=("PASS", "done", "SKIP")):
    """One line a (what, result) row; exits 0 when every result starts with
    one of `passing`, else 1."""
    for what, res in results:
        log(f"{res:6s} {what}")
    sys.exit(0 if all(r.startswith(passing) for _, r in results) else 1)
