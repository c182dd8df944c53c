"""`dynamiccl stack`: configuration from the environment, the plan, the example webhook, and (slow) a real
up → status → down with the installed Prometheus and Alertmanager."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dynamiccl.stack import AlertWebhook, Stack, StackConfig

sys.path.insert(0, str(Path(__file__).parent))
from loop_helpers import free_port, query  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_config_from_env_and_validation(tmp_path):
    cfg = StackConfig.from_env({"PROMETHEUS_PORT": "19090", "DYNAMICCL_BIND": "0.0.0.0",
                                "DYNAMICCL_STACK_DIR": str(tmp_path)})
    assert cfg.ports["prometheus"] == 19090 and cfg.url("prometheus") == "http://127.0.0.1:19090"
    assert cfg.address("prometheus") == "0.0.0.0:19090" and cfg.state_dir == tmp_path
    assert cfg.parquet_dir == tmp_path / "parquet"
    with pytest.raises(ValueError, match="both prometheus and grafana"):
        StackConfig.from_env({"GRAFANA_PORT": "9090"}).validate()
    with pytest.raises(FileNotFoundError, match="DYNAMICCL_DEPLOY_DIR"):
        StackConfig.from_env({"DYNAMICCL_DEPLOY_DIR": str(tmp_path)}).validate()


def test_plan_uses_the_shared_files_with_loopback_addresses(tmp_path):
    cfg = StackConfig.from_env({"COLLECTOR_METRICS_PORT": "19464", "ALERT_WEBHOOK_PORT": "19469"},
                               state_dir=tmp_path)
    svcs, notes = Stack(cfg).plan()
    names = [s.name for s in svcs]
    assert names[0] == "collector" and {"alert-log", "alertmanager", "prometheus"} <= set(names)
    collector = svcs[0]
    assert collector.argv[1:4] == ["-m", "dynamiccl", "collector"]
    assert "127.0.0.1:19464" in collector.argv and collector.health == "http://127.0.0.1:19464/metrics"
    prom = (tmp_path / "config/prometheus.yml").read_text()
    assert "127.0.0.1:19464" in prom and str((tmp_path / "config/rules/alerts.yml").resolve()) in prom
    assert "http://127.0.0.1:19469/alerts" in (tmp_path / "config/alertmanager.yml").read_text()
    if shutil.which("grafana") is None and shutil.which("grafana-server") is None:
        assert any(n.startswith("grafana: no grafana") and "dashboards push" in n for n in notes)
    demo = Stack(StackConfig.from_env({}, state_dir=tmp_path, demo=True)).plan()[0]
    assert demo[-1].name == "simulated-job" and "tcp:127.0.0.1:9470" in demo[-1].argv


def test_every_planned_dynamiccl_command_is_one_the_cli_accepts(tmp_path):
    """The stack writes the services' command lines itself (it may not import the CLI): they must stay ones the
    CLI's own parser turns into a command, with every flag known."""
    from dynamiccl.cli import build_parser
    parser = build_parser()
    svcs, _ = Stack(StackConfig.from_env({}, state_dir=tmp_path, demo=True)).plan()
    ours = [s for s in svcs if s.argv[1:3] == ["-m", "dynamiccl"]]
    assert {"collector", "detector", "retuner", "alert-log"} <= {s.name for s in ours}
    for s in ours:
        ns = parser.parse_args(s.argv[3:])          # SystemExit(2) on an unknown flag
        assert getattr(ns, "func", None) is not None, s.argv


def test_status_without_a_stack(tmp_path, capsys):
    from dynamiccl.cli import main
    assert main(["stack", "status", "--state-dir", str(tmp_path)]) == 3
    assert capsys.readouterr().out.strip().endswith("stack=down running=0 healthy=0")


def test_webhook_keeps_alerts_and_rejects_bad_input():
    hook = AlertWebhook("127.0.0.1", 0, max_keep=2).start()
    url = f"http://{hook.address}/alerts"
    try:
        def post(body: bytes) -> int:
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            try:
                return urllib.request.urlopen(req, timeout=5).status
            except urllib.error.HTTPError as e:
                return e.code
        note = {"receiver": "webhook-example", "status": "firing",
                "alerts": [{"status": "firing", "labels": {"alertname": "X"}, "annotations": {}}]}
        assert post(b"{not json") == 400
        assert post(json.dumps({"alerts": "nope"}).encode()) == 400
        for _ in range(3):
            assert post(json.dumps(note).encode()) == 200
        assert (hook.received, hook.rejected, len(hook.notifications)) == (3, 2, 2)   # bounded
        assert hook.wait_for(lambda a: a["labels"]["alertname"] == "X", timeout=1)[1]["status"] == "firing"
        assert hook.wait_for(lambda a: False, timeout=0.2) is None
        assert urllib.request.urlopen(f"http://{hook.address}/", timeout=5).status == 200
    finally:
        hook.shutdown()


