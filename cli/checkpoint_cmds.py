"""proxy-cli's checkpoint-image commands.

    proxy-cli inspect DIR [--json] [--no-verify]

prints an image (header, parent chain, the process part saved by CRIU: its
size, pids and whether it is complete, the session's object graph, memory)
and verifies it: structure always, every chunk's gp64 and every module's
sha256 unless --no-verify. Exit status 0 when the image is sound, 1 when it
cannot be read or has any problem. The format is docs/image-format.md.

cli/main.py calls add_parsers(sub) with its argparse subparsers. The work
is done by the orchestration library (gpuproxy.proxyd.checkpoint.
orchestrate); this module parses arguments and prints.
"""
from __future__ import annotations

import json
import os
import sys
import time

from gpuproxy.proxyd.checkpoint.orchestrate import inspect as I
from gpuproxy.proxyd.checkpoint.orchestrate.inspect import Image, ImageError

from . import args as A
from .common import CHECKPOINT_TIMEOUT_S, timeout_of


def add_parsers(sub) -> None:
    i = sub.add_parser("inspect", help="print and verify a checkpoint image",
                       description="Print a checkpoint image (header, parent chain, object graph, memory) and "
                                   "verify it. Exit status 1 if it cannot be read or has any problem (an "
                                   "incomplete process part included).")
    i.add_argument("dir", help="image directory")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--no-verify", action="store_true",
                   help="structural checks only: do not re-hash chunk data and modules")
    i.set_defaults(fn=cmd_inspect)
    add_checkpoint_parsers(sub)


