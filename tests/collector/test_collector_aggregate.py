"""Window aggregation checked against a straightforward reference on a seeded data set."""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import WindowConfig
from dynamiccl.collector.features import KEYS_SCHEMA, RANKS_OPTIONAL, RANKS_SCHEMA
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.harness.collector_testing import SinkConsumer, synthetic_events
from dynamiccl.collector.wire_format import ALGOS, FUNCS, PROTOS

NRANKS = 8
FACTOR = {"AllReduce": lambda n: 2 * (n - 1) / n, "AllGather": lambda n: (n - 1) / n,
          "ReduceScatter": lambda n: (n - 1) / n, "AlltoAll": lambda n: (n - 1) / n}


def _name(table, code):
    return table[code] if code < len(table) else "UNKNOWN"


def assert_row_matches(row: dict, ref: dict) -> None:
    """One key row of a window against the reference's values (None, exact ints, floats to 1e-7)."""
    for col, want in ref.items():
        if want is None:
            assert row[col] is None, col
        elif isinstance(want, int):
            assert row[col] == want, col
        else:
            assert row[col] == pytest.approx(want, rel=1e-7), col


def reference(ev, job_id):
    """Plain-Python reference of the feature-stream contract for one window."""
    recs = []
    for r in ev:
        ts = int(r["timing_source"])
        if ts == 1:
            d = (int(r["gpu_end_ns"]) - int(r["gpu_start_ns"])) * 1e-9
            t = int(r["gpu_start_ns"])
        elif ts == 2:
            d = (int(r["cpu_end_ns"]) - int(r["enqueue_ns"])) * 1e-9
            t = int(r["enqueue_ns"])
        else:
            d, t = None, int(r["enqueue_ns"])
        func = FUNCS[r["func"]]
        b = int(r["bytes"])
        recs.append(dict(comm=int(r["comm_hash"]), func=func, algo=_name(ALGOS, int(r["algo"])),
                         proto=_name(PROTOS, int(r["proto"])), sb=int(math.floor(math.log2(b))),
                         rank=int(r["rank"]), n=int(r["nranks"]), seq=int(r["seq_number"]), b=b,
                         d=d, t=t, v=int(r["tuner_config_version"])))
    keys = defaultdict(list)
    inst = defaultdict(list)
    for x in recs:
        keys[(x["comm"], x["func"], x["algo"], x["proto"], x["sb"])].append(x)
        inst[(x["comm"], x["func"], x["seq"])].append(x)
    out_keys = {}
    for k, xs in keys.items():
        durs = [x["d"] for x in xs if x["d"] is not None]
        bws = [(x["b"] * (x["n"] if x["func"] in ("AllGather", "ReduceScatter") else 1)) / x["d"]
               for x in xs if x["d"]]
        spreads = []
        for s in {x["seq"] for x in xs}:
            ds = [y["d"] for y in inst[(k[0], k[1], s)] if y["d"] is not None]
            if len(ds) >= 2:
                spreads.append(max(ds) - min(ds))
        n = xs[0]["n"]
        med_bw = float(np.median(bws))
        out_keys[k] = dict(records=len(xs), instances=len({x["seq"] for x in xs}),
                           bytes_total=sum(x["b"] for x in xs), lat_mean_s=float(np.mean(durs)),
                           lat_p50_s=float(np.quantile(durs, 0.5)), lat_p90_s=float(np.quantile(durs, 0.9)),
                           lat_p99_s=float(np.quantile(durs, 0.99)), lat_max_s=max(durs),
                           algbw_Bps=med_bw, busbw_Bps=med_bw * FACTOR.get(k[1], lambda n: 1.0)(n),
                           spread_p50_s=float(np.median(spreads)) if spreads else None,
                           spread_max_s=max(spreads) if spreads else None,
                           tuner_config_version=max(x["v"] for x in xs))
    per_rank = defaultdict(lambda: dict(records=0, durs=[], rel=[], short=0, arr=[], fin=[]))
    complete = defaultdict(int)
    for (comm, func, seq), xs in inst.items():
        if len(xs) >= xs[0]["n"]:
            complete[comm] += 1
        ds = [x["d"] for x in xs if x["d"] is not None]
        for x in xs:
            pr = per_rank[(comm, x["rank"])]
            pr["records"] += 1
            if x["d"] is not None:
                pr["durs"].append(x["d"])
        timed = [x for x in xs if x["d"] is not None]
        if len(xs) >= xs[0]["n"] and len(timed) >= 2:   # offsets: complete instances, timed records
            t0 = min(x["t"] for x in timed)
            starts = [(x["t"] - t0) * 1e-9 for x in timed]
            ends = [s + x["d"] for s, x in zip(starts, timed)]
            for x, s, e in zip(timed, starts, ends):
                per_rank[(comm, x["rank"])]["arr"].append(s - np.mean(starts))
                per_rank[(comm, x["rank"])]["fin"].append(e - np.mean(ends))
        if len(ds) >= 2:
            mn = min(ds)
            for x in xs:
                if x["d"] is None:
                    continue
                others = (sum(ds) - x["d"]) / (len(ds) - 1)   # leave-one-out mean of the other ranks
                if others > 0:
                    per_rank[(comm, x["rank"])]["rel"].append(x["d"] / others)
                if x["d"] == mn and ds.count(mn) == 1 and len(xs) >= xs[0]["n"]:  # complete instances vote
                    per_rank[(comm, x["rank"])]["short"] += 1
    out_ranks = {k: dict(records=v["records"], lat_mean_s=float(np.mean(v["durs"])),
                         rel_lat_mean=float(np.mean(v["rel"])), shortest_count=v["short"],
                         instances_complete=complete[k[0]],
                         arr_off_s=float(np.mean(v["arr"])) if v["arr"] else None,
                         fin_off_s=float(np.mean(v["fin"])) if v["fin"] else None)
                  for k, v in per_rank.items()}
    return out_keys, out_ranks


