"""The Kubernetes kit (deploy/kubernetes): every kustomization renders with `kubectl kustomize`, and every
object it renders validates against the Kubernetes schemas of a stated version (kubernetes-validate,
strict: unknown fields are errors) or, for prometheus-operator's ServiceMonitor and PrometheusRule, against
the CRD schemas vendored in tests/deploy/schemas/. Then the wiring the kit promises is checked."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "deploy/kubernetes"
KUSTOMIZATIONS = ("base", "overlays/dev", "overlays/kube-prometheus-stack", "examples/training-job")
#: the Kubernetes versions whose schemas every built-in object must satisfy (kubectl here is v1.32)
K8S_VERSIONS = ("1.32.0", "1.37.0")
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
               ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.json"}
SOCKET_DIR = "/run/dynamiccl"


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl not installed: the kit is rendered with `kubectl kustomize` (apt-get install kubectl)")
    return path


def render(rel: str) -> list[dict]:
    r = subprocess.run([_kubectl(), "kustomize", str(KIT / rel)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"kubectl kustomize {rel}: {r.stderr}"
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {rel: render(rel) for rel in KUSTOMIZATIONS}


def _validate(obj: dict, version: str) -> list[str]:
    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_SCHEMAS:
        schema = json.loads((Path(__file__).with_name("schemas") / CRD_SCHEMAS[key]).read_text())
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")
    try:
        kv.validate(obj, version, strict=True)
    except kv.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates(rendered, version):
    seen = 0
    for rel, objs in rendered.items():
        for obj in objs:
            errors = _validate(obj, version)
            assert not errors, f"{rel}: {obj['kind']}/{obj['metadata']['name']}: {errors[:3]}"
            seen += 1
    assert seen >= 25


def test_validation_can_fail():
    """A typo'd field and a wrong type are refused, for built-in kinds and for the CRDs."""
    (ds,) = [o for o in render("base") if o["kind"] == "DaemonSet"]
    ds["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True   # wrong case
    assert _validate(ds, K8S_VERSIONS[0])
    sm = next(o for o in render("base") if o["kind"] == "ServiceMonitor")
    sm["spec"]["endpoints"][0]["interval"] = 15
    assert _validate(sm, K8S_VERSIONS[0])


def _by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def _pods(objs: list[dict]) -> list[tuple[str, dict]]:
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in objs
            if o["kind"] in ("DaemonSet", "Deployment", "Job")]


def test_security_contexts_and_resources(rendered):
    for rel, objs in rendered.items():
        for name, pod in _pods(objs):
            for c in pod.get("initContainers", []) + pod["containers"]:
                where = f"{rel} {name}/{c['name']}"
                assert {"requests", "limits"} <= set(c.get("resources", {})), f"{where}: requests and limits"
                sc = c.get("securityContext", {})
                assert sc.get("allowPrivilegeEscalation") is False and sc["capabilities"]["drop"] == ["ALL"], where
                if c["name"] == "socket-dir":          # the one root step: chown of the hostPath directory
                    assert set(sc["capabilities"]["add"]) == {"CHOWN", "FOWNER"} and sc["readOnlyRootFilesystem"]
                    continue
                assert pod["securityContext"]["runAsNonRoot"] is True and sc.get("runAsUser", 1) != 0, where
                if c["name"] != "train":                # ours; the training image is the user's
                    assert sc["readOnlyRootFilesystem"] is True, where


