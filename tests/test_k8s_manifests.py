"""Every manifest under docker/k8s, validated offline.

No kubectl, kustomize or API server here: the kustomizations are rendered by
a small renderer of the subset they use (resources, namespace, images,
JSON6902 patches with a target; any other key fails the test, so nothing is
skipped silently), and every rendered object is validated against the
Kubernetes OpenAPI schemas shipped by kubernetes-validate (strict: unknown
fields are errors), our custom resources against the openAPIV3Schema of
their CRD (jsonschema). Objects of other projects (cert-manager, kind's
cluster file) are listed and left out by name.
"""
import copy
import functools
import json
from pathlib import Path

import pytest
import yaml

from gpuproxy.k8s import checkpoints as C
from gpuproxy.k8s.config import Config

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra) holds the schemas")
jsonpatch = pytest.importorskip("jsonpatch", reason="jsonpatch (test extra) applies the overlays' patches")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (a kubernetes-validate dependency)")

ROOT = Path(__file__).resolve().parent.parent / "docker" / "k8s"
# oldest and newest Kubernetes the manifests are checked against
VERSIONS = ("1.30.0", "1.37.0")
KUSTOMIZATIONS = ["base", "example", "overlays/kind", "overlays/kind-example", "overlays/cert-manager"]
FOREIGN = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate"),
           ("kind.x-k8s.io/v1alpha4", "Cluster")}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass",
                  "MutatingWebhookConfiguration", "PersistentVolume"}
KNOWN_KEYS = {"apiVersion", "kind", "namespace", "resources", "images", "patches"}


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(rel: str) -> list[dict]:
    """The objects `kubectl kustomize docker/k8s/<rel>` prints, for the subset used."""
    d = ROOT / rel
    k = yaml.safe_load((d / "kustomization.yaml").read_text())
    assert set(k) <= KNOWN_KEYS, f"{rel}: kustomization keys {set(k) - KNOWN_KEYS} are not rendered by this test"
    objs = []
    for r in k.get("resources", []):
        p = (d / r).resolve()
        objs += render(str(p.relative_to(ROOT))) if p.is_dir() else load_docs(p)
    if "namespace" in k:
        for o in objs:
            if o["kind"] not in CLUSTER_SCOPED:
                o.setdefault("metadata", {})["namespace"] = k["namespace"]
    for img in k.get("images", []):
        for o in objs:
            for c in _containers(o):
                name, _, _tag = c["image"].partition(":")
                if name == img["name"]:
                    c["image"] = img.get("newName", name) + ":" + img["newTag"]
    for p in k.get("patches", []):
        t = p["target"]
        hits = [o for o in objs if o["kind"] == t["kind"] and o["metadata"]["name"] == t["name"]]
        assert len(hits) == 1, f"{rel}: patch target {t} matches {len(hits)} objects"
        patched = jsonpatch.JsonPatch(yaml.safe_load(p["patch"])).apply(hits[0])
        objs[objs.index(hits[0])] = patched
    return objs


def _containers(o: dict) -> list[dict]:
    spec = o.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or (spec if o["kind"] == "Pod" else {})
    return (pod.get("containers") or []) + (pod.get("initContainers") or [])


@functools.lru_cache(maxsize=None)
def crds() -> dict:
    out = {}
    for o in render("base"):
        if o["kind"] == "CustomResourceDefinition":
            for v in o["spec"]["versions"]:
                out[(f"{o['spec']['group']}/{v['name']}", o["spec"]["names"]["kind"])] = (o, v)
    return out


def validate(o: dict, where: str) -> None:
    key = (o.get("apiVersion"), o.get("kind"))
    if key in FOREIGN:
        return
    custom = crds()
    if key in custom:
        schema = custom[key][1]["schema"]["openAPIV3Schema"]
        jsonschema.Draft4Validator(schema).validate(o)
        return
    for v in VERSIONS:
        kv.validate(o, v, strict=True)


def all_yaml_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.yaml") if p.name != "kustomization.yaml")