def _run(ev, window_s=1000.0, **cfg):
    sink = SinkConsumer()
    agg = WindowAggregator(WindowConfig(window_s=window_s, **cfg), next_consumer=sink, metrics=SelfMetrics())
    for i in range(0, len(ev), 777):
        agg.consume(RecordBatch(ev[i:i + 777], "host0", "jobA", {0x1111_2222_3333_4444: "world"}))
    agg.shutdown()
    return sink.items, agg


@pytest.fixture(scope="module")
def dataset():
    ev = synthetic_events(3000, nranks=NRANKS, seed=11, straggler_rank=5, rate_per_s=1e5,
                          start_ns=1_700_000_000_000_000_000, untimed_fraction=0.05,
                          cpu_timed_fraction=0.1, funcs=("AllReduce", "AllGather", "ReduceScatter", "Broadcast"))
    # drop some records so some instances are incomplete / single-rank
    rng = np.random.default_rng(5)
    ev = ev[rng.random(len(ev)) > 0.03]
    # the applied tuner-config version: 0 (none) for most records, a few later versions
    ev["tuner_config_version"] = rng.choice([0, 0, 0, 3, 7], len(ev))
    return ev


def test_keys_and_ranks_match_reference(dataset):
    items, _ = _run(dataset)
    assert len(items) == 1
    wf = items[0].features
    assert dict(wf.keys.schema) == KEYS_SCHEMA and dict(wf.ranks.schema) == {**RANKS_SCHEMA, **RANKS_OPTIONAL}
    ref_keys, ref_ranks = reference(dataset, "jobA")
    assert wf.keys.height == len(ref_keys)
    for row in wf.keys.iter_rows(named=True):
        assert row["job_id"] == "jobA" and row["nranks"] == NRANKS and row["nnodes"] == 1
        assert row["comm_name"] == ("world" if row["comm_hash"] == 0x1111_2222_3333_4444 else "")
        assert_row_matches(row, ref_keys[(row["comm_hash"], row["func"], row["algo"], row["proto"],
                                          row["size_bucket"])])
    assert wf.ranks.height == len(ref_ranks)
    for row in wf.ranks.iter_rows(named=True):
        assert row["host"] == "host0" and row["job_id"] == "jobA"
        ref = ref_ranks[(row["comm_hash"], row["rank"])]
        for col, want in ref.items():
            if col in RANKS_OPTIONAL:   # offsets of a few us: absolute tolerance
                assert (row[col] is None) == (want is None), col
                if want is not None:
                    assert row[col] == pytest.approx(want, abs=1e-9), col
                continue
            assert row[col] == pytest.approx(want, rel=1e-7), col
    assert wf.ranks["arr_off_s"].drop_nulls().len() > 0


