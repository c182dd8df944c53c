"""Native stack: regime changes land where `dynamiccl report` looks, rules carry configured base URLs, no
Grafana URL without a Grafana, and a demo job that ended does not leave the stack "degraded"."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dynamiccl.stack import CHANGES_FILE, Stack, StackConfig, _recording_exit, summary_lines
from dynamiccl import stack as stack_mod
from dynamiccl.report.sidecars import find_sidecar

ROOT = Path(__file__).resolve().parents[2]


def _alerts(tmp_path: Path) -> dict:
    rules = yaml.safe_load((tmp_path / "config/rules/alerts.yml").read_text())
    return {r["alert"]: r["annotations"] for g in rules["groups"] for r in g["rules"]}


def test_detector_changes_go_where_report_finds_them(tmp_path):
    for parquet in (None, tmp_path / "elsewhere" / "history"):
        env = {"DYNAMICCL_PARQUET_DIR": str(parquet)} if parquet else {}
        cfg = StackConfig.from_env(env, state_dir=tmp_path / "stack")
        det = next(s for s in Stack(cfg).plan()[0] if s.name == "detector")
        assert det.stdout == cfg.run_dir / CHANGES_FILE
        det.stdout.parent.mkdir(parents=True, exist_ok=True)
        det.stdout.write_text("{}\n")
        Path(cfg.parquet_dir).mkdir(parents=True, exist_ok=True)
        assert find_sidecar(cfg.parquet_dir, CHANGES_FILE) == det.stdout      # report's default lookup


def test_rules_get_the_configured_base_urls(tmp_path):
    cfg = StackConfig.from_env({"DYNAMICCL_RUNBOOK_URL": "https://wiki.example.org/rb",
                                "DYNAMICCL_GRAFANA_EXTERNAL_URL": "https://grafana.example.org"},
                               state_dir=tmp_path)
    Stack(cfg).render()
    ann = _alerts(tmp_path)
    assert ann["NcclJobStalled"]["runbook_url"] == "https://wiki.example.org/rb/job-stalled.md"
    assert ann["NcclJobStalled"]["dashboard_url"].startswith("https://grafana.example.org/d/dynamiccl-ranks?")
    # defaults: this stack's Grafana port, the checkout's runbooks as file:// URLs
    Stack(StackConfig.from_env({"GRAFANA_PORT": "13000"}, state_dir=tmp_path)).render()
    ann = _alerts(tmp_path)
    assert ann["NcclRegimeChange"]["dashboard_url"].startswith("http://127.0.0.1:13000/d/dynamiccl-regimes?")
    url = ann["NcclRegimeChange"]["runbook_url"]
    if stack_mod.DEFAULT_RUNBOOK_URL:      # run from a checkout: its runbooks as file:// URLs
        assert url.startswith("file://") and Path(url[len("file://"):]).is_file()
    else:                                  # an installed wheel ships no docs/: the repository path stays
        assert url == "docs/runbooks/regime-change.md"
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "config", str(tmp_path / "config/prometheus.yml")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_rules_command_writes_a_prometheusrule(tmp_path, capsys):
    from dynamiccl.cli import main
    out = tmp_path / "rule.yaml"
    assert main(["stack", "rules", "--format", "prometheusrule", "--runbook-url", "https://w/rb",
                 "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["kind"] == "PrometheusRule" and {g["name"] for g in doc["spec"]["groups"]} == \
        {"dynamiccl-alerts", "dynamiccl-recording"}
    assert main(["stack", "rules", "--runbook-url", "gopher://x", "--out", str(tmp_path / "d")]) == 1
    assert "expected http(s):// or file://" in capsys.readouterr().err


def test_no_grafana_url_when_grafana_was_not_started():
    cfg = StackConfig.from_env({})
    started = {"collector": {}, "prometheus": {}, "alertmanager": {},
               "detector": {"stdout": "runs/stack/changes.jsonl"}}
    lines = summary_lines(cfg, started)
    assert "Grafana" not in " ".join(lines) and "Prometheus http://127.0.0.1:9090" in lines[0]
    assert "changes.jsonl" in lines[1] and "dynamiccl report" in lines[1]
    assert "Grafana http://127.0.0.1:3000" in summary_lines(cfg, {**started, "grafana": {}})[0]


def _self_entry() -> dict:
    argv0 = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    return {"pid": os.getpid(), "argv": [argv0], "health": None, "log": "x"}


@pytest.mark.parametrize("rc, word, overall, code", [(0, "finished", "up", 0), (3, "dead", "degraded", 1)])
def test_a_demo_job_that_ended_is_finished_not_degraded(tmp_path, rc, word, overall, code):
    rc_file = tmp_path / "simulated-job.rc"
    argv = _recording_exit(rc_file, ["sh", "-c", f"exit {rc}"])
    done = subprocess.run(argv, timeout=30)
    assert done.returncode == rc and rc_file.read_text().strip() == str(rc)
    state = {"collector": _self_entry(),
             "simulated-job": {"pid": 2 ** 22 + 1, "argv": argv, "health": None, "log": "x", "oneshot": True}}
    (tmp_path / "pids.json").write_text(json.dumps(state))
    lines: list[str] = []
    assert Stack(StackConfig.from_env({}, state_dir=tmp_path)).status(out=lines.append) == code
    assert lines[1].split()[:2] == ["simulated-job", word]
    assert lines[-1].startswith(f"stack={overall} running=1 healthy=1")