def test_every_yaml_file_is_valid_on_its_own():
    seen_foreign = set()
    files = all_yaml_files()
    assert len(files) >= 15
    for f in files:
        for o in load_docs(f):
            key = (o.get("apiVersion"), o.get("kind"))
            if key in FOREIGN:
                seen_foreign.add(key)
            validate(o, str(f))
    assert seen_foreign == FOREIGN          # the left-out kinds are exactly these, and they are there


@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_kustomizations_render_and_validate(rel):
    objs = render(rel)
    assert objs
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(set(names)) == len(names), f"{rel}: duplicate objects"
    for o in objs:
        validate(o, rel)
        for c in _containers(o):
            assert ":" in c["image"], f"{rel}: {o['kind']} {o['metadata']['name']}: image {c['image']} has no tag"


def test_base_wiring():
    """The names the pieces find each other by agree."""
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render("base")}
    cfg = Config()
    ds = objs[("DaemonSet", "gpuproxy-node")]["spec"]["template"]["spec"]
    assert ds["hostPID"] is True and ds["automountServiceAccountToken"] is False
    assert ds["nodeSelector"] == {cfg.node_label: cfg.node_label_value}
    proxyd, agent = ds["containers"]
    assert proxyd["securityContext"]["privileged"] is True
    assert cfg.endpoint in proxyd["command"]
    assert {m["mountPath"] for m in proxyd["volumeMounts"]} == {cfg.host_dir, "/dev/shm", "/var/lib/gpuproxy-keys"}
    env = {e["name"]: e.get("value") for e in proxyd["env"]}
    assert env["GPUPROXY_KEY_DIR"] == "/var/lib/gpuproxy-keys"
    # the seal key reaches proxyd only, through a private folder outside the host folder pods see
    assert not env["GPUPROXY_KEY_DIR"].startswith(cfg.host_dir + "/")
    assert [c["name"] for c in ds["initContainers"]] == ["install-shim", "install-seal-key"]
    vols = {v["name"]: v for v in ds["volumes"]}
    assert vols["host"]["hostPath"]["path"] == cfg.host_dir
    assert vols["shm"]["hostPath"]["path"] == cfg.shm_host_dir
    assert agent["securityContext"]["privileged"] is False
    assert agent["ports"][0]["containerPort"] == cfg.agent_port
    k, v = cfg.agent_label.split("=")
    assert ds and objs[("DaemonSet", "gpuproxy-node")]["spec"]["template"]["metadata"]["labels"][k] == v
    assert objs[("DaemonSet", "gpuproxy-node")]["metadata"]["namespace"] == cfg.agent_namespace
    wh = objs[("MutatingWebhookConfiguration", "gpuproxy")]["webhooks"][0]
    assert wh["objectSelector"] == {"matchLabels": {"gpuproxy.io/checkpoint": "true"}}
    assert wh["failurePolicy"] == "Fail" and wh["sideEffects"] == "None"
    assert wh["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                            "resources": ["pods"], "scope": "Namespaced"}]
    svc = objs[("Service", "gpuproxy-webhook")]
    assert wh["clientConfig"]["service"]["name"] == svc["metadata"]["name"]
    assert wh["clientConfig"]["service"]["namespace"] == svc["metadata"]["namespace"]
    dep = objs[("Deployment", "gpuproxy-controller")]["spec"]["template"]["spec"]
    assert dep["serviceAccountName"] == "gpuproxy-controller"
    assert svc["spec"]["selector"] == objs[("Deployment", "gpuproxy-controller")]["spec"]["selector"]["matchLabels"]
    role = objs[("ClusterRole", "gpuproxy-controller")]
    verbs = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    # least privilege: nothing writes pods or nodes, nothing reads secrets
    assert verbs[("", "pods")] == {"get", "list"}
    assert verbs[("", "nodes")] == {"list", "watch"}
    assert not any(r == "secrets" for _, r in verbs)
    binding = objs[("ClusterRoleBinding", "gpuproxy-controller")]
    assert binding["subjects"][0]["namespace"] == cfg.agent_namespace


def test_crds_are_structural_and_show_their_columns():
    for (_api, kind), (crd, ver) in crds().items():
        schema = ver["schema"]["openAPIV3Schema"]
        jsonschema.Draft4Validator.check_schema(schema)

        def walk(s, path):
            if s.get("x-kubernetes-preserve-unknown-fields"):
                return
            assert "type" in s, f"{kind}: {path} has no type (a structural schema needs one everywhere)"
            for k, sub in (s.get("properties") or {}).items():
                walk(sub, f"{path}.{k}")
            if isinstance(s.get("items"), dict):
                walk(s["items"], path + "[]")
            if isinstance(s.get("additionalProperties"), dict):
                walk(s["additionalProperties"], path + "{}")
            if "default" in s:
                jsonschema.Draft4Validator({k: v for k, v in s.items() if k != "default"}).validate(s["default"])
        walk(schema, kind)
        assert "status" in ver["subresources"]
        for col in ver["additionalPrinterColumns"]:
            node = schema
            for part in col["jsonPath"].strip(".").split("."):
                if part in ("metadata",):
                    break
                node = node["properties"][part]
    cols = [c["name"] for c in crds()[("gpuproxy.io/v1alpha1", "GPUCheckpoint")][1]["additionalPrinterColumns"]
            if not c.get("priority")]
    assert cols == ["Pod", "Reason", "Phase", "Node", "Size", "Stall", "Taken", "Age"]


def test_controller_objects_validate_against_the_crds():
    """What the controller creates and writes fits the CRDs' schemas."""
    pods = json.loads((Path(__file__).parent / "data" / "k8s" / "pods-on-node.json").read_text())["items"]
    cfg = Config()
    t = C.parse_time("2026-11-27T09:41:08Z")
    for reason in C.REASONS:
        cr = C.new_checkpoint(pods[0], reason, t, cfg, schedule="train-low-every-15m" if reason == "Schedule" else None)
        validate(cr, "new_checkpoint")
        answer = {"node": "gpu-node-a", "time": "2026-11-27T09:41:20Z", "images": [
            {"container_pid": 81234, "dir": "/checkpoints/gpuproxy-example/train-low-5f1b6c0e",
             "path": "/checkpoints/gpuproxy-example/train-low-5f1b6c0e/ckpt-3", "sizeBytes": 3 << 30,
             "created": "2026-11-27T09:41:19.512+00:00", "durationMs": 11250, "stallMs": None, "criuMs": 812.4}]}
        for st in (C.status_from_agent(answer, "gpu-node-a"), C.status_failed("no agent", "gpu-node-a"),
                   C.status_running("gpu-node-a", t)):
            done = copy.deepcopy(cr)
            done["status"] = st
            validate(done, "status")
    bad = C.new_checkpoint(pods[0], "Drain", t, cfg)
    bad["spec"]["reason"] = "Whim"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, "bad")


