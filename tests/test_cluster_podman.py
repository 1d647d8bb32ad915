"""The preemption contract in containers (issue 25): Debian's podman with runc
and the project's CRIU, on namespace nodes (tests/cluster.py), each with its
own proxyd (emulated backend) at the same endpoint path; the test folder is
the shared storage. The image is docker/Containerfile.app, built here with
`podman build` from a root file system staged from this machine's gpuproxy
(scripts/stage-rootfs; no registry is needed).

A job in a container on node 1 is stopped with `podman stop -t 60` (SIGTERM):
`proxy-cli run --checkpoint-dir` checkpoints it and the container exits 143.
A new container of the same image on node 2 restores it from the shared
folder; it finishes with status 0, and the two containers' logs together are
exactly an uninterrupted run's output.

Podman's configuration is private to the test (CONTAINERS_CONF,
CONTAINERS_STORAGE_CONF): runc, cgroupfs, storage under /var/tmp (kept
between runs). Skips, with the reason, without root, podman, runc or CRIU.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from cluster import Cluster, ENDPOINT, NODE_PRIVATE, reference_output, skip_reason  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
CACHE = Path("/var/tmp/gpuproxy-podman")
IMAGE = "localhost/gpuproxy-app:test"
ITER = "3000"
# these machines refuse runc's default rlimits unless they are given explicitly
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]


def _podman_env() -> dict:
    CACHE.mkdir(parents=True, exist_ok=True)
    conf, storage = CACHE / "containers.conf", CACHE / "storage.conf"
    conf.write_text('[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\nevents_logger = "file"\n')
    storage.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{CACHE}/storage"\n'
                       f'runroot = "/run/gpuproxy-podman"\n')
    return dict(os.environ, CONTAINERS_CONF=str(conf), CONTAINERS_STORAGE_CONF=str(storage))


def _missing() -> str | None:
    why = skip_reason()
    if why:
        return why
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-cluster-test-deps installs podman and runc)"
    return None


@pytest.fixture(scope="module")
def podman(shim_installed, nvcc, usable_criu):
    why = _missing()
    if why:
        pytest.skip(why)
    env = _podman_env()
    built = corpus.build(corpus.get_program("iterative"), corpus.default_build_dir())
    kernels = [str(corpus.PROGRAMS_DIR / p.emu) for p in corpus.load_corpus() if p.emu]
    ctx = CACHE / "ctx"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "stage-rootfs"), str(ctx), "--criu",
                        os.path.dirname(os.path.dirname(usable_criu.path)), "--extra", built.argv()[0]], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["podman", "build", "-q", "-f", str(REPO / "docker" / "Containerfile.app"), "-t", IMAGE,
                        str(ctx)], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        pytest.skip(f"podman cannot build images here: {r.stderr.strip()[-300:]}")
    # the image this build replaced (same tag) would pile up in the cache
    subprocess.run(["podman", "image", "prune", "-f"], capture_output=True, env=env, timeout=120)
    d = Path(f"/tmp/gpp-{os.getpid()}")
    d.mkdir()
    want = reference_output(built.argv() + [ITER], kernels)
    c = Cluster(d, ["n1", "n2"])
    names: list[tuple] = []
    try:
        c.up()
        for n in c.nodes:
            c.proxyd(n, kernels, d / f"proxyd-{n.name}.log")
        yield c, env, built, want, d, names
    finally:
        for node, name in names:
            c.run(node, ["podman", "rm", "-f", "-t", "0", name], env=env, check=False)
        c.down()
        if not os.environ.get("GPUPROXY_KEEP_CLUSTER_LOGS"):
            shutil.rmtree(d, ignore_errors=True)


def run_opts(ckpt: Path) -> list[str]:
    """What a job container needs (docker/Containerfile.app says why): CRIU's
    privileges, the node's proxyd socket folder, the checkpoint folder at the same path
    as on the node; not proxyd's key folder (proxyd itself seals the image
    again after adding CRIU's part: the record-criu command,
    checkpoint/criu_record.py). The container keeps its own pid namespace (proxyd keeps
    its client under the pid the kernel shows it, and translates the pids
    the container's proxy-cli names) and its own IPC namespace, so its own
    /dev/shm (proxyd reaches it through /proc/PID/root: the park and resume
    files, also the restored app's, named by the container's proxy-cli;
    the data goes through the socket), and does not get the node's /tmp
    (proxyd takes proxy-cli's socket credentials as its identity)."""
    return ["--privileged", "--network", "none", *ULIMITS,
            "-v", f"{NODE_PRIVATE}:{NODE_PRIVATE}", "-v", f"{ckpt}:{ckpt}",
            "-e", f"GPUPROXY_CKPT_DIR={ckpt}", "-e", f"GPUPROXY_ENDPOINT={ENDPOINT}"]


def sessions(c: Cluster, node) -> list[dict]:
    probe = (f"import json; from gpuproxy.proxyd.client import ControlClient; "
             f"print(json.dumps(ControlClient({ENDPOINT!r}, timeout_s=10).call('status')['sessions']))")
    r = c.run(node, [sys.executable, "-c", probe])
    return json.loads(r.stdout)


def logs(c: Cluster, node, env, name) -> tuple[str, str]:
    r = c.run(node, ["podman", "logs", name], env=env)
    return r.stdout, r.stderr


def test_podman_stop_checkpoints_and_another_node_restores(podman):
    c, env, built, want, d, names = podman
    n1, n2 = c.nodes
    ckpt = d / "ckpt-job"
    ckpt.mkdir()
    argv = built.argv() + [ITER]
    first, second = f"gpp{os.getpid()}-1", f"gpp{os.getpid()}-2"
    names.append((n1, first))
    c.run(n1, ["podman", "run", "-d", "--name", first, *run_opts(ckpt), IMAGE, *argv], env=env)
    end = time.monotonic() + 120
    while not any(s["calls"] >= 1000 for s in sessions(c, n1)):
        assert time.monotonic() < end, logs(c, n1, env, first)
        time.sleep(0.3)
    c.run(n1, ["podman", "stop", "-t", "60", first], env=env, timeout=120)
    code = c.run(n1, ["podman", "inspect", first, "--format", "{{.State.ExitCode}}"], env=env).stdout.strip()
    out1, err1 = logs(c, n1, env, first)
    assert code == "143", (out1, err1)
    assert err1.startswith("proxy-cli run: SIGTERM: checkpointed pid ") and err1.count("\n") == 1, err1
    assert os.readlink(ckpt / "latest") == "ckpt-1"
    # node 2: a new container of the same image on the same (shared) folder
    names.append((n2, second))
    c.run(n2, ["podman", "run", "-d", "--name", second, *run_opts(ckpt), IMAGE, *argv], env=env)
    r = c.run(n2, ["podman", "wait", second], env=env, timeout=300)
    out2, err2 = logs(c, n2, env, second)
    assert r.stdout.strip() == "0", (out2, err2)
    assert "proxy-cli run: restored " in err2 and f"from {ckpt}/ckpt-1" in err2, err2
    assert out1 + out2 == want
    assert not (ckpt / "latest").exists()


def plugin_conf(d: Path) -> Path:
    """A CRIU configuration file for runc with gpuproxy's plugin folder
    (`libdir`), given to one container by the annotation org.criu.config
    (runc reads it for that container's checkpoint and restore; a node sets
    it for all in /etc/criu/runc.conf)."""
    import gpuproxy.proxyd.checkpoint as ck
    conf = d / "criu-runc.conf"
    conf.write_text(f"libdir {Path(ck.__file__).parent}\n")
    return conf


def criu_log_lines(stderr: str) -> str:
    """The error and gpuproxy lines of the CRIU log a podman error names."""
    import re
    m = re.search(r"log file: (\S+\.log)", stderr)
    try:
        text = Path(m.group(1)).read_text(errors="replace") if m else ""
    except OSError:
        return ""
    return "\n".join(ln for ln in text.splitlines() if "Error" in ln or "gpuproxy" in ln)[-4000:]


def test_podman_container_checkpoint_carries_the_gpu_state_to_another_node(podman, usable_criu):
    """`podman container checkpoint --export` of a running gpuproxy client
    (runc runs criu, which runs gpuproxy's plugin: the shim parks, proxyd
    dumps the GPU state beside CRIU's images, into the archive), then
    `podman container restore --import` of that archive on node 2 (the
    plugin restores the GPU state into node 2's proxyd before the app goes
    on): the restored container finishes with status 0 and its log is exactly
    an uninterrupted run's. The container has its own pid and IPC namespaces
    (with --ipc host runc would put the node's whole /dev/shm into the
    archive: proxyd reaches the container's own /dev/shm through /proc) and
    only the node's socket folder, not its /tmp."""
    c, env, built, want, d, names = podman
    n1, n2 = c.nodes
    env = dict(env, PATH=f"{Path(usable_criu.path).parent}:{env.get('PATH', '')}")   # podman and runc run `criu`
    argv = built.argv() + [ITER]
    first, second = f"gpp{os.getpid()}-c1", f"gpp{os.getpid()}-c2"
    names.append((n1, first))
    c.run(n1, ["podman", "run", "-d", "--name", first, "--annotation", f"org.criu.config={plugin_conf(d)}",
               "--network", "none", *ULIMITS, "-v", f"{NODE_PRIVATE}:{NODE_PRIVATE}",
               "-e", f"GPUPROXY_ENDPOINT={ENDPOINT}", "--entrypoint", '["proxy-cli", "run", "--"]', IMAGE, *argv],
          env=env)
    end = time.monotonic() + 120
    while not any(s["calls"] >= 1000 for s in sessions(c, n1)):
        assert time.monotonic() < end, logs(c, n1, env, first)
        time.sleep(0.3)
    archive = d / "c1-checkpoint.tar"
    r = c.run(n1, ["podman", "container", "checkpoint", "--keep", "--export", str(archive), first], env=env,
              timeout=180, check=False)
    assert r.returncode == 0, r.stderr + criu_log_lines(r.stderr)
    members = subprocess.run(["tar", "tf", str(archive)], capture_output=True, text=True).stdout.split()
    assert any(m.startswith("checkpoint/gpuproxy/") and m.endswith("/manifest") for m in members), members
    end = time.monotonic() + 30
    while sessions(c, n1):                # the app is gone from node 1 (CRIU ended it)
        assert time.monotonic() < end, sessions(c, n1)
        time.sleep(0.3)
    names.append((n2, second))
    # --keep: CRIU's restore.log stays in the container's folder (the plugin's lines are in it)
    r = c.run(n2, ["podman", "container", "restore", "--keep", "--import", str(archive), "--name", second],
              env=env, timeout=180, check=False)
    assert r.returncode == 0, r.stderr + criu_log_lines(r.stderr)
    r = c.run(n2, ["podman", "wait", second], env=env, timeout=300)
    out, err = logs(c, n2, env, second)
    assert r.stdout.strip() == "0", (out, err)
    assert out == want, err