def test_straggler_looks_short(dataset):
    wf = _run(dataset)[0][0].features
    per_rank = wf.ranks.group_by("rank").agg(
        rel=__import__("polars").col("rel_lat_mean").mean(),
        short=__import__("polars").col("shortest_count").sum()).sort("rank")
    rel = per_rank["rel"].to_list()
    short = per_rank["short"].to_list()
    assert rel[5] == min(rel) and rel[5] < 0.9
    assert short[5] == max(short) and short[5] > 3 * sorted(short)[-2]


def test_busbw_factors_per_func(dataset):
    wf = _run(dataset)[0][0].features
    for row in wf.keys.iter_rows(named=True):
        ratio = row["busbw_Bps"] / row["algbw_Bps"]
        want = {"AllReduce": 1.75, "AllGather": 0.875, "ReduceScatter": 0.875}.get(row["func"], 1.0)
        assert ratio == pytest.approx(want)


def test_windows_by_event_time_lateness_and_late_drops():
    ev = synthetic_events(2000, nranks=4, seed=2, rate_per_s=1000.0, start_ns=10**18)  # 2 s of events
    m = SelfMetrics()
    sink = SinkConsumer()
    agg = WindowAggregator(WindowConfig(window_s=0.5, allowed_lateness_s=0.25), next_consumer=sink, metrics=m)
    agg.consume(RecordBatch(ev, "h", "j", {}))
    # windows whose end + lateness <= newest event time are closed already
    starts = [r.features.window_start for r in sink.items]
    assert starts == [1e9, 1e9 + 0.5, 1e9 + 1.0]
    # a record for a closed window is late: dropped and counted
    agg.consume(RecordBatch(ev[:10], "h", "j", {}))
    assert m.dropped["late"] == 10
    agg.shutdown()
    assert sum(r.features.keys["records"].sum() for r in sink.items) == len(ev)
    assert m.aggregated == len(ev) and m.windows_emitted == 4


def test_idle_flush_uses_wall_clock():
    now = [0.0]
    sink = SinkConsumer()
    agg = WindowAggregator(WindowConfig(window_s=1.0, idle_flush_s=3.0), next_consumer=sink,
                           clock=lambda: now[0])
    agg.consume(RecordBatch(synthetic_events(10, nranks=2), "h", "j", {}))
    agg.tick(2.9)
    assert sink.items == []
    agg.tick(3.0)
    assert len(sink.items) == 1


def test_far_future_record_is_dropped_not_watermarked():
    ev = synthetic_events(10, nranks=2, start_ns=10**18)
    m = SelfMetrics()
    sink = SinkConsumer()
    agg = WindowAggregator(WindowConfig(window_s=1.0, max_open_windows=10), next_consumer=sink, metrics=m)
    agg.consume(RecordBatch(ev[:10], "h", "j", {}))
    bad = ev[10:12].copy()
    bad["gpu_start_ns"] += 3600 * 10**9
    bad["enqueue_ns"] += 3600 * 10**9
    agg.consume(RecordBatch(bad, "h", "j", {}))
    assert m.dropped["too_early"] == 2 and sink.items == []
    agg.consume(RecordBatch(ev[12:], "h", "j", {}))
    agg.shutdown()
    assert sink.items[0].features.keys["records"].sum() == 18


def test_untimed_records_count_but_have_no_latency():
    """Untimed records count in their keys with no latency; their only votes for the shortest value are
    the wait stand-ins' (tests/collector/test_wait_streams.py), none without them."""
    ev = synthetic_events(20, nranks=2, untimed_fraction=1.0, cpu_timed_fraction=0.0)
    wf = _run(ev, wait_streams=False)[0][0].features
    assert wf.keys["records"].sum() == 40
    assert wf.keys["lat_mean_s"].null_count() == wf.keys.height
    assert wf.ranks["shortest_count"].sum() == 0 and wf.waits is None
    with_waits = _run(ev)[0][0].features
    assert with_waits.keys.equals(wf.keys)
    assert with_waits.ranks["shortest_count"].sum() == with_waits.waits["instances"].sum() == 20


