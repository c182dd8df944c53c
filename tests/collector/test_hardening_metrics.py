"""/metrics under forged label floods: one series budget, idle eviction, expiring last-window gauges."""
from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import PrometheusConfig, WindowConfig
from dynamiccl.collector.exporters.prometheus import PrometheusExporter
from dynamiccl.collector.metrics import PluginStats, SelfMetrics
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.harness.collector_testing import synthetic_events


class Clock:
    t = 1000.0

    def __call__(self):
        return self.t


def _setup(**prom):
    clock, m = Clock(), SelfMetrics()
    exp = PrometheusExporter(PrometheusConfig(address=None, **prom), metrics=m, registry=CollectorRegistry(),
                             clock=clock)
    agg = WindowAggregator(WindowConfig(), next_consumer=exp, metrics=m, clock=clock)
    return clock, exp, agg


def _window(agg, jobs, start_ns, n=4):
    for job in jobs:
        ev = synthetic_events(n * (10 if job == "legit" else 1), nranks=2, start_ns=start_ns, funcs=("AllReduce",), log2_bytes=(20, 21))
        agg.consume(RecordBatch(ev, f"host-{job}", job, {}))
    agg.shutdown()  # closes the window(s)


def _series(exp, job=None):
    text = generate_latest(exp.registry).decode()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    return [ln for ln in lines if job is None or f'job_id="{job}"' in ln], len(text)


def test_forged_label_flood_is_bounded_and_a_reporting_job_keeps_its_series():
    clock, exp, agg = _setup(max_series=2000, series_min_idle_s=60.0, max_window_series=250)
    t = 1_700_000_000 * 10**9
    _window(agg, ["legit"], t)
    legit_before = len(_series(exp, "legit")[0])
    _window(agg, [f"forged{i}" for i in range(1000)] + ["legit"], t + 10**9)
    lines, size = _series(exp)
    assert exp.state.budget.series <= 2000
    assert size < (2000 + 4 * 250) * 200          # before: 2000 label sets per table (48 k series)
    assert len(_series(exp, "legit")[0]) >= legit_before
    assert exp.state.series_dropped > 0
    clock.t += 120                                 # the flood has gone idle: a new job gets in
    _window(agg, ["newjob"], t + 2 * 10**9)
    assert any("dynamiccl_collectives_total" in ln for ln in _series(exp, "newjob")[0])


def test_last_window_gauges_expire_when_windows_stop():
    clock, exp, agg = _setup(gauge_ttl_s=15.0)
    _window(agg, ["j"], 1_700_000_000 * 10**9)
    bw = lambda: [ln for ln in _series(exp, "j")[0] if ln.startswith("dynamiccl_bus_bandwidth")]  # noqa: E731
    assert bw()
    clock.t += 10
    assert bw()
    clock.t += 10                                  # 20 s without a window: the job ended or hangs
    assert not bw()
    assert any(ln.startswith("dynamiccl_collectives_total") for ln in _series(exp, "j")[0])  # counters stay


def test_delivery_gap_and_plugin_stat_tables_are_bounded_and_keep_totals():
    m = SelfMetrics(max_gap_label_sets=4)
    for i in range(10):
        m.gap(f"job{i}", "h", 3, 1)
    assert len(m.gap_records) <= 4 and sum(m.gap_records.values()) == 30 and sum(m.gaps.values()) == 10
    ps = PluginStats()
    for i in range(10):
        ps.update(f"job{i}", "h", ("h", i, 0), {"records_sent": 5})
    totals = ps.totals(max_label_sets=4)
    assert len(totals) <= 4 and sum(v["records_sent"] for v in totals.values()) == 50
    assert ("job9", "h") in totals  # the most recently reporting processes keep their labels


def test_metrics_server_bounds_idle_connections_and_still_answers():
    import socket
    import threading
    import urllib.request

    from collector_helpers import wait_until

    m = SelfMetrics()
    exp = PrometheusExporter(PrometheusConfig(address="127.0.0.1:0", max_clients=4, request_timeout_s=0.5),
                             metrics=m, registry=CollectorRegistry())
    exp.start()
    host, port = exp.address.rsplit(":", 1)
    threads_before = threading.active_count()
    idle = [socket.create_connection((host, int(port))) for _ in range(20)]
    try:
        assert wait_until(lambda: m.refusals["metrics_limit"] >= 16)
        assert threading.active_count() <= threads_before + 4   # before: a thread per idle connection
        assert wait_until(lambda: m.refusals["metrics_timeout"] >= 4)  # the idle ones are cut
        body = urllib.request.urlopen(f"http://{exp.address}/metrics", timeout=5).read()
        assert b"dynamiccl_collector_connections_refused_total" in body
    finally:
        for s in idle:
            s.close()
        exp.shutdown()


def test_a_busy_job_wins_the_budget_over_a_simultaneous_flood_of_small_label_sets():
    clock, exp, agg = _setup(max_series=2000, series_min_idle_s=60.0, max_window_series=250)
    _window(agg, [f"forged{i}" for i in range(1000)] + ["legit"], 1_700_000_000 * 10**9)  # one window
    assert any("dynamiccl_collectives_total" in ln for ln in _series(exp, "legit")[0])
