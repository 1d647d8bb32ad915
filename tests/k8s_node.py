"""A GPU node's /proc as the node agent sees it, for the Kubernetes tests:
pods' processes with their cgroup paths, command lines and signal masks, the
containers' root folders, and real checkpoint images (the image writer's,
with a CRIU part as tests/test_criu.py makes it)."""
import json
import os
import signal
from pathlib import Path

from gpuproxy.k8s.agent import CHECKPOINT_NOW
from gpuproxy.proxyd.checkpoint import criu
from gpuproxy.proxyd.checkpoint.image import ImageWriter

UID = "a9b8c7d6-e5f4-4a3b-9c2d-1e0f9a8b7c6d"            # the running pod of tests/data/k8s/pods-on-node.json
OTHER = "c2d3e4f5-a6b7-4c8d-9e0f-1a2b3c4d5e6f"
OLD = "d3e4f5a6-b7c8-4d9e-8f0a-2b3c4d5e6f7a"
CKDIR = "/checkpoints/gpuproxy-example/train-low-5f1b6c0e"
# Signal masks (SigCgt): the contract's wrapper today catches SIGTERM and the
# signals it passes on to the app (SIGINT, SIGHUP, SIGUSR1, SIGUSR2); one that
# takes on-demand checkpoints catches CHECKPOINT_NOW too.
SIGCGT_CONTRACT = sum(1 << (s - 1) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                                             signal.SIGUSR2))
SIGCGT_WITH_NOW = SIGCGT_CONTRACT | (1 << (CHECKPOINT_NOW - 1))
SIGCGT_TERM = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))


def write_image(path: Path, criu_complete: bool = True, created_bump: bytes = b"x", stall_ms: float | None = 1234.5,
                publish: bool = True) -> None:
    """A real image (manifest, index, memory; a CRIU part as test_criu makes it)
    at path, laid out as the contract publishes one (proxyd/checkpoint/orchestrate/contract.py):
    DIR/ckpt-<n>/ with its job.json written last, then DIR/latest -> ckpt-<n>.
    publish=False: no job.json and no latest (a dump still in progress)."""
    w = ImageWriter(path, "dump", {"backend": "emu"})
    w.add_chunk(1 << 40, created_bump * 4096)
    w.finish({"pid": 7}).close()
    (path / "criu").mkdir()
    (path / "criu" / "inventory.img").write_bytes(b"\0" * 100)
    rec = {"dir": "criu", "kind": "dump", "complete": criu_complete, "root_pid": 7, "pids": [7, 8], "size": 100,
           "files": 1, "criu_version": "4.2.1", "options": {}, "log": "criu/dump.log", "ms": 812.5}
    criu.record_in_manifest(str(path), rec)
    if not publish:
        return
    job = {"argv": ["python3", "/app/train_torch.py"], "uid": 0, "version": 1, "pipes": {"1": 4711, "2": 4712},
           "host": "gpu-node-a", "time": 1795772479.5, "kind": "periodic"}
    if stall_ms is not None:
        job["stall_ms"] = stall_ms
    (path / "job.json").write_text(json.dumps(job))
    link = path.parent / ".latest.tmp"
    link.symlink_to(path.name)
    os.replace(link, path.parent / "latest")


def add_proc(proc: Path, pid: int, cgroup: str, argv: list[str], sigcgt: int, root: Path | None = None) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(cgroup)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nSigBlk:\t0000000000000000\n"
                              f"SigIgn:\t0000000001001000\nSigCgt:\t{sigcgt:016x}\n")
    if root is not None:
        os.symlink(root, d / "root")


def make_node(tmp_path: Path):
    """A node's /proc: the wrapped pod (systemd cgroup driver: uid with underscores),
    its app process, another pod (cgroupfs driver), a wrapper that takes no
    on-demand checkpoints (today's contract)."""
    proc, rootfs = tmp_path / "proc", tmp_path / "rootfs"
    (rootfs / CKDIR.lstrip("/")).mkdir(parents=True)
    sysd = (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-4f2a9c.scope\n")
    wrapper = ["/usr/bin/python3", "/usr/local/bin/proxy-cli", "run", "--checkpoint-dir", CKDIR, "--keep", "2", "--",
               "python3", "/app/train_torch.py", "--checkpoint-dir", "/elsewhere"]
    add_proc(proc, 4100, sysd, wrapper, SIGCGT_WITH_NOW, rootfs)
    add_proc(proc, 4107, sysd, ["python3", "/app/train_torch.py", "--checkpoint-dir", "/elsewhere"], 0, rootfs)
    add_proc(proc, 5200, f"12:pids:/kubepods/burstable/pod{OTHER}/8e1f\n0::/kubepods/burstable/pod{OTHER}/8e1f\n",
             ["nginx", "-g", "daemon off;"], SIGCGT_TERM, rootfs)
    add_proc(proc, 6300, f"0::/kubepods/pod{OLD}/77aa\n", ["proxy-cli", "run", "--checkpoint-dir", "/checkpoints/x",
                                                           "--", "./app"], SIGCGT_CONTRACT, rootfs)
    (proc / "self").mkdir()
    return proc, rootfs
