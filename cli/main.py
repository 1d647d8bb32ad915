"""proxy-cli: drive gpuproxy.

    proxy-cli preload                       print the LD_PRELOAD value of the shim
    proxy-cli run [--endpoint E] -- CMD...  run a command under the shim
    proxy-cli run --checkpoint-dir DIR [--checkpoint-every S] [--keep N] -- CMD...
                                            the same, restored from DIR if it holds an image; SIGTERM
                                            checkpoints it into DIR (exit 143)
    proxy-cli status [--json]               sessions served by proxyd
    proxy-cli --pre-dump --pid PID --dir DIR [--gpu-only]
    proxy-cli --dump --pid PID --dir DIR [--leave-running] [--parent P] [--concurrent] [--gpu-only]
    proxy-cli --restore --dir DIR [--gpu-only] [--device-map 0=1]
                                            (whole-process: GPU state by proxyd, processes by CRIU;
                                            --gpu-only: the GPU state alone)
    proxy-cli inspect DIR [--json]          print and verify a checkpoint image
    proxy-cli migrate --pid PID --to-device N
    proxy-cli keygen [--out FILE] [--force]  make a CURVE client key pair for tcp endpoints (0600) and
                                            print the line proxyd's authorized_keys needs
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from gpuproxy.proxyd.core import protocol as P

from gpuproxy.proxyd.client import ControlClient, ControlError

from . import args as A
from .common import CHECKPOINT_TIMEOUT_S, QUICK_TIMEOUT_S, timeout_of  # noqa: F401  (tests read them here)




def _endpoint(a) -> str:
    return a.endpoint or P.endpoint_from_env()


def cmd_preload(a):
    from gpuproxy.interceptor import check_built, preload_value
    check_built()
    print(preload_value())
    return 0


def cmd_run(a):
    from gpuproxy.interceptor import check_built, preload_value
    check_built()
    cmd = a.command
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("proxy-cli run: no command given (proxy-cli run -- CMD ...)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if a.checkpoint_dir is None and (a.checkpoint_every is not None or a.keep is not None):
        print("proxy-cli run: --checkpoint-every and --keep need --checkpoint-dir", file=sys.stderr)
        return 2
    pre = preload_value()
    env["LD_PRELOAD"] = pre + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    if a.endpoint:
        env["GPUPROXY_ENDPOINT"] = a.endpoint
    if a.checkpoint_dir is not None:        # the preemption contract (proxyd/checkpoint/orchestrate/contract.py)
        from gpuproxy.proxyd.checkpoint.orchestrate import contract
        return contract.run(cmd, a.checkpoint_dir, _endpoint(a), env, every=a.checkpoint_every,
                            keep=2 if a.keep is None else a.keep, timeout_s=timeout_of(a, CHECKPOINT_TIMEOUT_S))
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        print(f"proxy-cli run: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_pool_forget(a):
    args = {} if a.uid is None else {"uid": a.uid}
    r = ControlClient(_endpoint(a), timeout_s=timeout_of(a)).call("pool-forget", args)
    print(f"dropped {r['dropped']} kept image(s) from the host pool")
    return 0


def cmd_status(a):
    st = ControlClient(_endpoint(a), timeout_s=timeout_of(a)).call("status")
    if a.json:
        print(json.dumps(st, indent=2))
        return 0
    devs = ", ".join(f"{d['index']}: {d['name']}" for d in st["devices"]) or "none"
    print(f"proxyd {st['version']} (pid {st['pid']}) at {st['endpoint']}, backend {st['backend']}, "
          f"driver {st['driver_version']}, devices [{devs}]")
    if not st["sessions"]:
        print("no sessions")
        return 0
    print(f"{'PID':>8}  {'WORKER':>8}  {'DEVICE MEM':>11}  {'CTX':>3} {'MOD':>4} {'FUNC':>5} {'STRM':>5} {'EVT':>5} "
          f"{'ALLOC':>6}  {'CALLS':>8}  {'STATE':<8} PROGRAM")
    for s in st["sessions"]:
        o = s["objects"]
        state = s.get("state") or ("frozen" if s["frozen"] else "running")
        worker = s.get("worker_pid") or "-"
        print(f"{s['pid']:>8}  {worker:>8}  {_fmt_bytes(s['device_memory']):>11}  {o['context']:>3} {o['module']:>4} "
              f"{o['function']:>5} {o['stream']:>5} {o['event']:>5} {o['allocation']:>6}  {s['calls']:>8}  "
              f"{state:<8} {s['exe']}" + (f"  ({s['why']})" if s.get("why") else ""))
    return 0


def cmd_keygen(a):
    """A client key pair for keyed tcp endpoints (gpuproxy/proxyd/core/curve.py):
    written 0600 (in the key directory unless --out says where), and the
    authorized_keys line that admits it, for proxyd's administrator."""
    import pwd

    from gpuproxy.proxyd.core import curve, keys
    try:
        path = a.out or os.path.join(keys.key_dir(create=True), curve.CLIENT_KEY_FILE)
        if a.force and os.path.exists(path):
            os.unlink(path)
        existed = os.path.exists(path)
        pub, _sec = curve.make_pair_file(path, "client key pair")
    except (curve.CurveError, keys.KeyError_, OSError) as e:
        print(f"proxy-cli keygen: {e}", file=sys.stderr)
        return 1
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    print(f"{'kept the existing' if existed else 'wrote a new'} client key pair {path} (mode 0600)", file=sys.stderr)
    if a.out:
        print(f"use it with GPUPROXY_CURVE_KEY_FILE={path}", file=sys.stderr)
    print("add this line to proxyd's authorized_keys (in proxyd's key directory) to admit it:", file=sys.stderr)
    print(f"{pub.decode()} {user}")
    return 0