def test_collector_daemonset_shares_the_socket_directory_with_the_training_job(rendered):
    (ds,) = _by_kind(rendered["base"], "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    (c,) = pod["containers"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == SOCKET_DIR)
    assert vols[mount["name"]]["hostPath"]["path"] == SOCKET_DIR
    assert f"--listen unix:{SOCKET_DIR}/collector.sock" in " ".join(c["args"])
    # the collector sets its socket's mode (0660, dynamiccl.collector.receivers.stream): the image's entrypoint runs
    # directly, no shell wrapper with a umask
    assert "command" not in c and c["args"][0] == "collector"
    (job,) = _by_kind(rendered["examples/training-job"], "Job")
    jpod = job["spec"]["template"]["spec"]
    (train,) = jpod["containers"]
    env = {e["name"]: e.get("value") for e in train["env"]}
    assert env["DYNAMICCL_COLLECTOR"] == f"unix:{SOCKET_DIR}/collector.sock"
    assert env["NCCL_PROFILER_PLUGIN"].endswith("libnccl-profiler-dynamiccl.so")
    assert env["NCCL_TUNER_PLUGIN"].endswith("libnccl-tuner-dynamiccl.so")
    jvols = {v["name"]: v for v in jpod["volumes"]}
    jmounts = {m["mountPath"]: m for m in train["volumeMounts"]}
    assert jvols[jmounts[SOCKET_DIR]["name"]]["hostPath"]["path"] == SOCKET_DIR
    tuner_dir = str(Path(env["DYNAMICCL_TUNER_CONFIG"]).parent)
    assert jmounts[tuner_dir]["readOnly"] is True
    claim = jvols[jmounts[tuner_dir]["name"]]["persistentVolumeClaim"]["claimName"]
    (retuner,) = [o for o in _by_kind(rendered["base"], "Deployment") if o["metadata"]["name"] == "dynamiccl-retuner"]
    rpod = retuner["spec"]["template"]["spec"]
    assert {v["persistentVolumeClaim"]["claimName"] for v in rpod["volumes"] if "persistentVolumeClaim" in v} == {claim}
    assert env["DYNAMICCL_TUNER_CONFIG"] in rpod["containers"][0]["args"]
    assert 10001 in jpod["securityContext"]["supplementalGroups"]      # the collector's group: may connect


def test_services_are_the_rule_job_names_and_the_servicemonitor_selects_them(rendered):
    objs = rendered["base"]
    services = {s["metadata"]["name"]: s for s in _by_kind(objs, "Service")}
    rules_text = (ROOT / "deploy/prometheus/rules/alerts.yml").read_text()
    for job in ("dynamiccl-collector", "dynamiccl-detector", "dynamiccl-retuner"):
        assert f'job="{job}"' in rules_text and job in services
        assert "metrics" in {p["name"] for p in services[job]["spec"]["ports"]}
    (sm,) = _by_kind(objs, "ServiceMonitor")
    (expr,) = sm["spec"]["selector"]["matchExpressions"]
    assert set(expr["values"]) == {s["metadata"]["labels"]["app.kubernetes.io/name"] for s in services.values()}
    assert services["dynamiccl-collector"]["spec"]["clusterIP"] == "None"   # one target per node


def test_generated_files_are_current_and_the_rules_pass_promtool(rendered, tmp_path):
    from dynamiccl import kube
    assert kube.stale(ROOT) == [], "run `dynamiccl stack kube` and commit deploy/kubernetes/base/generated/"
    (rule,) = _by_kind(rendered["base"], "PrometheusRule")
    groups = {g["name"] for g in rule["spec"]["groups"]}
    assert groups == {"dynamiccl-alerts", "dynamiccl-recording"}
    maps = _by_kind(rendered["base"], "ConfigMap")
    assert sorted(k for m in maps for k in m["data"]) == sorted(p.name for p in (ROOT / "dynamiccl/dashboards/json").glob("*.json"))
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus): the PrometheusRule's rules are unchecked")
    f = tmp_path / "rules.yml"
    f.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    r = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_kube_prometheus_stack_overlay(rendered):
    objs = rendered["overlays/kube-prometheus-stack"]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert _by_kind(objs, kind)[0]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    retuner = next(o for o in _by_kind(objs, "Deployment") if o["metadata"]["name"] == "dynamiccl-retuner")
    assert retuner["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--apply"
    images = {c["image"] for _, pod in _pods(objs) for c in pod.get("initContainers", []) + pod["containers"]}
    assert images == {"registry.example.org/dynamiccl/dynamiccl:0.1.0"}
