"""What proxy-cli's command modules share (main.py, checkpoint_cmds.py)."""

# default --timeout: commands that proxyd answers at once, and checkpoint
# commands, which answer when the work is done (a dump of a large session
# takes minutes). An explicit --timeout is honoured exactly.
QUICK_TIMEOUT_S = 10.0
CHECKPOINT_TIMEOUT_S = 600.0


def timeout_of(a, default: float = QUICK_TIMEOUT_S) -> float:
    return default if getattr(a, "timeout", None) is None else a.timeout
