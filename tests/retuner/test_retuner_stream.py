"""The retuner's inputs and outputs as the pipeline sees them: feature-stream windows (attributed by time),
the NDJSON service with reconnects, /metrics with the names docs/architecture.md declares."""
from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from dynamiccl.collector.features import KEYS_SCHEMA, WindowFeatures, empty_ranks, encode_line
from dynamiccl.retuner.agent import Retuner, observations_from_window
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig
from dynamiccl.retuner.metrics import METRICS

from retuner_fakejob import rc

ROOT = Path(__file__).resolve().parents[2]


def window(t0: float, rows: list[dict]) -> WindowFeatures:
    base = {"job_id": "job", "comm_name": "dp0", "func": "AllReduce", "algo": "RING", "proto": "SIMPLE",
            "comm_hash": 0x1f, "size_bucket": 24, "nranks": 2, "nnodes": 2, "records": 128, "instances": 64,
            "bytes_total": 0, "lat_mean_s": 1e-3, "lat_p50_s": 1e-3, "lat_p90_s": 1.02e-3, "lat_p99_s": 1.05e-3,
            "lat_max_s": 1.1e-3, "algbw_Bps": 0.0, "busbw_Bps": 0.0, "spread_p50_s": 0.0, "spread_max_s": 0.0}
    keys = pl.DataFrame([{**base, **r} for r in rows], schema=KEYS_SCHEMA)
    return WindowFeatures(t0, 1.0, keys, empty_ranks(), {})


def test_window_rows_become_observations():
    wf = window(10.0, [{}, {"func": "Send", "algo": "UNKNOWN", "proto": "UNKNOWN"}, {"lat_mean_s": None}])
    (o,) = observations_from_window(wf)
    assert (o.target.key, o.target.nranks, o.target.comm_name) == ((0x1f, "AllReduce", 24), 2, "dp0")
    assert (o.t_start, o.t_end, o.n, o.algo, o.proto) == (10.0, 11.0, 64, "RING", "SIMPLE")
    assert o.var_s2 == pytest.approx(((1.02e-3 - 1e-3) / 1.2816) ** 2)


def test_windows_are_attributed_by_time_and_straddling_windows_dropped(tmp_path):
    cfg = RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "t.conf"), audit_path=None,
                        policy=PolicyConfig(tune_at_start=False, apply_grace_s=0.5))
    rt = Retuner(cfg)
    for i in range(5):
        rt.on_window(window(float(i), [{"lat_mean_s": 1e-3 * (1 + (i >= 4))}]))
    rt.on_change(rc("rc-1", "latency", 5.0))
    t = 5.0
    (ts,) = rt.targets.values()
    while not ts.applies:                                     # until the first probe is pushed
        rt.on_window(window(t, [{"lat_mean_s": 2e-3}]))
        t += 1.0
        assert t < 20
    t_apply, probe = ts.applies[-1]
    dropped = rt.metrics.dropped["unattributed"]
    rt.on_window(window(t_apply - 0.3, [{"algo": probe.algo, "proto": probe.proto}]))   # straddles the push
    rt.on_window(window(t_apply + 0.2, [{"algo": probe.algo, "proto": probe.proto}]))   # inside the grace
    assert rt.metrics.dropped["unattributed"] == dropped + 2
    x = rt.explorations[ts.exploration]
    n = x.stats[probe].n
    rt.on_window(window(t_apply + 0.6, [{"algo": probe.algo, "proto": probe.proto}]))
    assert rt.metrics.dropped["unattributed"] == dropped + 2 and x.stats[probe].n == n + 64


def test_metric_names_are_the_ones_the_architecture_declares():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    line = next(x for x in doc.splitlines() if x.startswith("Retuner (declared in `dynamiccl/retuner/metrics.py`)"))
    line += doc.split(line, 1)[1].split("\n\n", 1)[0]
    declared = set(re.findall(r"`(dynamiccl_retuner_[a-z_]+)", line))
    names = {m.name for m in METRICS}
    assert declared and declared <= names
    for m in METRICS:
        assert m.name.startswith("dynamiccl_retuner_")
        assert (m.type == "counter") == m.name.endswith("_total")
        assert "job" not in m.labels and "instance" not in m.labels


class _Server:
    """A one-client NDJSON server: accept, send lines, keep the connection open until closed."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            while True:
                c, _ = self.sock.accept()
                self.conns.append(c)
        except OSError:
            pass

    def send(self, data: bytes, timeout: float = 10.0) -> None:
        t = time.time()
        while not self.conns and time.time() - t < timeout:
            time.sleep(0.02)
        self.conns[-1].sendall(data)

    def close(self) -> None:
        for c in self.conns:
            c.close()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _wait(pred, timeout=10.0):
    t = time.time()
    while time.time() - t < timeout:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_service_reads_both_streams_serves_metrics_and_survives_bad_lines(tmp_path):
    from dynamiccl.retuner.service import RetunerService
    changes, features = _Server(), _Server()
    cfg = RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "t.conf"),
                        audit_path=str(tmp_path / "audit.jsonl"), policy=PolicyConfig(tune_at_start=False),
                        changes=f"tcp:127.0.0.1:{changes.port}", features=f"tcp:127.0.0.1:{features.port}",
                        metrics="127.0.0.1:0", jobs=("*",), allow_unauthenticated=True)
    svc = RetunerService(cfg).start()
    try:
        features.send(b"".join(encode_line(window(float(i), [{}])) for i in range(5)) + b"{broken\n")
        assert _wait(lambda: svc.retuner.metrics.counters["windows"] == 5)
        changes.send(b"garbage\n" + rc("rc-1", "latency", 5.0).to_json().encode() + b"\n")
        assert _wait(lambda: svc.retuner.metrics.counters["changes"] == 2)
        assert _wait(lambda: (tmp_path / "t.conf").exists())
        body = urllib.request.urlopen(f"http://{svc.metrics_address}/metrics", timeout=5).read().decode()
        assert 'dynamiccl_retuner_inputs_dropped_total{reason="malformed"} 2.0' in body
        assert "dynamiccl_retuner_pushes_total 1.0" in body and "dynamiccl_retuner_dry_run 0.0" in body
        # the detector restarts: the service reconnects and keeps going
        changes.close()
        changes2 = _Server(changes.port)
        changes2.send(rc("rc-2", "recovery", 9.0, magnitude=0.5, recovers="rc-1").to_json().encode() + b"\n",
                      timeout=15.0)
        assert _wait(lambda: svc.retuner.metrics.counters["changes"] == 3, timeout=15.0)
        changes2.close()
    finally:
        svc.stop()
        features.close()


def test_cli_run_rejects_a_bad_config_with_a_clear_error(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "dynamiccl", "retuner", "run", "--apply", "--topology", "nope",
                          "--tuner-config", str(tmp_path / "t.conf")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "topology" in out.stderr and "nope" in out.stderr
    out = subprocess.run([sys.executable, "-m", "dynamiccl", "retuner", "run", "--deny", "RING/XX"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "deny[0]" in out.stderr
