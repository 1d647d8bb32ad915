"""Namespace "nodes" on one machine, for the cluster tests (issue 25):
tests/test_cluster_slurm.py and tests/test_cluster_podman.py.

A node is a network namespace (`ip netns add`, a veth pair to the host) plus
a mount and UTS namespace (`unshare --mount --uts`) held open by one small
process; commands run in it through `nsenter`. Every node sees the same
paths; what must differ between nodes (proxyd's socket, slurmd's spool) lives
under NODE_PRIVATE, a tmpfs mounted in the node's own mount namespace, so
two proxyds listen at the same endpoint path, one per node. The rest of the
file system, the test's folder included, is the nodes' shared storage.

    with Cluster(tmp, ["n1", "n2"]) as c:
        c.start(c.nodes[0], ["proxyd", ...])     # a process in node n1
        c.stop_all()                            # every process, namespace and link made

Needs root, iproute2 and util-linux (unshare, nsenter); skip_reason() says
why it cannot work here.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

NODE_PRIVATE = "/run/gpuproxy-node"          # per-node tmpfs (mounted in each node's mount namespace)
ENDPOINT = f"ipc://{NODE_PRIVATE}/proxyd.sock"
SUBNET = "10.231"                            # node i: host side SUBNET.i.1, node side SUBNET.i.2


_refs: dict = {}


def reference_output(argv: list[str], kernels: list[str]) -> str:
    """stdout of an uninterrupted run of argv under a plain proxyd (emulated
    backend), computed once per test session."""
    key = tuple(argv)
    if key not in _refs:
        from proxy import Daemon
        with Daemon(backend="emu", emu_kernels=kernels) as ref:
            r = subprocess.run(argv, env=ref.env_for_client(), capture_output=True, text=True, timeout=600,
                               stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stdout + r.stderr
        _refs[key] = r.stdout
    return _refs[key]


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "namespace nodes need root (ip netns, unshare --mount)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    r = subprocess.run(["unshare", "--mount", "--uts", "--net", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot make namespaces here: {r.stderr.strip()}"
    return None


class Node:
    def __init__(self, name: str, index: int, prefix: str):
        self.name = name
        self.index = index
        self.netns = f"{prefix}{name}"
        self.host_ip = f"{SUBNET}.{index}.1"
        self.ip = f"{SUBNET}.{index}.2"
        self.veth = f"{prefix}{name}h"[:15]
        self.holder: subprocess.Popen | None = None

    def enter(self) -> list[str]:
        """argv prefix that runs a command inside this node."""
        return ["nsenter", "-t", str(self.holder.pid), "-m", "-u", "-n", "--"]


class Cluster:
    def __init__(self, tmp: Path, names: list[str], prefix: str | None = None):
        self.tmp = Path(tmp)
        self.prefix = prefix or f"gp{os.getpid() % 10000}"
        self.nodes = [Node(n, i + 1, self.prefix) for i, n in enumerate(names)]
        self.procs: list[tuple[str, subprocess.Popen]] = []

    # -- set-up
    def up(self) -> "Cluster":
        try:
            for n in self.nodes:
                self._net(n)
                self._holder(n)
        except BaseException:
            self.down()
            raise
        return self

    def _sh(self, *argv: str) -> None:
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")

    def _net(self, n: Node) -> None:
        self._sh("ip", "netns", "add", n.netns)
        self._sh("ip", "link", "add", n.veth, "type", "veth", "peer", "name", "eth0", "netns", n.netns)
        self._sh("ip", "addr", "add", f"{n.host_ip}/24", "dev", n.veth)
        self._sh("ip", "link", "set", n.veth, "up")
        for cmd in (["ip", "addr", "add", f"{n.ip}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                    ["ip", "link", "set", "lo", "up"], ["ip", "route", "add", "default", "via", n.host_ip]):
            self._sh("ip", "netns", "exec", n.netns, *cmd)

    def _holder(self, n: Node) -> None:
        """A process holding the node's mount and UTS namespaces open, with
        the node-private tmpfs mounted and the node's host name set."""
        script = (f"mkdir -p {NODE_PRIVATE} && mount -t tmpfs -o mode=0755 gpnode {NODE_PRIVATE} && "
                  f"hostname {n.name} && echo ready && exec sleep 1000000")
        # nsenter, not `ip netns exec`: that one mounts a fresh /sys, without
        # the cgroup hierarchies slurmd needs
        p = subprocess.Popen(["nsenter", f"--net=/run/netns/{n.netns}", "--", "unshare", "--mount", "--uts",
                              "--propagation", "private", "sh", "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = p.stdout.readline().strip()
        if line != "ready":
            p.kill()
            raise RuntimeError(f"node {n.name} did not start: {p.stderr.read().strip()}")
        n.holder = p

    # -- processes
    def start(self, node: Node | None, argv: list[str], log: Path, env: dict | None = None,
              name: str | None = None) -> subprocess.Popen:
        """argv in node (None: on the host), in its own session, its output
        into log. Stopped by stop_all()."""
        full = (node.enter() if node else []) + list(argv)
        e = dict(os.environ if env is None else env)
        e.pop("LD_PRELOAD", None)
        p = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                             env=e, start_new_session=True)
        self.procs.append((name or argv[0], p))
        return p

    def run(self, node: Node | None, argv: list[str], env: dict | None = None, timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess:
        full = (node.enter() if node else []) + list(argv)
        e = dict(os.environ if env is None else env)
        e.pop("LD_PRELOAD", None)
        r = subprocess.run(full, capture_output=True, text=True, env=e, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} in {node.name if node else 'host'} failed "
                               f"({r.returncode}): {r.stderr.strip()} {r.stdout.strip()}")
        return r

    def proxyd(self, node: Node, kernels: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        """This node's proxyd (emulated backend) at ENDPOINT, once it answers."""
        p = self.start(node, [sys.executable, "-m", "gpuproxy.proxyd", "--backend", "emu", "--endpoint", ENDPOINT,
                              "--emu-kernels", *kernels], log, env=env, name=f"proxyd@{node.name}")
        end = time.monotonic() + 60
        while True:
            r = self.run(node, [sys.executable, "-c", "import sys; sys.path.insert(0, %r); from proxy import ping; "
                                "sys.exit(0 if ping(%r, 1.0) else 1)" % (str(Path(__file__).parent), ENDPOINT)],
                         check=False)
            if r.returncode == 0:
                return p
            if p.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"proxyd in {node.name} did not start:\n{Path(log).read_text()[-2000:]}")
            time.sleep(0.2)

    def stop(self, p: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 15.0) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(wait)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(10)

    def stop_all(self) -> None:
        while self.procs:
            _name, p = self.procs.pop()
            self.stop(p)

    def sweep(self) -> list[int]:
        """SIGKILLs every process still inside a node (a job's app that its
        scheduler left behind): those whose network namespace is a node's."""
        nets = set()
        for n in self.nodes:
            if n.holder is not None:
                try:
                    nets.add(os.stat(f"/proc/{n.holder.pid}/ns/net").st_ino)
                except OSError:
                    pass
        holders = {n.holder.pid for n in self.nodes if n.holder is not None}
        killed = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) in holders:
                continue
            try:
                if os.stat(f"/proc/{d}/ns/net").st_ino in nets:
                    os.kill(int(d), signal.SIGKILL)
                    killed.append(int(d))
            except OSError:
                pass
        return killed

    def down(self) -> None:
        self.stop_all()
        self.sweep()
        for n in self.nodes:
            if n.holder is not None:
                n.holder.kill()
                n.holder.wait()
                n.holder = None
            subprocess.run(["ip", "netns", "del", n.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", n.veth], capture_output=True)

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
