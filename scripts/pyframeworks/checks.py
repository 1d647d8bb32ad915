"""What every check script here shares (run by scripts/gpu_check_python.py,
natively and under gpuproxy, each as its own process): `check(name)` runs
the decorated function at once and records "ok" or one "FAIL: ..." line in
`results` (the traceback goes to stderr), so that one failing check does
not stop the others. The scripts print `results` as JSON at the end."""
import sys
import traceback

results = {}


def check(name):
    def deco(fn):
        try:
            fn()
            results[name] = "ok"
        except Exception as e:  # record and go on: one line per check
            results[name] = "FAIL: " + (f"{type(e).__name__}: {e}".splitlines() or ["?"])[0][:300]
            traceback.print_exc(file=sys.stderr)
        return fn
    return deco
