"""The window aggregator's buffers are bounded: a flooded window drops (and counts) the excess,
keeps serving, and aggregates exactly the records it kept."""
from __future__ import annotations

import logging
import tracemalloc
import urllib.request

import numpy as np
import pytest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import WindowConfig
from dynamiccl.collector.metrics import DROP_REASONS, SelfMetrics
from dynamiccl.collector.pipeline import Pipeline
from dynamiccl.collector.processors.window_agg import COLUMNS, WindowAggregator
from dynamiccl.harness.collector_testing import SinkConsumer, synthetic_events

from collector_helpers import quiet_config, wait_until  # noqa: F401 (fixture)
from test_collector_aggregate import assert_row_matches, reference  # plain-Python reference of one window

NAMES = {0x1111_2222_3333_4444: "world"}
ROW_BYTES = sum(np.dtype(dt).itemsize for _, dt in COLUMNS)


def _events(n_instances=1000, seed=3):
    return synthetic_events(n_instances, nranks=8, seed=seed, rate_per_s=1e5, straggler_rank=2,
                            funcs=("AllReduce", "AllGather", "Broadcast"))


def _shift(ev, seconds):
    ev = ev.copy()
    for f in ("gpu_start_ns", "gpu_end_ns", "enqueue_ns", "cpu_end_ns"):
        ev[f] += np.uint64(int(seconds * 1e9))
    return ev


def _feed(agg, ev, step=777):
    for i in range(0, len(ev), step):
        agg.consume(RecordBatch(ev[i:i + step], "host0", "jobA", NAMES))


def _agg(**cfg):
    sink, m = SinkConsumer(), SelfMetrics()
    return WindowAggregator(WindowConfig(**cfg), next_consumer=sink, metrics=m), sink, m


def test_window_full_is_a_declared_reason_initialised_at_zero():
    assert "window_full" in DROP_REASONS
    assert SelfMetrics().dropped["window_full"] == 0


def test_flooded_window_drops_exact_excess_and_aggregates_the_kept_records(caplog):
    ev = _events()
    cap = 3000
    agg, sink, m = _agg(window_s=1000.0, max_window_records=cap, max_buffered_records=10 * cap)
    with caplog.at_level(logging.WARNING, logger="dynamiccl.collector.processors.window_agg"):
        _feed(agg, ev)
        _feed(agg, ev)          # keep flooding the full window: everything counted, nothing kept
    agg.shutdown()
    assert m.dropped["window_full"] == 2 * len(ev) - cap
    assert m.aggregated == cap
    assert sum(v for k, v in m.dropped.items() if k != "window_full") == 0
    # logged once, naming the bound, although dozens of batches overflowed
    full = [r for r in caplog.records if "max_window_records" in r.getMessage()]
    assert len(full) == 1 and "window_full" in full[0].getMessage()
    # the kept records are the first `cap` in arrival order, and the window's aggregates are
    # exactly those of a stream that held only them (plain-Python reference)
    (item,) = sink.items
    wf = item.features
    assert wf.keys["records"].sum() == cap
    ref_keys, ref_ranks = reference(ev[:cap], "jobA")
    assert wf.keys.height == len(ref_keys)
    for row in wf.keys.iter_rows(named=True):
        assert_row_matches(row, ref_keys[(row["comm_hash"], row["func"], row["algo"], row["proto"],
                                          row["size_bucket"])])
    assert wf.ranks.height == len(ref_ranks)
    for row in wf.ranks.iter_rows(named=True):
        for col, want in ref_ranks[(row["comm_hash"], row["rank"])].items():
            assert row[col] == pytest.approx(want, rel=1e-7), col


def test_total_bound_across_windows_and_service_recovers_after_close():
    ev = _events(500)           # 4000 records, 40 ms of event time
    agg, sink, m = _agg(window_s=1.0, allowed_lateness_s=0.0, max_window_records=3000,
                        max_buffered_records=4000)
    _feed(agg, ev[:3000])                            # window A: 3000 (its own bound)
    assert m.dropped["window_full"] == 0
    b1 = _shift(ev[:2000], 1.0)
    agg.consume(RecordBatch(b1, "host0", "jobA", NAMES))  # window B: room for 1000 of 2000 (total bound)
    assert m.dropped["window_full"] == 1000
    assert len(sink.items) == 1                      # ... and B's event time closed A
    assert sink.items[0].features.keys["records"].sum() == 3000
    agg.consume(RecordBatch(_shift(ev[2000:4000], 1.0), "host0", "jobA", NAMES))  # B: 1000 + 2000
    assert m.dropped["window_full"] == 1000
    agg.consume(RecordBatch(_shift(ev[:500], 1.0), "host0", "jobA", NAMES))  # B at its 3000 bound
    assert m.dropped["window_full"] == 1500
    agg.consume(RecordBatch(_shift(ev[:10], 2.0), "host0", "jobA", NAMES))  # window C opens, B closes
    agg.shutdown()
    counts = [it.features.keys["records"].sum() for it in sink.items]
    assert counts == [3000, 3000, 10]
    assert m.aggregated == 6010 and m.windows_emitted == 3
    assert m.aggregated + m.dropped["window_full"] == 3000 + 2000 + 2000 + 500 + 10