def test_the_validation_catches_mistakes():
    """The checks above can fail: a misspelt field and a wrong type are caught."""
    ds = next(o for o in render("base") if o["kind"] == "DaemonSet")
    typo = copy.deepcopy(ds)
    typo["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kv.ValidationError):
        validate(typo, "typo")
    wrong = copy.deepcopy(ds)
    wrong["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": "8471"}]
    with pytest.raises(kv.ValidationError):
        validate(wrong, "wrong type")


def test_kind_overlay_moves_shared_memory_consistently():
    """The DaemonSet's shared-memory folder and the one the webhook mounts into
    pods (the controller's Config) are the same folder."""
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render("overlays/kind")}
    ds = objs[("DaemonSet", "gpuproxy-node")]["spec"]["template"]["spec"]
    shm = next(v for v in ds["volumes"] if v["name"] == "shm")["hostPath"]["path"]
    env = {e["name"]: e.get("value") for e in
           objs[("Deployment", "gpuproxy-controller")]["spec"]["template"]["spec"]["containers"][0]["env"]}
    cfg = Config.from_env({k: v for k, v in env.items() if k.startswith("GPUPROXY_K8S_")})
    assert shm == cfg.shm_host_dir == "/var/lib/gpuproxy-shm"
    assert "gpuproxy.io/emu-gpu" in cfg.gpu_resources
    assert "--backend" in ds["containers"][0]["command"]
