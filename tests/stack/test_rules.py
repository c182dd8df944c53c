"""Prometheus config, recording/alert rules (promtool), Alertmanager config (amtool), runbooks."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dynamiccl.stack import PORT_ENV, render_alertmanager, render_prometheus

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy/prometheus"
AM = ROOT / "deploy/alertmanager/alertmanager.yml"
ALERTS = ("NcclRegimeChange", "NcclJobStalled", "DynamicclCollectorDown", "DynamicclDetectorDown",
          "DynamicclRetunerDown", "NcclPluginDropRateHigh", "DynamicclRetunerRollback")
LOOPBACK = {s: f"127.0.0.1:{p}" for s, (_, p) in PORT_ENV.items()}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian: apt-get install prometheus / prometheus-alertmanager)")
    return path


def _ok(*cmd: str, cwd: Path | None = None) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def _alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load((PROM / "rules/alerts.yml").read_text())["groups"] for r in g["rules"]]


def test_promtool_check_config_and_rules():
    promtool = _tool("promtool")
    out = _ok(promtool, "check", "config", str(PROM / "prometheus.yml"))
    assert "2 rule files found" in out
    _ok(promtool, "check", "rules", *map(str, sorted((PROM / "rules").glob("*.yml"))))


def test_promtool_unit_tests_of_every_alert():
    promtool = _tool("promtool")
    out = _ok(promtool, "test", "rules", "tests/alerts_test.yml", cwd=PROM)
    assert "SUCCESS" in out
    tests = yaml.safe_load((PROM / "tests/alerts_test.yml").read_text())["tests"]
    tested = {t["alertname"] for case in tests for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    assert tested == {r["alert"] for r in _alert_rules()} == set(ALERTS)


def test_promtool_unit_tests_can_fail(tmp_path):
    """A wrong expectation must make promtool (and so this suite) fail."""
    promtool = _tool("promtool")
    for f in ("rules", "tests"):
        shutil.copytree(PROM / f, tmp_path / f)
    t = tmp_path / "tests/alerts_test.yml"
    t.write_text(t.read_text().replace('magnitude: "2.50"', 'magnitude: "2.40"', 1))
    r = subprocess.run([promtool, "test", "rules", "tests/alerts_test.yml"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and 'magnitude="2.50"' in r.stdout + r.stderr


def test_alerts_carry_severity_runbook_and_regime_labels():
    for r in _alert_rules():
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
        runbook = r["annotations"]["runbook_url"]
        assert (ROOT / runbook).is_file(), f"{r['alert']}: runbook {runbook} missing"
        assert r["alert"] in (ROOT / runbook).read_text(), f"{runbook} does not describe {r['alert']}"
        assert r["annotations"]["summary"] and r["annotations"]["description"]
    rc = next(r for r in _alert_rules() if r["alert"] == "NcclRegimeChange")
    assert "by (job_id, kind, comm, where)" in rc["expr"]
    assert "$value" in rc["annotations"]["magnitude"]


def test_native_render_changes_only_addresses(tmp_path):
    promtool = _tool("promtool")
    src = yaml.safe_load((PROM / "prometheus.yml").read_text())
    out = render_prometheus(PROM / "prometheus.yml", LOOPBACK)
    targets = [t for j in out["scrape_configs"] for sc in j["static_configs"] for t in sc["targets"]]
    assert targets == ["127.0.0.1:9464", "127.0.0.1:9466", "127.0.0.1:9468", "127.0.0.1:9090"]
    assert out["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    assert out["global"] == src["global"] and [j["job_name"] for j in out["scrape_configs"]] == \
        [j["job_name"] for j in src["scrape_configs"]]
    p = tmp_path / "prometheus.yml"
    p.write_text(yaml.safe_dump(out))
    assert "2 rule files found" in _ok(promtool, "check", "config", str(p))
    with pytest.raises(ValueError, match="not one of the stack's services"):
        bad = tmp_path / "bad.yml"
        bad.write_text((PROM / "prometheus.yml").read_text().replace("collector:9464", "elsewhere:1"))
        render_prometheus(bad, LOOPBACK)


def test_alertmanager_config_and_routes(tmp_path):
    amtool = _tool("amtool")
    _ok(amtool, "check-config", str(AM))
    out = _ok(amtool, "config", "routes", "test", f"--config.file={AM}", "--verify.receivers=webhook-example",
              "alertname=NcclRegimeChange", "severity=warning")
    assert "webhook-example" in out
    native = render_alertmanager(AM, LOOPBACK)
    assert native["receivers"][0]["webhook_configs"][0]["url"] == "http://127.0.0.1:9469/alerts"
    p = tmp_path / "am.yml"
    p.write_text(yaml.safe_dump(native))
    _ok(amtool, "check-config", str(p))