def test_flood_spread_over_windows_in_one_batch_drops_per_window_excess():
    ev = _events(500)
    parts = [ev[:2000], _shift(ev[:1500], 1.0), _shift(ev[:500], 2.0)]
    batch = np.concatenate(parts)[np.random.default_rng(0).permutation(4000)]  # interleaved
    agg, sink, m = _agg(window_s=1.0, allowed_lateness_s=10.0, max_window_records=1000,
                        max_buffered_records=2300)
    agg.consume(RecordBatch(batch, "host0", "jobA", NAMES))
    agg.shutdown()
    counts = [it.features.keys["records"].sum() for it in sink.items]
    # windows in order: 1000 (own bound), 1000 (own bound), then 300 of 500 (total bound 2300)
    assert counts == [1000, 1000, 300]
    assert m.dropped["window_full"] == 4000 - 2300


def test_running_collector_counts_window_full_and_keeps_serving(quiet_config):
    cfg = quiet_config.replace(prometheus={"address": "127.0.0.1:0"},
                               window={"allowed_lateness_s": 0.0, "max_window_records": 1000,
                                       "max_buffered_records": 1500})
    p = Pipeline(cfg).start()
    try:
        scrape = lambda: urllib.request.urlopen(  # noqa: E731
            f"http://{p.addresses['metrics']}/metrics", timeout=5).read().decode()
        assert 'dynamiccl_collector_records_dropped_total{reason="window_full"} 0.0' in scrape()
        sub = p.subscribe()
        ev = _events(500)                           # 4000 records in one window
        for i in range(0, 4000, 500):
            assert p.source.push(ev[i:i + 500], host="h0", job_id="j0", comm_names=NAMES) == 500
        assert wait_until(lambda: p.metrics.dropped["window_full"] == 3000)
        assert 'dynamiccl_collector_records_dropped_total{reason="window_full"} 3000.0' in scrape()
        # the next window's records close the flooded one: still serving, 1000 records aggregated
        p.source.push(_shift(ev[:800], 1.0), host="h0", job_id="j0", comm_names=NAMES)
        wf = sub.get(timeout=10)
        assert wf.keys["records"].sum() == 1000
        assert p.metrics.dropped["window_full"] == 3000 + 300   # 1000 held + 500 room of 800
    finally:
        p.shutdown()
    assert p.metrics.aggregated == 1500


def _flood_peak(n_batches: int, **cfg) -> tuple[int, int]:
    ev = _events(125)           # 1000 records per batch, all in one window
    agg, _, m = _agg(window_s=1000.0, **cfg)
    batch = RecordBatch(ev, "host0", "jobA", NAMES)
    tracemalloc.start()
    try:
        for _ in range(n_batches):
            agg.consume(batch)
        _, peak = tracemalloc.get_traced_memory()
        held = sum(a.nbytes for win in agg._open.values() for a in win.cols.values())
    finally:
        tracemalloc.stop()
    agg.shutdown()
    return peak, held


def test_memory_stays_bounded_under_flood():
    cap = 5000
    peak, held = _flood_peak(300, max_window_records=cap, max_buffered_records=cap)
    assert held <= cap * ROW_BYTES                  # buffers never grow past the bound
    assert peak < 2_000_000                         # 300k records pushed; ~0.3 MB kept
    # control: without the bound the same flood keeps everything (the check above can fail)
    peak_unbounded, held_unbounded = _flood_peak(300)
    assert held_unbounded >= 300_000 * ROW_BYTES and peak_unbounded > 10 * peak


@pytest.mark.parametrize("field, value, msg", [
    ("max_window_records", 0, "max_window_records must be > 0"),
    ("max_buffered_records", -1, "max_buffered_records must be > 0"),
    ("max_window_records", 1.5, "max_window_records must be an integer"),
    ("max_window_records", 20_000_000, "max_window_records (20000000) must be <= max_buffered_records"),
])
def test_bounds_are_validated_at_start_up(field, value, msg):
    with pytest.raises(ValueError) as exc:
        WindowAggregator(WindowConfig(**{field: value}), next_consumer=SinkConsumer())
    assert msg in str(exc.value)


def test_default_bounds_hold_the_target_rate():
    """2 M records/s, default 1 s window and 2 s lateness: one window holds 2 M records, the
    open windows together (window + lateness) 6 M — both well inside the defaults."""
    cfg = WindowConfig()
    rate = 2_000_000
    assert cfg.max_window_records >= 2 * rate * cfg.window_s
    assert cfg.max_buffered_records >= 2 * rate * (cfg.window_s + cfg.allowed_lateness_s)
