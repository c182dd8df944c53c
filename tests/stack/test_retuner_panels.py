"""The retuner dashboard against a LIVE retuner (slow, ~40-60 s): a simulated job through the real profiler
plugin and the real tuner plugin, the collector, and the retuner in apply mode (the service default is dry
run), scraped by the real Prometheus. Every query of dynamiccl/dashboards/json/retuner.json must return data,
including "Active configuration" and "Measured gain", which only fill once the retuner has committed a
configuration and verified it from the profiler stream.

The workload is the EFA data-parallel job of the retuner evaluation (p5en-2x8) with 60 us added per network
crossing from the start: there its 4 MiB all-reduce runs ~1.3x faster on Ring/LL128 than on NCCL's default
Tree/LL128 (simulator.oracle), so start-up tuning commits a configuration within ~30 s of real time.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboards"))
from promql_names import dashboard_queries  # noqa: E402

from loop_helpers import DEPLOY, ROOT, free_port, query, stop_job, substitute, wait_http  # noqa: E402

pytestmark = pytest.mark.e2e

COMMIT_TIMEOUT_S = 90.0


def test_retuner_dashboard_fills_from_a_live_retuner(tmp_path, built_profiler):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (Debian: apt-get install prometheus)")
    from prometheus_client import CollectorRegistry, start_http_server

    from dynamiccl.collector.config import default_config
    from dynamiccl.collector.pipeline import Pipeline
    from dynamiccl.demo import _plugin_tuner
    from dynamiccl.stack import render_prometheus
    from dynamiccl.retuner.agent import Retuner
    from dynamiccl.retuner.config import PolicyConfig, RetunerConfig
    from dynamiccl.harness.simulator import scenario
    from dynamiccl.harness.simulator.driver import SimulatedJob
    from dynamiccl.harness.simulator.workload import load

    # services this test does not run get free (unused) ports: Prometheus just sees them down
    ports = {k: free_port() for k in ("collector", "detector", "retuner", "prometheus", "alertmanager")}
    addrs = {k: f"127.0.0.1:{v}" for k, v in ports.items()}
    sock = tmp_path / "c.sock"
    cfg = default_config().replace(receiver={"listen": (f"unix:{sock}",)}, parquet={"directory": None},
                                   prometheus={"address": addrs["collector"]}, features={"address": None},
                                   telemetry={"gpu": False})
    pipeline = Pipeline(cfg).start()
    sub = pipeline.subscribe()
    workload = load(ROOT / "dynamiccl/retuner/workloads/ddp-efa-2x8.yaml")
    reg = CollectorRegistry()
    retuner = Retuner(RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "tuner.conf"),
                                    audit_path=str(tmp_path / "audit.jsonl"), topology=workload.topology.name,
                                    policy=PolicyConfig(tune_at_start=True, apply_grace_s=4.0)), registry=reg)
    http, _ = start_http_server(ports["retuner"], addr="127.0.0.1", registry=reg)
    tuner = _plugin_tuner(tmp_path / "tuner.conf")
    pcfg = render_prometheus(DEPLOY / "prometheus/prometheus.yml", addrs, scrape_interval="1s")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(pcfg))
    log = open(tmp_path / "prometheus.log", "wb")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address={addrs['prometheus']}"],
                            stdout=log, stderr=subprocess.STDOUT)
    prom_url = f"http://{addrs['prometheus']}"
    job = None
    try:
        assert wait_http(f"{prom_url}/-/ready", 30), (tmp_path / "prometheus.log").read_text()[-2000:]
        sc = scenario.from_dict({"name": "panels", "duration_s": COMMIT_TIMEOUT_S + 30, "noise_sigma": 0.02,
                                 "events": [{"at_s": 0, "kind": "latency", "magnitude": 60}]})
        job = SimulatedJob(workload, sc, collector=f"unix:{sock}", realtime=True, job_id="panels",
                           out_dir=tmp_path / "sim", tuner=tuner).start()
        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while time.monotonic() < deadline and not retuner.metrics.gain:
            wf = sub.get(timeout=0.5)
            if wf is not None:
                retuner.on_window(wf)
        audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines() if line]
        assert retuner.metrics.gain, f"no verified commit within {COMMIT_TIMEOUT_S} s; audit: {audit[-6:]}"
        # the config the retuner says is active is in the file the real plugin reads
        active = dict(retuner.metrics.active)
        conf = (tmp_path / "tuner.conf").read_text()
        for (_, _, _), (algo, proto, _) in active.items():
            assert f"{algo.lower()}" in conf.lower() and f"{proto.lower()}" in conf.lower(), conf
        time.sleep(4)                                   # a few scrapes with the committed state
        empty, checked = [], 0
        doc = json.loads((ROOT / "dynamiccl/dashboards/json/retuner.json").read_text())
        for where, expr in dashboard_queries(doc):
            if where.startswith("annotation"):      # alert annotations: the E2E loop test fires and checks them
                continue
            e = substitute(expr)
            if where.startswith("variable "):
                e = f"count({e})"
            res = query(prom_url, e)
            checked += 1
            if not [r for r in res if math.isfinite(float(r["value"][1]))]:
                empty.append(f"{where}: {e}")
        assert empty == [], "\n".join(empty)
        gain = query(prom_url, "max(dynamiccl_retuner_measured_gain_ratio)")
        assert float(gain[0]["value"][1]) == pytest.approx(max(retuner.metrics.gain.values()), rel=1e-6)
        assert checked >= 5
        print(f"\nretuner panels: {checked} queries with data; committed {active}; gain {dict(retuner.metrics.gain)}")
    finally:
        stop_job(job)
        prom.terminate()
        prom.wait(timeout=10)
        log.close()
        http.shutdown()
        http.server_close()
        retuner.close()
        tuner.close()
        pipeline.shutdown()