def cmd_profile(a):
    """Names the functions of a shim call profile (GPUPROXY_PROFILE=FILE,
    interceptor/profile.c) and sorts them by time spent waiting."""
    try:
        from gpuproxy.proxyd._generated import NAMES
    except ImportError:
        NAMES = {}
    import glob
    merged: dict[int, list] = {}
    files = [a.file] + sorted(glob.glob(glob.escape(a.file) + ".*"))
    for path in files:
        try:
            with open(path) as f:
                for k, line in enumerate(f, 1):
                    if line.startswith("#") or not line.strip():
                        continue
                    try:
                        fid, calls, sync_calls, wait_us = line.split()
                        row = (int(fid), int(calls), int(sync_calls), float(wait_us))
                    except ValueError:
                        print(f"proxy-cli profile: {path} line {k} is not a call profile line "
                              f"(function-id calls sync-calls wait-us)", file=sys.stderr)
                        return 1
                    m = merged.setdefault(row[0], [0, 0, 0.0])
                    m[0] += row[1]
                    m[1] += row[2]
                    m[2] += row[3]
        except (OSError, UnicodeDecodeError) as e:
            print(f"proxy-cli profile: cannot read {path}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
            return 1
    rows = [(NAMES.get(fid, f"id {fid}"), c, s, w) for fid, (c, s, w) in merged.items()]
    if len(files) > 1:
        print(f"(merged {len(files)} files: {', '.join(files)})")
    rows.sort(key=lambda r: (-r[3], -r[1]))
    total_wait = sum(r[3] for r in rows)
    print(f"{'function':44} {'calls':>9} {'sync':>9} {'wait ms':>10} {'us/sync':>8}")
    for name, calls, sync_calls, wait_us in rows[:a.top]:
        per = wait_us / sync_calls if sync_calls else 0.0
        print(f"{name:44} {calls:9d} {sync_calls:9d} {wait_us / 1000:10.1f} {per:8.1f}")
    print(f"{'total':44} {sum(r[1] for r in rows):9d} {sum(r[2] for r in rows):9d} {total_wait / 1000:10.1f}")
    return 0


def _positive(v: str) -> float:
    try:
        f = float(v)
    except ValueError:
        f = -1.0
    if not f > 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {v!r}")
    return f


def _count(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a count of at least 1: {v!r}")
    return n


def build_parser():
    ap = A.OneLineParser(prog="proxy-cli", description="Drive gpuproxy: run programs under the shim, "
                                 "inspect sessions, checkpoint and restore their GPU state.")
    ap.add_argument("--endpoint", type=A.endpoint, help=f"proxyd endpoint (default $GPUPROXY_ENDPOINT or {P.DEFAULT_ENDPOINT})")
    ap.add_argument("--timeout", type=A.seconds, default=None,
                    help=f"seconds to wait for proxyd's answer (default {QUICK_TIMEOUT_S:g}; "
                         f"{CHECKPOINT_TIMEOUT_S:g} for pre-dump, dump, restore and migrate)")
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("preload", help="print the LD_PRELOAD value of the shim").set_defaults(fn=cmd_preload)
    r = sub.add_parser("run", help="run a command under the shim")
    r.add_argument("--checkpoint-dir", metavar="DIR",
                   help="the preemption contract: restore the job from DIR's latest image if it has one, else "
                        "start it; on SIGTERM checkpoint it into DIR and exit 143 (docs/cluster.md)")
    r.add_argument("--checkpoint-every", type=_positive, metavar="SECONDS",
                   help="also checkpoint every SECONDS while it runs (--leave-running)")
    r.add_argument("--keep", type=_count, metavar="N",
                   help="complete images kept in DIR (default 2)")
    r.add_argument("command", nargs=argparse.REMAINDER)
    r.set_defaults(fn=cmd_run)
    s = sub.add_parser("status", help="sessions served by proxyd")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_status)
    pf = sub.add_parser("pool-forget", help="drop the dump memory proxyd's host pool keeps for restores "
                                            "from memory (they read the image files then)")
    pf.add_argument("--uid", type=int, help="that user's (root or proxyd's user only; default: your own, or "
                                           "everyone's for them)")
    pf.set_defaults(fn=cmd_pool_forget)
    pr = sub.add_parser("profile", help="name and sort a shim call profile (written where GPUPROXY_PROFILE says)")
    pr.add_argument("file")
    pr.add_argument("--top", type=A.count, default=40, help="rows to print (default 40)")
    pr.set_defaults(fn=cmd_profile)
    k = sub.add_parser("keygen", help="make a CURVE client key pair for tcp endpoints")
    k.add_argument("--out", help="where to write it (default: curve-client.key in the key directory)")
    k.add_argument("--force", action="store_true", help="replace an existing key pair")
    k.set_defaults(fn=cmd_keygen)
    try:
        from . import checkpoint_cmds
        checkpoint_cmds.add_parsers(sub)
    except ImportError:
        pass
    return ap


def main(argv=None):
    return A.guarded(_main, argv)


def _main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    # `proxy-cli run PROG ARGS`: what follows the program is the program's
    argv, program = A.split_program(argv, ("run",))
    # pos_cli-style actions: proxy-cli --dump --pid PID --dir DIR ...; the
    # global options (--endpoint, --timeout) may stand anywhere among them
    for flag in ("--pre-dump", "--dump", "--restore"):
        if flag in argv:
            argv.remove(flag)
            glob, rest, i = [], [], 0
            while i < len(argv):
                opt = argv[i].split("=", 1)[0]
                if opt in ("--endpoint", "--timeout"):
                    n = 1 if "=" in argv[i] else 2
                    glob += argv[i:i + n]
                    i += n
                else:
                    rest.append(argv[i])
                    i += 1
            argv = glob + [flag[2:]] + rest
            break
    # the global options may come anywhere (proxy-cli --dump --pid P --dir D --timeout 30)
    front = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        opt = argv[i].split("=", 1)[0]
        if opt in ("--timeout", "--endpoint") and i > 0:
            n = 1 if "=" in argv[i] else 2
            front += argv[i:i + n]
            del argv[i:i + n]
            continue
        i += 1
    argv = front + argv + program
    ap = build_parser()
    a = ap.parse_args(argv)
    if not getattr(a, "fn", None):
        ap.print_help()
        return 2
    try:
        return a.fn(a) or 0
    except ControlError as e:
        print(f"proxy-cli: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