@pytest.mark.slow
def test_stack_up_status_down_with_real_binaries(tmp_path):
    for b in ("prometheus", "prometheus-alertmanager"):
        if shutil.which(b) is None:
            pytest.skip(f"{b} not installed")
    env = {**os.environ, "DYNAMICCL_STACK_DIR": str(tmp_path / "stack")}
    for var in ("PROMETHEUS_PORT", "ALERTMANAGER_PORT", "GRAFANA_PORT", "COLLECTOR_METRICS_PORT",
                "COLLECTOR_FEATURES_PORT", "COLLECTOR_PLUGIN_PORT", "DETECTOR_METRICS_PORT", "DETECTOR_EVENTS_PORT",
                "RETUNER_METRICS_PORT", "ALERT_WEBHOOK_PORT"):
        env[var] = str(free_port())

    def dyn(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dynamiccl", "stack", *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    up = dyn("up")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert up.stdout.strip().splitlines()[-1].startswith("stack=up services=collector,")
        again = dyn("up")
        assert again.returncode == 2 and "already runs" in again.stderr
        st = dyn("status")
        assert st.returncode == 0 and "healthy=" in st.stdout.splitlines()[-1], st.stdout
        prom = f"http://127.0.0.1:{env['PROMETHEUS_PORT']}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = query(prom, 'up{job="dynamiccl-collector"} == 1')
            if r:
                break
            time.sleep(1)
        assert r, "Prometheus does not scrape the native collector"
        rules = json.load(urllib.request.urlopen(f"{prom}/api/v1/rules", timeout=5))["data"]["groups"]
        assert {g["name"] for g in rules} == {"dynamiccl-alerts", "dynamiccl-recording"}
        # Prometheus down: status says which service, the collector keeps serving
        pids = json.loads((tmp_path / "stack/pids.json").read_text())
        os.kill(pids["prometheus"]["pid"], 15)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and Path(f"/proc/{pids['prometheus']['pid']}/cmdline").exists() \
                and Path(f"/proc/{pids['prometheus']['pid']}/cmdline").read_bytes():
            time.sleep(0.2)
        st = dyn("status")
        assert st.returncode == 1 and st.stdout.splitlines()[-1].startswith("stack=degraded")
        assert any(ln.startswith("prometheus") and " dead " in ln for ln in st.stdout.splitlines()), st.stdout
        col = f"http://127.0.0.1:{env['COLLECTOR_METRICS_PORT']}/metrics"
        assert b"dynamiccl_collector_records_received_total" in urllib.request.urlopen(col, timeout=5).read()
    finally:
        down = dyn("down")
    assert down.returncode == 0 and down.stdout.strip().splitlines()[-1].startswith("stack=down stopped=")
    pids = json.loads((tmp_path / "stack/pids.json").read_text()) if (tmp_path / "stack/pids.json").exists() else {}
    assert pids == {}
    for line in up.stdout.splitlines():
        if line.startswith("started "):
            pid = int(line.split("pid=")[1].split()[0])
            assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower()


def test_native_stack_has_no_default_grafana_password_and_no_prometheus_lifecycle(tmp_path, monkeypatch):
    """Issue 18 #9 for `dynamiccl stack up`: Grafana came up as admin/admin and Prometheus with /-/quit."""
    import os
    import stat

    from dynamiccl import stack as stack_mod
    monkeypatch.delenv("GRAFANA_ADMIN_PASSWORD", raising=False)
    pw = stack_mod.grafana_admin_password(tmp_path)
    f = tmp_path / stack_mod.GRAFANA_PASSWORD_FILE
    assert len(pw) >= 20 and pw != "admin" and f.read_text().strip() == pw
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    assert stack_mod.grafana_admin_password(tmp_path) == pw                 # kept across restarts
    monkeypatch.setenv("GRAFANA_ADMIN_PASSWORD", "from-env")
    assert stack_mod.grafana_admin_password(tmp_path) == "from-env"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("prometheus", "grafana"):
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    svcs, _ = Stack(StackConfig.from_env({}, state_dir=tmp_path / "s")).plan()
    by = {s.name: s for s in svcs}
    assert not any("lifecycle" in a for a in by["prometheus"].argv)
    assert by["grafana"].env["GF_SECURITY_ADMIN_PASSWORD"] == "from-env"
