"""A proxyd worker: the process that owns one client session's GPU state.

    GPUPROXY_WORKER_ENDPOINT=E python -m gpuproxy.proxyd.worker --ready-fd N [--backend B] [--emu-kernels F ...]

(--endpoint E works too; the supervisor uses the environment, which other
users cannot read, where ps shows arguments to everyone.)

The supervisor (supervisor/daemon.py) starts workers ahead of need and hands each
to one client session, as a native CUDA process owns one context: the
worker holds that session's contexts, arena (at the fixed base), modules,
streams, events and staging memory, executes its calls (server.Server with a
single session) and dumps and restores it on the supervisor's order. When
the session ends, the worker exits; when it crashes or hits a sticky GPU
error, only that session is lost.

Process rules:
 - the worker dies with its supervisor (PR_SET_PDEATHSIG), so no GPU state
   outlives the daemon that can account for it;
 - it tells the supervisor it is ready by writing one JSON line (endpoint,
   backend, devices) to the pipe --ready-fd and closing it;
 - its stdout (fd 1) is a pipe that it drains itself: device-side printf
   output lands there and travels to the client with the next synchronous
   reply (server.StdoutCapture), so it appears on the app's own stdout.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sys

log = logging.getLogger("proxyd")

PR_SET_PDEATHSIG = 1


def _die_with_parent():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if _supervisor_gone():
        sys.exit(0)


def _supervisor_gone() -> bool:
    """Whether the worker was already re-parented when its death signal was
    set. The supervisor names itself (GPUPROXY_SUPERVISOR_PID): it is pid 1
    where proxyd is a container's entrypoint (docker/Containerfile.node), so
    a parent of pid 1 alone does not mean it is gone."""
    want = os.environ.get("GPUPROXY_SUPERVISOR_PID", "")
    if want.isdigit():
        return os.getppid() != int(want)
    return os.getppid() == 1


def main(argv=None):
    ap = argparse.ArgumentParser(prog="proxyd-worker")
    # the supervisor passes it in the environment (GPUPROXY_WORKER_ENDPOINT):
    # arguments are shown to every user (ps), the environment to ours only
    ap.add_argument("--endpoint", default=os.environ.get("GPUPROXY_WORKER_ENDPOINT"))
    ap.add_argument("--ready-fd", type=int, required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--emu-kernels", nargs="*", default=[])
    ap.add_argument("--emu-devices", type=int, default=1)
    ap.add_argument("--spin-us", type=int, default=200)
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args(argv)
    if not a.endpoint:
        ap.error("--endpoint (or GPUPROXY_WORKER_ENDPOINT) is required")
    _die_with_parent()
    logging.basicConfig(level=a.log_level.upper(), format=f"proxyd[w{os.getpid()}]: %(message)s", stream=sys.stderr)
    from ..backends.select import load_emu_kernels, pick_backend
    from ..backends.shared_pool import adopt_channel
    from .server import EndpointInUse, Server, StdoutCapture
    adopt_channel()         # the supervisor's host pool channel, checked and taken before any code may use it
    capture = StdoutCapture.install()
    backend = pick_backend(a.backend, a.emu_devices)
    load_emu_kernels(a.emu_kernels)
    try:
        server = Server(backend, a.endpoint, spin_us=a.spin_us, worker=True)
    except EndpointInUse as e:
        sys.exit(f"proxyd worker: {e}")
    server.stdout_capture = capture
    from ..core.logredact import install
    install(lambda: [*server.sessions, (server.expected or {}).get("token")])   # no token in the log
    rt_prof = os.environ.get("GPUPROXY_RT_PROFILE")
    if rt_prof:  # bench/roundtrip_profile.py: stage timers (rtprofile.py); absent, no timing code runs
        from . import rtprofile
        rtprofile.install(server, rt_prof)
        server.nserve = None      # the stage profile times the Python path (native_serve.py)
    if server.nserve is not None:
        capture.use_native(server.nserve.nat)   # sync answers of the C loop carry kernels' printf output
        server.nserve.capture = True
    devices = [{"index": d, "name": backend.device_name(d), "memory": backend.device_total_mem(d)}
               for d in range(backend.device_count())]
    info = {"endpoint": server.bound_endpoint, "pid": os.getpid(), "backend": backend.name,
            "driver_version": backend.driver_version(), "devices": devices}
    with os.fdopen(a.ready_fd, "w") as f:
        f.write(json.dumps(info) + "\n")

    def stop(signum, frame):
        server.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # ^C in the daemon's terminal is the supervisor's
    # `kill -USR2 WORKER`: every thread's Python stack into the log (a worker
    # that stopped answering, e.g. one waiting in an emulated collective for
    # a peer; the handler runs in C, so it answers even then)
    import faulthandler
    faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)
    prof_dir = os.environ.get("GPUPROXY_WORKER_CPROFILE")
    cprof = None
    if prof_dir:
        # where a worker's time goes (issue 13's profile-first rule): cProfile
        # of the serving loop, written as <dir>/worker-<pid>.pstats at exit
        import cProfile
        cprof = cProfile.Profile()
        cprof.enable()
    try:
        server.serve_forever()
    finally:
        if rt_prof:
            rtprofile.dump()
        if server.nserve is not None:
            log.info("C serving loop: %d messages answered in C, %d taken and given to Python",
                     server.nserve.served, server.nserve.to_python)
        server.close()
        if cprof is not None:
            cprof.disable()
            os.makedirs(prof_dir, exist_ok=True)
            cprof.dump_stats(os.path.join(prof_dir, f"worker-{os.getpid()}.pstats"))


if __name__ == "__main__":
    main()
