"""The real monitoring loop on loopback, for the end-to-end tests:

simulated job (real profiler plugin) → collector (in process) → detector (in process, its own /metrics) →
Prometheus 2.x (deploy/prometheus with the native addresses, 1 s scrape/evaluation) → Alertmanager
(deploy/alertmanager) → example webhook (dynamiccl.stack.AlertWebhook). Processes are stopped by pid.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def query(prom: str, expr: str, t: float | None = None) -> list[dict]:
    params = {"query": expr}
    if t is not None:
        params["time"] = f"{t:.3f}"
    url = f"{prom}/api/v1/query?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


GRAFANA_VARS = {"$__rate_interval": "15s", "$__interval": "2s", "$__range": "1m"}


def substitute(expr: str) -> str:
    """Grafana's substitution with every multi-value variable set to All (allValue ``.*``)."""
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    for var in ("$job_id", "$comm", "$collective", "$host"):
        expr = expr.replace(var, ".*")
    assert "$" not in expr, expr
    return expr


def small_workload(step_gap_us: int = 20_000):
    """The simulator's `small` workload with a longer step gap (fewer records/s: gentle on shared CPUs)."""
    from dynamiccl.harness.simulator import workload
    data = yaml.safe_load((ROOT / "dynamiccl/harness/simulator/workloads/small.yaml").read_text())
    data["step_gap_us"] = step_gap_us
    data["name"] = "small-e2e"
    return workload.from_dict(data)


def stop_job(job) -> None:
    """Stop a :class:`dynamiccl.harness.simulator.driver.SimulatedJob` (or None) and wait for it, never raising."""
    if job is None:
        return
    job.stop()
    try:
        job.wait(timeout=30)
    except Exception:
        pass


