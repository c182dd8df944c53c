"""Hostile event times: hour-spanning frames, part files bounded, a host whose clock runs ahead."""
from __future__ import annotations

import glob
import os

import numpy as np

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import ParquetConfig, WindowConfig
from dynamiccl.collector.exporters.parquet import ParquetExporter
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.pipeline import Pipeline
from dynamiccl.collector.processors.time_gate import EventTimeGate
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.harness.collector_testing import SinkConsumer, synthetic_events

from collector_helpers import quiet_config  # noqa: F401 (fixture)

HOUR = 3600 * 10**9
T0 = 1_700_000_000 * 10**9 // HOUR * HOUR


def _hour_spanning(n=4000, hours=1000, seed=0):
    """One frame's worth of valid records whose event times spread over ``hours`` hours."""
    ev = synthetic_events(n // 2, nranks=2, start_ns=T0, seed=seed, untimed_fraction=0.0,
                          cpu_timed_fraction=0.0)
    shift = np.random.default_rng(seed).integers(0, hours, len(ev)) * HOUR
    for f in ("gpu_start_ns", "gpu_end_ns", "enqueue_ns", "cpu_end_ns"):
        ev[f] = ev[f] + shift.astype(np.uint64)
    return ev


def test_parquet_keeps_at_most_max_open_files(tmp_path):
    cfg = ParquetConfig(directory=str(tmp_path), row_group_rows=1000, max_buffered_rows=3000,
                        max_open_files=4, writer="thread")
    exp = ParquetExporter(cfg, metrics=SelfMetrics())
    exp.start()
    try:
        exp.consume(RecordBatch(_hour_spanning(hours=50), "h", "j", {}))
        assert len(exp._files) <= 4
    finally:
        exp.shutdown()
    assert exp.metrics.parquet_rows == 4000  # bounded, nothing lost


def test_hour_spanning_frame_is_refused_outside_the_hosts_band(tmp_path, quiet_config):
    cfg = quiet_config.replace(parquet={"directory": str(tmp_path), "writer": "thread"})
    p = Pipeline(cfg).start()
    try:
        good = synthetic_events(500, nranks=2, start_ns=T0)
        p.ingest(RecordBatch(good, "h0", "j", {}))
        p.ingest(RecordBatch(_hour_spanning(), "h0", "j", {}))
    finally:
        p.shutdown()
    m = p.metrics
    assert m.dropped["clock_range"] > 3500               # hours away from the host's clock
    assert m.dropped["invalid"] == 0                      # not double counted as invalid
    assert m.decoded + m.dropped["clock_range"] == 5000
    parts = glob.glob(os.path.join(str(tmp_path), "**", "*.parquet"), recursive=True)
    dirs = {os.path.dirname(f) for f in parts}
    assert len(dirs) <= 2 and len(parts) <= 2            # before: one directory per hour (~1000)


def test_gate_follows_a_clock_running_faster_than_the_wall_clock():
    now = [0.0]
    gate = EventTimeGate(300.0, clock=lambda: now[0])
    t = T0
    for _ in range(100):  # simulated time 200x the wall clock, a batch every 0.1 s
        assert gate.admit("h", np.arange(t, t + 10**9, 10**7, dtype=np.int64)) is None
        now[0] += 0.1
        t += 20 * 10**9


def test_gate_refuses_a_jump_and_reanchors_after_silence():
    now = [0.0]
    gate = EventTimeGate(300.0, reanchor_s=60.0, clock=lambda: now[0])
    assert gate.admit("h", np.array([T0, T0 + 10**9], np.int64)) is None
    now[0] = 1.0
    keep = gate.admit("h", np.array([T0 + 5 * HOUR], np.int64))  # a forged hour-later batch
    assert keep is not None and not keep.any()
    now[0] = 2.0
    assert gate.admit("h", np.array([T0 + 2 * 10**9], np.int64)) is None  # the real clock goes on
    now[0] = 100.0                                                         # silent > reanchor_s
    assert gate.admit("h", np.array([T0 + 5 * HOUR], np.int64)) is None   # restarted: new anchor


def test_a_host_whose_clock_runs_30s_ahead_does_not_make_another_job_late():
    wall_ns = T0 + 100 * 10**9
    m, sink = SelfMetrics(), SinkConsumer()
    agg = WindowAggregator(WindowConfig(window_s=1.0, allowed_lateness_s=2.0, max_skew_s=10.0),
                           next_consumer=sink, metrics=m, clock=lambda: wall_ns / 1e9,
                           wall_clock=lambda: wall_ns / 1e9)
    good = synthetic_events(3000, nranks=2, start_ns=T0, rate_per_s=100)      # 30 s of records
    ahead = synthetic_events(3000, nranks=2, start_ns=T0 + 30 * 10**9, rate_per_s=100, seed=1)
    for i in range(0, len(good), 200):
        wall_ns = int(good["gpu_start_ns"][i]) + 10**8
        agg.consume(RecordBatch(ahead[i:i + 200], "fast-clock", "other", {}))
        agg.consume(RecordBatch(good[i:i + 200], "honest", "j", {}))
    agg.shutdown()
    got = sum(int(it.features.keys.filter(it.features.keys["job_id"] == "j")["records"].sum())
              for it in sink.items)
    assert m.dropped.get("late", 0) == 0
    assert got == len(good)


def test_an_idle_flush_does_not_close_the_windows_of_a_host_ahead_and_make_every_later_record_late():
    """The once-seen attack run where every legitimate record was `late`: under load the aggregator saw no
    batch for idle_flush_s, the idle flush closed every open window, including those a host ahead of
    the wall clock (hour-spanning frames: +5..+15 min) held open, and every on-time record after that
    fell behind the closed mark. The idle flush closes only windows the wall clock has reached."""
    class Clock:
        t = T0 / 1e9 + 100.0

        def __call__(self):
            return self.t

    clock, m, sink = Clock(), SelfMetrics(), SinkConsumer()
    agg = WindowAggregator(WindowConfig(window_s=1.0, idle_flush_s=3.0), next_consumer=sink, metrics=m,
                           clock=clock, wall_clock=clock)
    now_ns = lambda: int(clock.t * 1e9)  # noqa: E731
    ahead = synthetic_events(200, nranks=2, start_ns=now_ns() + 600 * 10**9, rate_per_s=100, seed=1)
    agg.consume(RecordBatch(ahead, "spanner", "span-job", {}))
    clock.t += 3.5                                   # nothing arrives for idle_flush_s
    agg.tick()
    good = synthetic_events(200, nranks=2, start_ns=now_ns(), rate_per_s=1000)
    agg.consume(RecordBatch(good, "honest", "j", {}))
    assert m.dropped.get("late", 0) == 0             # before: all 400 records late
    clock.t += 700                                   # the wall clock reaches the ahead host's windows
    agg.tick()
    agg.shutdown()
    assert m.aggregated == len(good) + len(ahead)
