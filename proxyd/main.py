"""proxyd: the gpuproxy daemon.

    proxyd [--backend cuda|emu] [--endpoint E] [--emu-kernels FILE ...]

The process started here is the supervisor (supervisor/daemon.py); it never touches
the GPU. Each client session gets a worker process of its own (worker/entry.py).

--backend defaults to cuda when a GPU is found and emu otherwise. The
endpoint defaults to $GPUPROXY_ENDPOINT, else ipc:///tmp/gpuproxy.sock.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from . import __version__
from .core import protocol as P

log = logging.getLogger("proxyd")

SHIM_NAMES = ("libcuda.so.1", "libcudart.so.13")


def _shim_dir() -> str:
    from gpuproxy.interceptor import lib_dir
    return os.path.realpath(lib_dir())


def _loaded_shim() -> bool:
    """True if our own shim is mapped into this process (inherited LD_PRELOAD)."""
    d = _shim_dir()
    try:
        with open("/proc/self/maps") as f:
            return any(line.rstrip().endswith(SHIM_NAMES) and d in line for line in f)
    except OSError:
        return False


def _clean_env(env: dict) -> dict:
    """The environment without the shim: proxyd must reach the real driver."""
    d = _shim_dir()
    env = dict(env)
    for var in ("LD_PRELOAD", "LD_LIBRARY_PATH"):
        v = env.get(var)
        if not v:
            continue
        parts = [p for p in v.replace(" ", ":").split(":")
                 if p and not os.path.realpath(p).startswith(d)]
        if parts:
            env[var] = ":".join(parts)
        else:
            env.pop(var)
    return env


def ensure_no_shim(argv: list[str]):
    """Re-executes proxyd without the shim if it was preloaded into us."""
    clean = _clean_env(os.environ)
    if _loaded_shim() or clean.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD") \
            or clean.get("LD_LIBRARY_PATH") != os.environ.get("LD_LIBRARY_PATH"):
        if os.environ.get("GPUPROXY_REEXECED"):
            sys.exit("proxyd: the gpuproxy shim is still loaded after re-exec; unset LD_PRELOAD")
        clean["GPUPROXY_REEXECED"] = "1"
        os.execve(sys.executable, [sys.executable, "-m", "gpuproxy.proxyd", *argv], clean)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ensure_no_shim(argv)
    ap = argparse.ArgumentParser(prog="proxyd", description="gpuproxy daemon: owns the GPU and runs the CUDA calls of proxied programs")
    ap.add_argument("--backend", choices=["cuda", "emu", "auto"], default=os.environ.get("GPUPROXY_BACKEND", "auto"),
                    help="cuda (real GPU), emu (emulated GPU) or auto (cuda when a GPU is found)")
    ap.add_argument("--endpoint", default=P.endpoint_from_env(),
                    help=f"ZeroMQ endpoint to bind (ipc:// or tcp://; default $GPUPROXY_ENDPOINT or {P.DEFAULT_ENDPOINT})")
    ap.add_argument("--emu-kernels", nargs="*", default=[], metavar="FILE",
                    help="Python files with emulated kernels (gpuproxy.emu.kernel)")
    ap.add_argument("--emu-devices", type=int, default=1, help="number of emulated GPUs")
    ap.add_argument("--spin-us", type=int, default=int(os.environ.get("GPUPROXY_DAEMON_SPIN_US", "200")),
                    help="microseconds to poll for the next message before sleeping")
    ap.add_argument("--spare-workers", type=int, default=int(os.environ.get("GPUPROXY_SPARE_WORKERS", "1")),
                    help="workers kept started ahead of need, so a new client does not wait for one")
    # per-user bounds (proxyd/supervisor/bounds.py); None: the environment's or the default
    ap.add_argument("--max-sessions-per-user", type=int, default=None,
                    help="sessions one user may hold (default 64, $GPUPROXY_MAX_SESSIONS_PER_USER; 0: no bound)")
    ap.add_argument("--max-pending-per-user", type=int, default=None,
                    help="HELLOs of one user not yet opened at their worker (default 32; 0: no bound)")
    ap.add_argument("--hello-timeout", type=float, default=None,
                    help="seconds a client has to open its session at its worker before it is ended (default 10)")
    ap.add_argument("--users", choices=["self", "all"], default=os.environ.get("GPUPROXY_USERS", "self"),
                    help="who may connect to an ipc endpoint: proxyd's own user (default), or every local user "
                         "(a node daemon; each user then sees and controls only their own sessions)")
    ap.add_argument("--server-key", action="store_true",
                    help="print proxyd's public CURVE key (made if missing) for tcp clients, and exit")
    ap.add_argument("--log-level", default=os.environ.get("GPUPROXY_LOG", "INFO"))
    ap.add_argument("--version", action="version", version=f"proxyd {__version__}")
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="proxyd: %(message)s", stream=sys.stderr)
    if a.server_key:
        from .core.curve import CurveError, server_keypair
        try:
            print(server_keypair(create=True)[0].decode())
        except CurveError as e:
            sys.exit(f"proxyd: {e}")
        return
    files = [os.path.abspath(f) for f in a.emu_kernels]
    for f in files:   # fail here, once, rather than in every worker
        if not os.path.isfile(f):
            sys.exit(f"proxyd: cannot load emulated kernels from {f}: no such file")
    from .supervisor.daemon import Supervisor, WorkerSpec
    from .core.endpoint import EndpointInUse
    spec = WorkerSpec(backend=a.backend, emu_kernels=files, emu_devices=a.emu_devices, spin_us=a.spin_us,
                      log_level=a.log_level)
    try:
        from .supervisor.bounds import Bounds
        server = Supervisor(a.endpoint, spec, spares=a.spare_workers, users=a.users,
                            limits=Bounds(a.max_sessions_per_user, a.max_pending_per_user, a.hello_timeout))
    except EndpointInUse as e:
        sys.exit(f"proxyd: {e}")
    from .core.logredact import install
    install(lambda: list(server.entries))      # the log shows sessions' public ids, not their tokens
    # shared memory, session markers and park files of clients that died
    # with an earlier daemon (park_sweep.py's table)
    from .supervisor.park_sweep import sweep_gone_clients
    sweep_gone_clients()

    def stop(signum, frame):
        server.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.close()
        log.info("proxyd stopped")


if __name__ == "__main__":
    main()