@dataclass
class Loop:
    tmp: Path
    drop_at_s: float = 25.0
    duration_s: float = 75.0
    ports: dict = field(default_factory=dict)
    procs: dict = field(default_factory=dict)
    changes: list = field(default_factory=list)       # (wall time received, RegimeChange)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def prom(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    def start(self) -> "Loop":
        from prometheus_client import CollectorRegistry, start_http_server

        from dynamiccl.collector.config import TelemetryConfig, default_config
        from dynamiccl.collector.pipeline import Pipeline
        from dynamiccl.collector.telemetry.fake_nvml import FakeNvml
        from dynamiccl.collector.telemetry.gpu import GpuTelemetry
        from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
        from dynamiccl.detector.service import Detector
        from dynamiccl.stack import AlertWebhook, render_alertmanager, render_prometheus
        from dynamiccl.harness.simulator import scenario
        from dynamiccl.harness.simulator.driver import SimulatedJob

        for b in ("prometheus", "prometheus-alertmanager"):
            if shutil.which(b) is None:
                raise FileNotFoundError(b)
        p = self.ports = {k: free_port() for k in ("collector", "detector", "retuner", "prometheus",
                                                   "alertmanager", "alert-log")}
        addrs = {k: f"127.0.0.1:{v}" for k, v in p.items()}
        # webhook
        self.webhook = AlertWebhook("127.0.0.1", p["alert-log"]).start()
        # collector: GPU telemetry through the pynvml stand-in (this machine has no GPU)
        reg = CollectorRegistry()
        self.gpu = GpuTelemetry(TelemetryConfig(interval_s=1.0), nvml=FakeNvml(gpus=2), host="sim-gpu-host",
                                registry=reg)
        sock = self.tmp / "c.sock"
        cfg = default_config().replace(receiver={"listen": (f"unix:{sock}",)}, parquet={"directory": None},
                                       prometheus={"address": addrs["collector"]}, features={"address": None},
                                       telemetry={"gpu": False})
        self.pipeline = Pipeline(cfg, registry=reg).start()
        self.gpu.start()
        # detector in process, fed by the collector's feature stream, /metrics on its own port
        dreg = CollectorRegistry()
        self.detector = Detector(DetectorConfig(baseline=BaselineConfig(warmup=15),
                                                autoencoder=AutoencoderConfig(enabled=True, grace=10)), registry=dreg)
        self._dhttp, _ = start_http_server(p["detector"], addr="127.0.0.1", registry=dreg)
        self.sub = self.pipeline.subscribe()
        # retuner in process (dry run: recommends, writes nothing), fed by the same windows and changes
        self.retuner = None
        try:
            from dynamiccl.retuner.agent import Retuner
            from dynamiccl.retuner.config import RetunerConfig
        except ImportError:
            pass
        else:
            rreg = CollectorRegistry()
            self.retuner = Retuner(RetunerConfig(dry_run=True, tuner_config_path=str(self.tmp / "tuner.conf"),
                                                 audit_path=str(self.tmp / "audit.jsonl"), topology="h100-2x8"),
                                   registry=rreg)
            self._rhttp, _ = start_http_server(p["retuner"], addr="127.0.0.1", registry=rreg)
        self._dthread = threading.Thread(target=self._detect, daemon=True)
        self._dthread.start()
        # Prometheus + Alertmanager with the shipped files (addresses rewritten, 1 s intervals)
        pcfg = render_prometheus(DEPLOY / "prometheus/prometheus.yml", addrs, scrape_interval="1s")
        (self.tmp / "prometheus.yml").write_text(yaml.safe_dump(pcfg))
        (self.tmp / "am.yml").write_text(yaml.safe_dump(render_alertmanager(DEPLOY / "alertmanager/alertmanager.yml",
                                                                             addrs)))
        self._spawn("alertmanager", ["prometheus-alertmanager", f"--config.file={self.tmp / 'am.yml'}",
                                     f"--storage.path={self.tmp / 'am'}", f"--web.listen-address={addrs['alertmanager']}",
                                     "--cluster.listen-address=", f"--web.external-url=http://{addrs['alertmanager']}"])
        self._spawn("prometheus", ["prometheus", f"--config.file={self.tmp / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={self.tmp / 'tsdb'}", f"--web.listen-address={addrs['prometheus']}",
                                   f"--web.external-url=http://{addrs['prometheus']}"])
        assert wait_http(f"http://{addrs['alertmanager']}/-/ready", 30), self.log("alertmanager")
        assert wait_http(f"{self.prom}/-/ready", 30), self.log("prometheus")
        # the job: stationary, then 60 % of every uplink's bandwidth lost at drop_at_s (no recovery)
        sc = scenario.from_dict({"name": "e2e-drop", "duration_s": self.duration_s, "noise_sigma": 0.02, "events": [
            {"at_s": self.drop_at_s, "kind": "bw_drop", "magnitude": 0.6, "nodes": "all"}]})
        self.job = SimulatedJob(small_workload(), sc, collector=f"unix:{sock}", realtime=True,
                                job_id="e2e", out_dir=self.tmp / "sim").start()
        self.epoch_s = self.job.engine.epoch_ns / 1e9
        self.onset_wall = self.epoch_s + self.drop_at_s
        return self

    def _detect(self) -> None:
        from dynamiccl.loop import Loop
        loop = Loop(self.detector, self.retuner, sinks=[lambda c: self.changes.append((time.time(), c))])
        while not self.stop.is_set():
            wf = self.sub.get(timeout=0.5)
            if wf is None:
                continue
            try:
                loop.step(wf)
            except Exception as exc:   # the retuner is not under test here; keep the loop going
                self.retuner_error = exc

    def _spawn(self, name: str, argv: list[str]) -> None:
        logf = open(self.tmp / f"{name}.log", "wb")
        self.procs[name] = (subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT), logf)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def close(self) -> None:
        self.stop.set()
        stop_job(getattr(self, "job", None))
        for name, (proc, logf) in self.procs.items():
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            logf.close()
        for attr in ("gpu", "pipeline"):
            obj = getattr(self, attr, None)
            if obj is not None:
                obj.shutdown()
        for attr in ("_dhttp", "_rhttp"):
            srv = getattr(self, attr, None)
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        if getattr(self, "retuner", None) is not None:
            self.retuner.close()
        if getattr(self, "webhook", None) is not None:
            self.webhook.shutdown()
