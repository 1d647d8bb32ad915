"""Which process tree a whole-process job checkpoint named by its ranks'
pids dumps (`proxy-cli dump --pids A,B,...` without --gpu-only; issue 22,
docs/multigpu.md, "The whole-process form").

CRIU dumps and restores one process tree (`criu dump --tree ROOT` takes
every descendant of ROOT), and only with the launcher in the same dump do
the ranks come back as its children with the pipes and sockets between
them (multirank_wp.py). So the pids are dumped as the tree of their
*common parent*: the nearest process that is an ancestor of (or one of)
every given pid. Refused, each with one line saying why and what to do
instead:

- pids whose only common ancestor is init (pid 1) or that have none (a
  pid of another namespace): there is no tree to dump short of the whole
  system;
- a common parent that is an ancestor of the caller (this proxy-cli): CRIU
  would dump the process that runs it, and the caller's shell or runner
  with it;
- a common tree that holds gpuproxy clients the pids do not name: their
  processes would be dumped without their GPU state (name them too, or
  --job ROOT, which takes every client of the tree).

Reads /proc only; nothing is touched, so a refusal leaves the job running.
"""
from __future__ import annotations

import os
from typing import Callable

from ...core import procinfo
from .multirank import JobError, job_ranks


def parent(pid: int) -> int:
    """The parent pid of pid (/proc/PID/stat: the field after the command's
    closing parenthesis and the state); 0 when it has none or is gone."""
    rest = procinfo.stat_fields(pid)
    try:
        return int(rest[1])
    except (IndexError, TypeError, ValueError):
        return 0


def ancestry(pid: int) -> list[int]:
    """pid, its parent, and so on up to the namespace's top (parent 0)."""
    out = [int(pid)]
    while len(out) < 4096:
        p = parent(out[-1])
        if p <= 0 or p in out:
            break
        out.append(p)
    return out


def common_parent(pids: list[int]) -> int:
    """The nearest process that is an ancestor of, or one of, every pid;
    0 when there is none."""
    chains = [ancestry(p) for p in pids]
    if any(not os.path.exists(f"/proc/{p}") for p in pids):
        gone = [p for p in pids if not os.path.exists(f"/proc/{p}")]
        raise JobError(f"no process {', '.join(map(str, gone))}")
    others = [set(c) for c in chains[1:]]
    for p in chains[0]:
        if all(p in s for s in others):
            return p
    return 0


def root_of_pids(connect: Callable, pids: list[int]) -> int:
    """The root of the tree a whole-process dump of the ranks pids takes
    (module docstring); raises JobError naming what is refused."""
    pids = sorted({int(p) for p in pids})
    ranks = job_ranks(connect, pids=pids)          # each must be a client of this proxyd
    root = common_parent(ranks)
    listed = ", ".join(map(str, ranks))
    if root <= 1:
        raise JobError(f"pids {listed} have no common parent below init: CRIU dumps one process tree, so a "
                       f"whole-process dump of a job needs its ranks under one launcher (dump them with --gpu-only, "
                       f"or name the launcher with --job ROOT)")
    if root in ancestry(os.getpid()):
        raise JobError(f"the common parent of pids {listed} is pid {root} ({procinfo.name(root)}), which also runs this "
                       f"proxy-cli: CRIU would dump the caller with the job (dump them with --gpu-only, or name the "
                       f"job's own launcher with --job ROOT)")
    extra = sorted(set(job_ranks(connect, root=root)) - set(ranks))
    if extra:
        raise JobError(f"the tree of pid {root} ({procinfo.name(root)}), the common parent of pids {listed}, also holds the "
                       f"gpuproxy client(s) {', '.join(map(str, extra))}, which a CRIU dump of it would take without "
                       f"their GPU state: name them too, or use --job {root}")
    return root

