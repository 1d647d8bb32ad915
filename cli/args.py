"""What proxy-cli checks before it does anything, and how it fails.

The project's rule for the CLI: every error is one line on stderr and a
non-zero exit status, never a traceback; output piped into a reader that
stops early (`proxy-cli inspect DIR | head`) ends quietly. This module holds
the pieces cli/main.py hooks in:

 - OneLineParser: argparse with one-line usage errors (exit status 2);
 - the option types that validate values (a timeout must be a positive
   number of seconds, an endpoint ipc:// or tcp://HOST:PORT, a pid positive,
   a device map OLD=NEW pairs);
 - split_program: `proxy-cli run PROG ARGS...` keeps everything after the
   program for the program (its own --endpoint or --timeout included);
 - guarded: runs a command with the top-level guard (broken pipe, any
   unexpected exception as one line).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from gpuproxy.proxyd.core.protocol import endpoint_problem  # noqa: F401  (validated here, used by the control client too)

GLOBAL_OPTIONS = ("--endpoint", "--timeout")


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line (argparse prints the whole usage first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


# ------------------------------------------------------------------ option types

def seconds(text: str) -> float:
    """A timeout: a positive, finite number of seconds."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r}: a timeout must be a positive number of seconds")
    return v


def endpoint(text: str) -> str:
    why = endpoint_problem(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def _int(text: str, what: str, low: int) -> int:
    try:
        v = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return v


def pid(text: str) -> int:
    return _int(text, "a process id (a positive integer)", 1)


def pid_list(text: str) -> list[int]:
    out = [pid(t) for t in str(text).split(",") if t.strip()]
    if not out:
        raise argparse.ArgumentTypeError("a comma-separated list of process ids")
    return out


def device(text: str) -> int:
    return _int(text, "a device index (0 or more)", 0)


def count(text: str) -> int:
    return _int(text, "a positive integer", 1)


def device_map(text: str) -> dict:
    """OLD=NEW[,OLD=NEW]: {str(old): new}."""
    out = {}
    for part in filter(None, text.split(",")):
        old, eq, new = part.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"{part!r}: expected OLD=NEW (device indexes)")
        out[str(device(old.strip()))] = device(new.strip())
    return out


# ------------------------------------------------------------------ argv

def split_program(argv: list[str], subcommands) -> tuple[list[str], list[str]]:
    """(proxy-cli's own arguments, the program's) for `proxy-cli ... run
    [--] PROG ARGS...`: the program starts at the first word after `run`
    that is not one of proxy-cli's global options (or right after `--`).
    Other commands: (argv, [])."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.split("=", 1)[0] in GLOBAL_OPTIONS:
            i += 1 if "=" in a else 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        break
    if i >= len(argv) or argv[i] != "run" or "run" not in subcommands:
        return argv, []
    j = i + 1
    while j < len(argv):
        a = argv[j]
        if a == "--":
            return argv[:j], argv[j:]
        if a.split("=", 1)[0] in GLOBAL_OPTIONS:
            j += 1 if "=" in a else 2
            continue
        break
    return argv[:j], argv[j:]


# ------------------------------------------------------------------ the guard

def _quiet_stdout() -> None:
    """After the reader of our stdout went away: nothing more may be written
    there, not even by the interpreter's final flush."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def guarded(fn, *args) -> int:
    """Runs fn(*args) -> exit status with proxy-cli's top-level guard."""
    # a reader that stops early (| head) ends us as it ends every Unix tool,
    # silently; Python ignores SIGPIPE by default and raises BrokenPipeError
    # instead, and `run` would hand that disposition on to the program
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    except (ValueError, OSError, AttributeError):
        pass
    try:
        rc = fn(*args)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        _quiet_stdout()
        return 141          # 128 + SIGPIPE, what a shell reports for a writer its reader left
    except KeyboardInterrupt:
        return 130
    except SystemExit:
        raise
    except RecursionError:
        print("proxy-cli: input nested too deeply to be read", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 -- the CLI's rule: one line, never a traceback
        if os.environ.get("GPUPROXY_DEBUG"):
            raise
        what = str(e).splitlines()[0] if str(e) else ""
        print(f"proxy-cli: {type(e).__name__}{': ' + what if what else ''} (GPUPROXY_DEBUG=1 shows where)",
              file=sys.stderr)
        return 1