def _two_hosts(lag_s: float, max_skew_s: float):
    """Host "fast" reports 20 s of event time before host "slow" reports its first 20 s."""
    ev = synthetic_events(400, nranks=2, rate_per_s=20, start_ns=10**18,   # 20 s of event time
                          untimed_fraction=0.0, cpu_timed_fraction=0.0)
    m, sink = SelfMetrics(), SinkConsumer()
    agg = WindowAggregator(WindowConfig(window_s=1.0, allowed_lateness_s=0.5, max_skew_s=max_skew_s),
                           next_consumer=sink, metrics=m)
    fast, slow = ev[ev["rank"] == 0], ev[ev["rank"] == 1]
    lag = int(lag_s * 1e9)
    agg.consume(RecordBatch(slow[:2], "slow", "j", {}))    # both hosts start together; slow falls behind
    agg._test_done = 2
    for i in range(0, len(fast), 20):      # interleave: slow is `lag_s` of event time behind fast
        agg.consume(RecordBatch(fast[i:i + 20], "fast", "j", {}))
        behind = slow[slow["gpu_start_ns"] <= int(fast["gpu_start_ns"][min(i + 19, len(fast) - 1)]) - lag]
        done = getattr(agg, "_test_done", 0)
        if len(behind) > done:
            agg.consume(RecordBatch(behind[done:], "slow", "j", {}))
            agg._test_done = len(behind)
    rest = slow[getattr(agg, "_test_done", 0):]
    agg.consume(RecordBatch(rest, "slow", "j", {}))
    agg.shutdown()
    return m, sink


def test_lagging_host_within_max_skew_loses_nothing():
    m, sink = _two_hosts(lag_s=5.0, max_skew_s=10.0)
    assert m.dropped.get("late", 0) == 0
    assert sum(int(it.features.keys["records"].sum()) for it in sink.items) == 800


def test_host_lagging_beyond_max_skew_is_dropped_as_late():
    m, sink = _two_hosts(lag_s=8.0, max_skew_s=3.0)
    assert m.dropped.get("late", 0) > 0
    assert sum(int(it.features.keys["records"].sum()) for it in sink.items) + m.dropped["late"] == 800


def test_tuner_config_version_is_max_per_key_and_0_when_none():
    ev = synthetic_events(200, nranks=2, seed=3)
    wf = _run(ev)[0][0].features
    assert wf.keys["tuner_config_version"].to_list() == [0] * wf.keys.height
    ev["tuner_config_version"][ev["seq_number"] % 5 == 1] = 9
    ev["tuner_config_version"][ev["seq_number"] == 2] = 12
    wf = _run(ev)[0][0].features
    k = wf.keys
    seqs = {}
    for r in ev:
        key = (int(r["comm_hash"]), FUNCS[r["func"]], int(r["algo"]), int(r["proto"]), int(r["bytes"]).bit_length() - 1)
        seqs[key] = max(seqs.get(key, 0), int(r["tuner_config_version"]))
    got = {(row["comm_hash"], row["func"], ALGOS.index(row["algo"]), PROTOS.index(row["proto"]), row["size_bucket"]):
           row["tuner_config_version"] for row in k.iter_rows(named=True)}
    assert got == seqs and {0, 9, 12} <= set(got.values())


@pytest.mark.parametrize("n_comms", [100, 200])
def test_many_communicators_match_reference(n_comms):
    # > 64 communicator codes (> 128 for 200): key ids take their wide paths
    ev = synthetic_events(1500, nranks=4, seed=9, comm_hashes=tuple(range(1000, 1000 + n_comms)), rate_per_s=1e5)
    items, agg = _run(ev)
    assert len(items) == 1 and len(agg.gcomms.values) == n_comms
    wf = items[0].features
    ref_keys, ref_ranks = reference(ev, "jobA")
    assert wf.keys.height == len(ref_keys) and wf.ranks.height == len(ref_ranks)
    for row in wf.keys.iter_rows(named=True):
        ref = ref_keys[(row["comm_hash"], row["func"], row["algo"], row["proto"], row["size_bucket"])]
        for col in ("records", "instances", "bytes_total", "lat_p50_s", "lat_p99_s", "lat_max_s", "algbw_Bps"):
            assert row[col] == pytest.approx(ref[col], rel=1e-7), col