def add_checkpoint_parsers(sub) -> None:
    """pre-dump, dump, restore and migrate. Whole-process by default: proxyd
    saves the GPU state and CRIU the app's processes (proxyd/checkpoint/orchestrate/whole_process.py);
    --gpu-only sends proxyd's command alone. cli/main.py turns the
    pos_cli-style flags (--dump, --pre-dump, --restore) into these
    subcommand names."""
    gpu_only = "the GPU state alone (proxyd only, no CRIU): the process must stay alive until the restore"
    for name, what in (("pre-dump", "copy a session's memory while it runs (the start of an incremental chain)"),
                       ("dump", "checkpoint an app: its GPU state (proxyd) and its processes (CRIU)")):
        p = sub.add_parser(name, help=what)
        if name == "dump":
            who = p.add_mutually_exclusive_group(required=True)
            who.add_argument("--pid", type=A.pid, help="process whose session to checkpoint")
            who.add_argument("--job", type=A.pid, metavar="ROOT_PID",
                             help="a multi-rank job (NCCL): every gpuproxy client in ROOT_PID's process tree, as "
                                  "one consistent cut (all ranks at the same collective); without --gpu-only CRIU "
                                  "dumps the tree too")
            who.add_argument("--pids", type=A.pid_list, metavar="PID,PID,...",
                             help="a multi-rank job given by its ranks' pids (as --job); without --gpu-only CRIU "
                                  "dumps the tree of their common parent")
        else:
            p.add_argument("--pid", type=A.pid, required=True, help="process whose session to checkpoint")
        p.add_argument("--dir", required=True,
                       help="image directory; one that holds an image already continues its chain")
        p.add_argument("--parent", help="parent image elsewhere (incremental)")
        p.add_argument("--gpu-only", action="store_true", help=gpu_only)
        p.add_argument("--compress", metavar="zstd[:LEVEL]",
                       help="store the GPU memory zstd-compressed, chunk by chunk, in parallel (LEVEL -7..19, "
                            "default 1); chunks that do not shrink are stored as they are")
        if name == "dump":
            p.add_argument("--leave-running", action="store_true",
                           help="the app continues afterwards (a periodic checkpoint); default: the app is gone "
                                "(with --gpu-only: its GPU state is released and its CUDA calls wait for a restore)")
            p.add_argument("--concurrent", action="store_true",
                           help="stop the app only for a device-to-device copy, then write in the background "
                                "(implies --leave-running)")
            p.add_argument("--no-pre-dump", dest="pre_dump", action="store_const", const=False, default=None,
                           help="with --leave-running: no CRIU pre-dump before the park (by default, where the "
                                "kernel tracks dirty memory, CRIU pre-dumps the app as it runs so that the dump "
                                "made while it is parked writes only what changed)")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        p.set_defaults(fn=cmd_dump, kind=name)
    r = sub.add_parser("restore", help="restore an app from an image: GPU state, then its processes")
    r.add_argument("--dir", required=True, help="image directory")
    r.add_argument("--device-map", type=A.device_map, default={},
                   help="restore onto other GPUs: OLD=NEW[,OLD=NEW] (same model)")
    r.add_argument("--gpu-only", action="store_true",
                   help="restore the GPU state alone, for a process that is still alive (a --gpu-only dump)")
    r.add_argument("--rollback-files", action="store_true",
                   help="files the app had open for writing that grew since the dump (it ran on after a "
                        "--leave-running dump) are cut back to their size at the dump")
    r.add_argument("--allow-foreign", action="store_true",
                   help="restore an image that proxyd did not seal itself (made by another daemon or user, or "
                        "edited): only if you trust where it came from (docs/security.md)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_restore)
    m = sub.add_parser("migrate", help="move a session to another GPU")
    m.add_argument("--pid", type=A.pid, required=True)
    m.add_argument("--to-device", type=A.device, required=True)
    m.add_argument("--json", action="store_true")
    m.set_defaults(fn=cmd_migrate)


def _client(a):
    from gpuproxy.proxyd.core import protocol as P

    from gpuproxy.proxyd.client import ControlClient
    # proxyd answers when the checkpoint is done: a longer default wait, but
    # an explicit --timeout is honoured (and a daemon that dies ends it early)
    return ControlClient(a.endpoint or P.endpoint_from_env(), timeout_s=timeout_of(a, CHECKPOINT_TIMEOUT_S))


def _report(a, res: dict, lines: list[str]) -> int:
    if getattr(a, "json", False):
        print(json.dumps(res, indent=2))
    else:
        print("\n".join(lines))
    return 0


def _endpoint(a) -> str:
    from gpuproxy.proxyd.core import protocol as P
    return a.endpoint or P.endpoint_from_env()


def _gpu_lines(kind: str, pid: int, res: dict) -> list[str]:
    state = ("released; its CUDA calls wait for a restore" if res.get("released") else "running")
    return [f"{kind} of pid {pid} -> {res['path']}",
            f"  GPU: {fmt_bytes(res['bytes'])} in {res['chunks']} chunks, "
            f"{fmt_bytes(res.get('changed_bytes', res['bytes']))} written (the rest from parent images)",
            f"  app stopped {res.get('stop_ms', 0):.1f} ms; data in host memory after {res.get('host_ms', 0):.1f} ms; "
            f"image written in {res.get('write_ms', 0):.1f} ms; total {res['total_ms']:.1f} ms",
            f"  session {state}"]


def _stall_lines(res: dict) -> list[str]:
    """The whole-process dump's stall as the app lived it (its shim's
    figure, interceptor/park.c), and where the time went."""
    st = res.get("stages_ms") or {}
    app = res.get("app_stopped_ms")
    if app is None:
        head = f"  app stopped {res['stall_ms']:.1f} ms (from the park to its resume, measured by proxy-cli)"
    elif res.get("leave_running"):
        head = f"  app stopped {app:.1f} ms (its own threads: first held to all running again)"
    else:
        head = f"  app stopped {app:.1f} ms (its own threads: first held to the end of CRIU's dump; it is gone)"
    names = (("park", "park"), ("gpu_capture", "GPU state captured"), ("gpu_dump", "GPU dump"),
             ("criu_dump", "CRIU dump"), ("resume", "resume"))
    parts = [f"{n} {st[k]:.1f}" for k, n in names if k in st]
    out = [head, f"  stages (ms): {', '.join(parts)}"] if parts else [head]
    if "criu_pre_dump" in st:
        frozen = (f"{st['criu_pre_dump_frozen']:.1f} ms" if "criu_pre_dump_frozen" in st else
                  "only while it collected its pages")
        out.append(f"  before the park: CRIU pre-dump {st['criu_pre_dump']:.1f} ms (the app ran on, frozen by "
                   f"CRIU {frozen})")
    if "complete_after_resume" in st:
        out.append(f"  written while the app ran: image complete {st['complete_after_resume']:.1f} ms after it "
                   f"went on")
    return out


def _criu_line(rec: dict) -> str:
    return (f"  process: CRIU {rec['kind']} of pids {', '.join(map(str, rec['pids']))} -> {rec['dir']}/, "
            f"{fmt_bytes(rec['size'])} in {rec['ms']:.1f} ms")


def _notify(msg: str) -> None:
    print(f"proxy-cli: {msg}", file=sys.stderr)


def cmd_dump(a) -> int:
    from gpuproxy.proxyd.checkpoint.orchestrate import gpu as G
    from gpuproxy.proxyd.checkpoint.orchestrate import whole_process as W
    try:
        G.check_compress(getattr(a, "compress", None))
    except ValueError as e:
        print(f"proxy-cli {a.kind}: {e}", file=sys.stderr)
        return 2
    if getattr(a, "job", None) or getattr(a, "pids", None):
        return _dump_job(a)
    if not a.gpu_only:
        try:
            if a.kind == "dump":
                res = W.dump(_client(a), _endpoint(a), a.pid, a.dir, parent=a.parent,
                             leave_running=a.leave_running, concurrent=a.concurrent,
                             compress=getattr(a, "compress", None), notify=_notify, pre_dump=a.pre_dump)
            else:
                res = W.pre_dump(_client(a), _endpoint(a), a.pid, a.dir, parent=a.parent,
                                 compress=getattr(a, "compress", None))
        except W.WholeProcessError as e:
            print(f"proxy-cli {a.kind}: {e}", file=sys.stderr)
            return 1
        lines = _gpu_lines(a.kind, a.pid, res["gpu"])[:-1]
        if a.kind == "dump":
            lines[2:3] = _stall_lines(res)       # the worker's freeze alone is not what the app lived
        if res.get("criu"):
            lines.append(_criu_line(res["criu"]))
        if res.get("pre_dump"):
            lines.append(f"  process: CRIU pre-dump before the park -> {res['pre_dump']['dir']}/, "
                         f"{fmt_bytes(res['pre_dump']['size'])}; the parked dump wrote only what changed since")
        elif res.get("pre_dump_skipped") and res.get("leave_running"):
            lines.append(f"  process: no CRIU pre-dump: {res['pre_dump_skipped']}")
        if res.get("criu_skipped"):
            lines.append(f"  process: {res['criu_skipped']}")
        if a.kind == "dump":
            lines.append("  app running (resumed)" if res["leave_running"] else
                         f"  app gone (pid {a.pid}); restore with: proxy-cli --restore --dir {res['path']}")
        return _report(a, res, lines)
    try:
        res = G.checkpoint(_client(a), _endpoint(a), a.kind, a.pid, a.dir, parent=a.parent,
                           leave_running=getattr(a, "leave_running", False),
                           concurrent=getattr(a, "concurrent", False), compress=a.compress)
    except W.WholeProcessError as e:
        print(f"proxy-cli {a.kind}: {e}", file=sys.stderr)
        return 1
    return _report(a, res, _gpu_lines(a.kind, a.pid, res))


def _connect(a):
    from gpuproxy.proxyd.client import ControlClient
    ep = _endpoint(a)
    return lambda timeout_s: ControlClient(ep, timeout_s=timeout_s)


def _dump_job(a) -> int:
    from gpuproxy.proxyd.checkpoint.orchestrate import multirank as M
    if a.parent or a.concurrent:
        print("proxy-cli dump: --parent and --concurrent are not supported for a job", file=sys.stderr)
        return 2
    if not a.gpu_only:
        return _dump_job_whole(a)
    try:
        res = M.dump_job(_connect(a), a.dir, root=a.job, pids=a.pids, leave_running=a.leave_running,
                         compress=a.compress, timeout_s=timeout_of(a, CHECKPOINT_TIMEOUT_S))
    except M.JobError as e:
        print(f"proxy-cli dump: {e}", file=sys.stderr)
        return 1
    lines = [f"dump of a job of {len(res['ranks'])} ranks (pids {', '.join(map(str, res['ranks']))}) -> {res['path']}",
             f"  {res['communicators']} communicator(s) at one collective boundary after {res['hold_ms']:.1f} ms "
             f"({res['rounds']} rounds); dumps {res['dump_ms']:.1f} ms; GPU {fmt_bytes(res['bytes'])}",
             "  ranks released; their CUDA calls wait for: proxy-cli restore --gpu-only --dir " + res["path"]
             if res["released"] else "  ranks running (resumed)"]
    return _report(a, res, lines)


def _dump_job_whole(a) -> int:
    from gpuproxy.proxyd.checkpoint.orchestrate import multirank as M
    from gpuproxy.proxyd.checkpoint.orchestrate import multirank_wp as MW
    try:
        res = MW.dump_job_whole(_connect(a), _endpoint(a), a.dir, a.job, leave_running=a.leave_running,
                                compress=a.compress, timeout_s=timeout_of(a, CHECKPOINT_TIMEOUT_S), pids=a.pids)
    except M.JobError as e:
        print(f"proxy-cli dump: {e}", file=sys.stderr)
        return 1
    lines = [f"whole-process dump of a job of {len(res['ranks'])} ranks (pids {', '.join(map(str, res['ranks']))}) "
             f"-> {res['path']}",
             f"  {res['communicators']} communicator(s) at one collective boundary after {res['hold_ms']:.1f} ms; "
             f"GPU {fmt_bytes(res['bytes'])}",
             _criu_line(res["criu"]),
             *_job_stall_lines(res),
             "  job running (resumed)" if res["leave_running"] else
             f"  job gone (pid {res['root']}); restore with: proxy-cli restore --dir {res['path']}"]
    return _report(a, res, lines)


def _job_stall_lines(res: dict) -> list[str]:
    """A whole-process job dump's stall: the slowest rank's as its shim
    measured it, each rank's, and the coordinator's (job_stall.py)."""
    if res.get("stall_ms") is None:
        return []
    per = res.get("ranks_app_stopped_ms") or {}
    ranks = ", ".join(f"pid {p} {v:.1f} ms" if v is not None else f"pid {p} unknown" for p, v in per.items())
    end = "all running again" if res.get("leave_running") else "the end of CRIU's dump; gone"
    coord = f"proxy-cli saw {res['stall_ms']:.1f} ms from the start of the cut"
    if res.get("stall_from") == "app":
        return [f"  app stopped {res['app_stopped_ms']:.1f} ms (the slowest rank's own threads: first held at its "
                f"park to {end}); ranks: {ranks}; {coord}"]
    return [f"  job stopped {res['stall_ms']:.1f} ms (from the start of the cut, measured by proxy-cli: not every "
            f"rank's shim gave its own figure)" + (f"; ranks: {ranks}" if per else "")]


def _restore_job(a, path) -> int:
    from gpuproxy.proxyd.checkpoint.orchestrate import multirank as M
    from gpuproxy.proxyd.checkpoint.orchestrate import multirank_wp as MW
    if not a.gpu_only and (M.read_job_quiet(path) or {}).get("criu"):
        try:
            res = MW.restore_job_whole(_connect(a), path, a.device_map, allow_foreign=bool(a.allow_foreign),
                                       rollback_files=bool(a.rollback_files),
                                       timeout_s=timeout_of(a, CHECKPOINT_TIMEOUT_S))
        except M.JobError as e:
            print(f"proxy-cli restore: {e}", file=sys.stderr)
            return 1
        return _report(a, res, [f"restored a job of {len(res['ranks'])} ranks from {a.dir}: GPU state in "
                                f"{res['restore_ms']:.1f} ms, {res['communicators']} communicator(s) made again in "
                                f"{res['comm_ms']:.1f} ms, process tree (CRIU, pid {res['root']}) in "
                                f"{res['criu_ms']:.1f} ms; it continues"])
    try:
        res = M.restore_job(_connect(a), path, a.device_map, allow_foreign=bool(a.allow_foreign),
                            timeout_s=timeout_of(a, CHECKPOINT_TIMEOUT_S))
    except M.JobError as e:
        print(f"proxy-cli restore: {e}", file=sys.stderr)
        return 1
    lines = [f"restored a job of {len(res['ranks'])} ranks from {a.dir}: GPU state in {res['restore_ms']:.1f} ms, "
             f"{res['communicators']} communicator(s) made again in {res['comm_ms']:.1f} ms; it continues"]
    return _report(a, res, lines)


def cmd_restore(a) -> int:
    from gpuproxy.proxyd.checkpoint.orchestrate import gpu as G
    from gpuproxy.proxyd.checkpoint.orchestrate import multirank as M
    from gpuproxy.proxyd.checkpoint.orchestrate import whole_process as W
    dmap = a.device_map
    path = os.path.abspath(a.dir)
    _client(a).call("ping")          # an unreachable proxyd is the first thing said
    if M.is_job_image(path):
        return _restore_job(a, path)
    try:
        st = W.restore_state(path)
        if not a.gpu_only and st["present"]:
            res = W.restore(_client(a), _endpoint(a), path, dmap, st, rollback_files=a.rollback_files,
                            allow_foreign=bool(a.allow_foreign))
            g = res["gpu"]
            lines = [f"restored pid {res['pid']} from {a.dir}: GPU {fmt_bytes(g['bytes'])} in "
                     f"{g['total_ms']:.1f} ms (checks {g['check_ms']:.1f} ms), process (CRIU) in "
                     f"{res['criu_ms']:.1f} ms; it continues"]
            if res.get("overlapped"):
                lines.append(f"  GPU state and process restored side by side: {res['both_ms']:.1f} ms for both")
            elif res.get("sequential_why"):
                lines.append(f"  GPU state restored before the process: {res['sequential_why']}")
            return _report(a, res, lines + _restore_details(g))
    except W.WholeProcessError as e:
        print(f"proxy-cli restore: {e}", file=sys.stderr)
        return 1
    res = G.restore(_client(a), path, dmap, allow_foreign=bool(a.allow_foreign))
    lines = [f"restored the GPU state of pid {res['pid']} from {a.dir}: {fmt_bytes(res['bytes'])} in "
             f"{res['total_ms']:.1f} ms (checks {res['check_ms']:.1f} ms)"]
    return _report(a, res, lines + _restore_details(res))


def _restore_details(res: dict) -> list[str]:
    moved = res.get("moved_globals", [])
    lines = [f"  {res.get('replayed', 0)} recorded settings replayed; "
             f"{res.get('globals', 0)} __device__ variables checked, {len(moved)} moved"]
    if "modules_ms" in res:
        lines.append(f"  {res.get('modules', 0)} modules ({res.get('modules_mode')}) in {res['modules_ms']:.1f} ms: "
                     f"driver loads {res.get('modules_load_ms', 0):.1f} ms, reading and parsing "
                     f"{res.get('modules_prep_ms', 0):.1f} ms over threads, kernel lookups "
                     f"{res.get('functions_ms', 0):.1f} ms")
    for g in moved[:MAX_MOVED_SHOWN]:
        lines.append(f"  WARNING: __device__ variable {g['name']} moved {g['old']:#x} -> {g['new']:#x}: API calls "
                     f"with its old address are translated; copies of that address in device memory "
                     f"(pointer tables) or in kernel arguments are not")
    if len(moved) > MAX_MOVED_SHOWN:
        lines.append(f"  WARNING: and {len(moved) - MAX_MOVED_SHOWN} more __device__ variables moved "
                     f"(the proxyd log names each)")
    for why in res.get("moved_globals_why", []):
        lines.append(f"  why: {why}")
    return lines


MAX_MOVED_SHOWN = 20          # the rest are counted (a PyTorch process has thousands)


def cmd_migrate(a) -> int:
    from gpuproxy.proxyd.checkpoint.orchestrate import gpu as G
    res = G.migrate(_client(a), a.pid, a.to_device)
    return _report(a, res, [f"pid {a.pid} moved to device {a.to_device}; app stopped {res['stop_ms']:.1f} ms"])


# ------------------------------------------------------------------ format

def fmt_bytes(n) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


_ADDR_KEYS = {"addr", "address", "base", "start", "ptr", "dptr", "va"}
_WIDTH = 48


def _clip(s: str, width: int = _WIDTH) -> str:
    return s if len(s) <= width else s[:width - 3] + "..."


def cell(key, v) -> str:
    """One value of the session dict, short and readable."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return hex(v) if (str(key).lower() in _ADDR_KEYS or v >= 1 << 32) and v >= 0 else str(v)
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, str):
        if len(v) == 64 and all(c in "0123456789abcdef" for c in v):
            return v[:12]            # a sha256 (module image key)
        return _clip(v)
    if isinstance(v, list):
        if all(not isinstance(x, (list, dict)) for x in v):
            return _clip(", ".join(cell(key, x) for x in v)) if v else "-"
        return _clip(json.dumps(v, separators=(",", ":")))
    if isinstance(v, dict):
        if not v:
            return "-"
        if all(not isinstance(x, (list, dict)) for x in v.values()):
            return _clip(", ".join(f"{k}={cell(k, x)}" for k, x in v.items()))
        return _clip(", ".join(str(k) for k in v))
    return _clip(repr(v))


def table(rows: list[list[str]], head: list[str], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    out = [indent + "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    for r in rows:
        out.append(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return out


# column names of the lists the engine's session dict is known to hold
_COLUMNS = {
    "allocations": ["addr", "size", "extent"],
    "chunks": ["start", "size", "device", "small"],
}


_FIRST_COLS = ["id", "ctx", "device", "module", "name", "size"]
# order of the session's sections (others follow alphabetically)
_SECTIONS = ["contexts", "modules", "functions", "streams", "events", "arena"]


def list_table(name: str, items: list, indent: str = "  ") -> list[str]:
    """A list from the session dict as a table: dicts by key, lists by position."""
    if not items:
        return []
    if all(isinstance(x, dict) for x in items):
        keys: list[str] = []
        for x in items:
            keys += [k for k in x if k not in keys]
        keys.sort(key=lambda k: (_FIRST_COLS.index(k) if k in _FIRST_COLS else len(_FIRST_COLS)))
        return table([[cell(k, x.get(k)) for k in keys] for x in items], keys, indent)
    if all(isinstance(x, (list, tuple)) for x in items):
        width = max(len(x) for x in items)
        head = list(_COLUMNS.get(name, []))[:width]
        head += [f"#{i}" for i in range(len(head), width)]
        return table([[cell(head[i], x[i]) if i < len(x) else "" for i in range(width)] for x in items], head, indent)
    return [indent + cell(name, items)]


def session_lines(sess: dict) -> list[str]:
    out = []
    scalars = [(k, v) for k, v in sess.items() if not isinstance(v, (list, dict))]
    if scalars:
        out.append("  " + "  ".join(f"{k}: {cell(k, v)}" for k, v in scalars))
    order = sorted(sess, key=lambda k: (_SECTIONS.index(k) if k in _SECTIONS else len(_SECTIONS), k))
    for k in order:
        v = sess[k]
        if isinstance(v, list):
            out.append(f"{k} ({len(v)})")
            out += list_table(k, v)
        elif isinstance(v, dict):
            inner_scalars = [(ik, iv) for ik, iv in v.items() if not isinstance(iv, list)]
            inner_lists = [(ik, iv) for ik, iv in v.items() if isinstance(iv, list)]
            line = "  ".join(f"{ik}: {cell(ik, iv)}" for ik, iv in inner_scalars)
            out.append(f"{k}" + (f"  {line}" if line else ""))
            for ik, iv in inner_lists:
                if iv and all(isinstance(x, (list, dict)) for x in iv):
                    out.append(f"  {ik} ({len(iv)})")
                    out += list_table(ik, iv, "    ")
                else:
                    out.append(f"  {ik}: {cell(ik, iv)}")
    return out


def header_lines(img: Image) -> list[str]:
    m = img.manifest
    out = [f"image      {img.path}",
           f"format     {m['format_version']}, chunk hash {m.get('hash')}, chunk size {fmt_bytes(m.get('chunk_size'))}",
           f"kind       {m['kind']}, created {m.get('created')}",
           f"gpuproxy   {m.get('gpuproxy_version')}",
           f"backend    {cell('backend', m.get('backend'))}, driver {cell('driver', m.get('driver_version'))}"]
    devs = m.get("devices") or []
    for i, d in enumerate(devs):
        extra = [fmt_bytes(d["total_memory"])] if d.get("total_memory") else []
        extra += [d["uuid"]] if d.get("uuid") else []
        out.append(f"{'devices' if i == 0 else '':<10} {d.get('index')}: {d.get('name')}"
                   + (f" ({', '.join(extra)})" if extra else ""))
    if not devs:
        out.append("devices    none recorded")
    z = m.get("compression")
    if isinstance(z, dict):
        ratio = (f", {z['bytes'] / z['stored_bytes']:.2f}x" if z.get("bytes") and z.get("stored_bytes") else "")
        out.append(f"compressed {z.get('codec')} level {z.get('level')}: {z.get('chunks')} chunks, "
                   f"{fmt_bytes(z.get('bytes'))} stored in {fmt_bytes(z.get('stored_bytes'))}{ratio}")
    if img.parent is None:
        out.append("parent     none (full image)")
    else:
        out.append(f"parent     {m['parent']['path']} (manifest sha256 {m['parent']['manifest_sha256'][:16]}...)")
        for k, a in enumerate(img.chain[1:], 1):
            mem = a.manifest.get("memory") or {}
            out.append(f"  ancestor {k}: {a.path}  {a.kind}, created {a.manifest.get('created')}, stores "
                       f"{mem.get('stored_chunks')} chunks ({fmt_bytes(mem.get('stored_bytes'))})")
    return out


def memory_lines(img: Image) -> list[str]:
    mem = img.manifest.get("memory") or {}
    out = [f"memory     {mem.get('chunks')} chunks, {fmt_bytes(mem.get('bytes'))}: "
           f"{mem.get('stored_chunks')} stored here ({fmt_bytes(mem.get('stored_bytes'))}), "
           f"{mem.get('referenced_chunks')} in ancestors ({fmt_bytes(mem.get('referenced_bytes'))}); "
           f"{mem.get('global_chunks')} of them __device__ variables and CUDA arrays "
           f"({fmt_bytes(mem.get('global_bytes'))})"]
    try:
        refs = img.chunks()
    except ImageError:
        return out
    per: dict[int, list[int]] = {}
    for r in refs:
        c = per.setdefault(r.image, [0, 0])
        c[0] += 1
        c[1] += r.length
    for k in sorted(per):
        if k:
            out.append(f"  from ancestor {k}: {per[k][0]} chunks ({fmt_bytes(per[k][1])})")
    mods = img.modules()
    if mods:
        out.append(f"module files ({len(mods)})")
        rows = [[sha[:12], str(e["size"]), "here" if e["image"] == 0 else f"ancestor {e['image']}"]
                for sha, e in sorted(mods.items())]
        out += table(rows, ["sha256", "size", "stored"])
    stats = img.manifest.get("stats") or {}
    if stats:
        out.append("stats      " + "  ".join(f"{k}={cell(k, v)}" for k, v in stats.items()))
    return out


# ----------------------------------------------------------------- inspect

def _progress_printer():
    if not sys.stderr.isatty():
        return None
    last = [0.0]

    def progress(done, total):
        now = time.monotonic()
        if now - last[0] > 0.2 or done == total:
            last[0] = now
            sys.stderr.write(f"\rverifying {fmt_bytes(done)} of {fmt_bytes(total)}   ")
            if done == total:
                sys.stderr.write("\r" + " " * 50 + "\r")
            sys.stderr.flush()
    return progress


def cmd_inspect(a) -> int:
    try:
        img = I.open_image(a.dir)
    except I.InspectError as e:
        if a.json:
            print(json.dumps({"path": a.dir, "ok": False, "problems": [str(e)]}, indent=2))
        else:
            print(f"proxy-cli inspect: {e}", file=sys.stderr)
        return 1
    try:
        progress = None if a.json else _progress_printer()
        rep = I.check(img, verify=not a.no_verify, progress=progress)
        problems, proc, ours, seal = rep.problems, rep.process, rep.seal_ours, rep.seal
        if a.json:
            out = I.json_report(img, problems, not a.no_verify)
            out["seal"] = {"ours": ours, "what": seal}
            out["process"] = proc
            print(json.dumps(out, indent=2))
            return 1 if problems else 0
        lines = header_lines(img)
        lines.append(f"seal       {seal}")
        lines += I.process_lines(proc)
        lines.append("session")
        lines += session_lines(img.session)
        lines += memory_lines(img)
        print("\n".join(lines))
        mem = img.manifest.get("memory") or {}
        if problems:
            for p in problems:
                print(f"PROBLEM: {p}")
            print(f"checksums: {len(problems)} problem{'s' if len(problems) > 1 else ''}")
            return 1
        if a.no_verify:
            print(f"checksums: not verified (--no-verify); structure OK ({mem.get('chunks')} chunks)")
        else:
            print(f"checksums: OK ({mem.get('chunks')} chunks, {(mem.get('bytes') or 0) / 2**20:.1f} MiB)")
        return 0
    finally:
        img.close()
