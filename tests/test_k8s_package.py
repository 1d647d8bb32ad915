"""gpuproxy.k8s: the pure logic imports without kopf and the kubernetes client
(the base install); the controller's kopf handlers import and register when
the [k8s] extra is installed."""
import os
import subprocess
import sys

import pytest

PURE = ("config", "admission", "nodes", "checkpoints", "images", "agent", "webhook")


def test_pure_modules_need_neither_kopf_nor_kubernetes():
    code = ("import sys\n"
            "for m in ('kopf', 'kubernetes', 'aiohttp'):\n"
            "    sys.modules[m] = None\n"       # an import of them now fails
            + "".join(f"import gpuproxy.k8s.{m}\n" for m in PURE)
            + "try:\n    import gpuproxy.k8s.controller\nexcept ImportError:\n    print('controller needs kopf')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "controller needs kopf"


def test_controller_handlers_register():
    kopf = pytest.importorskip("kopf", reason="the [k8s] extra (kopf) is not installed")
    pytest.importorskip("kubernetes", reason="the [k8s] extra (kubernetes) is not installed")
    from gpuproxy.k8s import controller  # noqa: F401  (registers the handlers)
    reg = kopf.get_default_registry()
    ids = {kind: [h.id for h in getattr(reg, kind).get_all_handlers()]
           for kind in ("_changing", "_watching", "_spawning", "_activities")}
    assert ids["_changing"] == ["checkpoint_created"]       # GPUCheckpoint created
    assert ids["_watching"] == ["node_event"]                # Node events
    assert ids["_spawning"] == ["schedule_tick"]             # GPUCheckpointSchedule timer
    assert "startup" in ids["_activities"]


def test_shim_dir_from_the_environment(tmp_path, monkeypatch):
    """GPUPROXY_SHIM_DIR (set by the webhook to the node's copy) is what
    `proxy-cli run` and `proxy-cli preload` put into LD_PRELOAD."""
    from gpuproxy import interceptor as S
    monkeypatch.delenv("GPUPROXY_SHIM_DIR", raising=False)
    assert S.preload_value().split(":")[0] == f"{S.lib_dir()}/libcudart.so.13"
    monkeypatch.setenv("GPUPROXY_SHIM_DIR", str(tmp_path))
    assert S.preload_value() == ":".join(f"{tmp_path}/{n}" for n in S.LIBRARIES)
    with pytest.raises(FileNotFoundError) as e:
        S.check_built()
    assert "$GPUPROXY_SHIM_DIR" in str(e.value) and str(tmp_path) in str(e.value)
    for n in S.LIBRARIES:
        (tmp_path / n).write_bytes(b"")
    S.check_built()
    r = subprocess.run([sys.executable, "-m", "gpuproxy.cli", "preload"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "GPUPROXY_SHIM_DIR": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.strip() == S.preload_value()
