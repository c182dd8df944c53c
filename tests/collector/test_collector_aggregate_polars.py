"""Window aggregation against a straightforward polars group_by reference on random data.

Several windows, hosts, communicators, sizes that vary within a size bucket (so the bandwidth
median cannot be read off the duration order), untimed and zero-duration records, keys with many
records and keys with few (the aggregator takes different paths for them).
"""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import WindowConfig
from dynamiccl.collector.metrics import DURATION_BUCKETS_S, SelfMetrics
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.harness.collector_testing import SinkConsumer, synthetic_events
from dynamiccl.collector.wire_format import ALGOS, FUNCS, PROTOS

WINDOW_NS = 50_000_000
HOSTS = 3
NRANKS = 6


def _events(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ev = synthetic_events(6000, nranks=NRANKS, seed=seed, rate_per_s=4e4, start_ns=10**18 + 7_000_000,
                          comm_hashes=(11, 22, 0xFFFF_0000_0000_0001), log2_bytes=(0, 24),
                          funcs=("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AlltoAll"),
                          untimed_fraction=0.03, cpu_timed_fraction=0.1, p2p_fraction=0.05)
    inst = np.arange(len(ev)) // NRANKS
    # bytes that vary inside a size bucket (per instance, as NCCL would), and a few 0-byte ops
    jitter = rng.integers(0, 2, inst.max() + 1)[inst].astype(np.uint64)
    ev["bytes"] = np.where(ev["bytes"] > 2, ev["bytes"] + jitter * (ev["bytes"] // 3), ev["bytes"])
    ev["bytes"][(inst % 997) == 5] = 0
    # two heavy keys per communicator (hundreds of records per window): AllReduce with mixed sizes
    # inside bucket 20, Broadcast with one size
    ar = (ev["func"] == FUNCS.index("AllReduce")) & (inst % 2 == 0)
    bc = (ev["func"] == FUNCS.index("Broadcast")) & (inst % 2 == 0)
    ev["algo"][ar | bc], ev["proto"][ar], ev["proto"][bc] = 1, 2, 0
    ev["bytes"][ar] = (1 << 20) + jitter[ar] * (1 << 18)
    ev["bytes"][bc] = 4096
    zero = rng.random(len(ev)) < 0.01          # zero durations (timed)
    gpu = ev["timing_source"] == 1
    ev["gpu_end_ns"] = np.where(zero & gpu, ev["gpu_start_ns"], ev["gpu_end_ns"])
    ev["tuner_config_version"] = rng.choice([0, 0, 4, 9], len(ev))
    if seed == 1:   # gaps in the seqNumbers (sampled-out instances)
        ev = ev[inst % 13 != 4]
    if seed == 2:   # one communicator's seqNumbers too sparse to address directly
        sparse = ev["comm_hash"] == 11
        ev["seq_number"][sparse] = ev["seq_number"][sparse] * 100_003 + 7
    return ev


def _aggregate(ev):
    sink, m = SinkConsumer(), SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=WINDOW_NS / 1e9, allowed_lateness_s=0.05),
                           next_consumer=sink, metrics=m)
    host = ev["rank"] // (NRANKS // HOSTS)
    parts = [ev[host == h] for h in range(HOSTS)]
    for i in range(0, max(len(p) for p in parts), 500):
        for h, p in enumerate(parts):
            if i < len(p):
                agg.consume(RecordBatch(p[i:i + 500], f"host{h}", "jobR", {22: "twenty-two"}))
    agg.shutdown()
    assert not any(m.dropped.values()), m.dropped
    assert m.aggregated == len(ev)
    return sink.items


def _reference_records(ev) -> pl.DataFrame:
    ts = ev["timing_source"].astype(np.int64)
    t = np.where(ts == 1, ev["gpu_start_ns"], ev["enqueue_ns"]).astype(np.int64)
    end = np.where(ts == 1, ev["gpu_end_ns"], ev["cpu_end_ns"]).astype(np.int64)
    d = (end - t) * 1e-9
    df = pl.DataFrame({
        "comm_hash": ev["comm_hash"], "func": [FUNCS[f] for f in ev["func"]],
        "algo": [ALGOS[a] if a < len(ALGOS) else "UNKNOWN" for a in ev["algo"]],
        "proto": [PROTOS[p] if p < len(PROTOS) else "UNKNOWN" for p in ev["proto"]],
        "bytes": ev["bytes"].astype(np.int64), "rank": ev["rank"], "nranks": ev["nranks"],
        "nnodes": ev["nnodes"], "seq": ev["seq_number"].astype(np.int64), "t": t,
        "dur": np.where((ts == 0) | (d < 0), np.nan, d), "tcv": ev["tuner_config_version"],
        "host": [f"host{r // (NRANKS // HOSTS)}" for r in ev["rank"]],
    }).with_columns(pl.col("dur").fill_nan(None), w=pl.col("t") // WINDOW_NS,
                    size_bucket=pl.when(pl.col("bytes") > 0).then(pl.col("bytes").log(2).floor())
                    .otherwise(-1).cast(pl.Int32))
    # size_bucket exactly as integer floor(log2) (float log2 can round up just below a power of 2)
    sb = np.array([int(b).bit_length() - 1 for b in df["bytes"].to_list()], np.int32)
    return df.with_columns(pl.Series("size_bucket", sb),
                           traffic=pl.when(pl.col("func").is_in(["AllGather", "ReduceScatter"]))
                           .then(pl.col("bytes") * pl.col("nranks")).otherwise(pl.col("bytes")).cast(pl.Float64))


KEY = ["w", "comm_hash", "func", "algo", "proto", "size_bucket"]
INST = ["w", "comm_hash", "func", "seq"]


def _reference(df: pl.DataFrame):
    inst = df.group_by(INST).agg(n_t=pl.col("dur").count(), n_all=pl.len(), s_t=pl.col("dur").sum(),
                                 dmin=pl.col("dur").min(), dmax=pl.col("dur").max(),
                                 # relative: float64 cannot hold ~1e18 ns exactly
                                 tmean=(pl.col("t") - 10**18).mean(), nranks=pl.col("nranks").first())
    spread = (df.group_by(INST).agg(pl.col("algo", "proto", "size_bucket").first())
              .join(inst.filter(pl.col("n_t") >= 2), on=INST)
              .with_columns(sp=pl.col("dmax") - pl.col("dmin"))
              .group_by(KEY).agg(spread_p50_s=pl.col("sp").median(), spread_max_s=pl.col("sp").max()))
    q = lambda p: pl.col("dur").quantile(p, interpolation="linear")  # noqa: E731
    bw = pl.col("traffic") / pl.col("dur")
    keys = (df.group_by(KEY).agg(
        records=pl.len(), instances=pl.col("seq").n_unique(), bytes_total=pl.col("bytes").sum(),
        lat_mean_s=pl.col("dur").mean(), lat_p50_s=q(0.5), lat_p90_s=q(0.9), lat_p99_s=q(0.99),
        lat_max_s=pl.col("dur").max(), algbw_Bps=bw.filter(pl.col("dur") > 0).median(),
        nranks=pl.col("nranks").first(), nnodes=pl.col("nnodes").first(),
        tuner_config_version=pl.col("tcv").max().cast(pl.UInt32))
        .join(spread, on=KEY, how="left")
        .with_columns(busbw_Bps=pl.col("algbw_Bps") * pl.when(pl.col("func") == "AllReduce")
                      .then(2 * (pl.col("nranks") - 1) / pl.col("nranks"))
                      .when(pl.col("func").is_in(["AllGather", "ReduceScatter", "AlltoAll"]))
                      .then((pl.col("nranks") - 1) / pl.col("nranks")).otherwise(1.0)))
    # per record: leave-one-out relative duration, strictly-shortest, for the ranks table
    r = df.join(inst, on=INST).with_columns(
        others=(pl.col("s_t") - pl.col("dur")) / (pl.col("n_t") - 1))
    r = r.with_columns(
        rel=pl.when((pl.col("n_t") >= 2) & (pl.col("others") > 0)).then(pl.col("dur") / pl.col("others")),
        at_min=(pl.col("dur") == pl.col("dmin")) & (pl.col("n_t") >= 2))
    nmin = r.group_by(INST).agg(n_min=pl.col("at_min").sum())
    r = r.join(nmin, on=INST).with_columns(short=pl.col("at_min") & (pl.col("n_min") == 1)
                                             & (pl.col("n_all") >= pl.col("nranks")))
    complete = inst.filter(pl.col("n_all") >= pl.col("nranks")).group_by("w", "comm_hash").agg(
        instances_complete=pl.len())
    r = r.with_columns(skew=pl.when(pl.col("n_all") >= 2).then((pl.col("t") - 10**18 - pl.col("tmean")) * 1e-9))
    ranks = (r.group_by("w", "comm_hash", "rank").agg(
        skew_s=pl.col("skew").mean(), last_event_s=pl.col("t").max() * 1e-9,
        host=pl.col("host").first(), records=pl.len(), lat_mean_s=pl.col("dur").mean(),
        rel_lat_mean=pl.col("rel").mean(), shortest_count=pl.col("short").sum().cast(pl.Int64))
        .join(complete, on=["w", "comm_hash"], how="left")
        .with_columns(pl.col("instances_complete").fill_null(0)))
    bounds = np.asarray(DURATION_BUCKETS_S)
    hist = (df.filter(pl.col("dur").is_not_null())
            .with_columns(b=pl.col("dur").map_batches(lambda s: pl.Series(np.searchsorted(bounds, s.to_numpy()))))
            .group_by([*KEY, "host", "b"]).agg(n=pl.len(), s=pl.col("dur").sum()))
    return keys, ranks, hist


def _close(got, want, col, rel):
    a, b = got[col].to_numpy().astype(float), want[col].to_numpy().astype(float)
    assert np.array_equal(np.isnan(a), np.isnan(b)), col
    ok = ~np.isnan(a)
    np.testing.assert_allclose(a[ok], b[ok], rtol=rel, atol=0, err_msg=col)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_polars_group_by(seed):
    ev = _events(seed)
    items = _aggregate(ev)
    keys_ref, ranks_ref, hist_ref = _reference(_reference_records(ev))
    windows = sorted(keys_ref["w"].unique().to_list())
    assert [int(round(it.features.window_start * 1e9)) // WINDOW_NS for it in items] == windows
    assert len(windows) >= 3
    biggest = 0
    for it in items:
        wf = it.features
        w = int(round(wf.window_start * 1e9)) // WINDOW_NS
        got = wf.keys.with_columns(pl.lit(w).alias("w")).sort(KEY)
        want = keys_ref.filter(pl.col("w") == w).sort(KEY)
        assert got.height == want.height
        biggest = max(biggest, got["records"].max())
        for c in KEY:
            assert got[c].to_list() == want[c].cast(got[c].dtype).to_list(), c
        assert set(got["comm_name"].to_list()) <= {"twenty-two", ""}
        for c in ("records", "instances", "bytes_total", "nranks", "nnodes", "tuner_config_version"):
            assert got[c].to_list() == want[c].to_list(), c
        for c in ("lat_mean_s", "lat_max_s"):
            _close(got, want, c, 1e-12)
        # quantiles and medians: exact, or ≤ 4e-9 relative where the packed sort is used
        for c in ("lat_p50_s", "lat_p90_s", "lat_p99_s", "algbw_Bps", "busbw_Bps", "spread_p50_s", "spread_max_s"):
            _close(got, want, c, 1e-8)
        rk = ["comm_hash", "rank"]
        got_r = wf.ranks.sort(rk)
        want_r = ranks_ref.filter(pl.col("w") == w).sort(rk)
        assert got_r.select(rk + ["host", "records", "shortest_count", "instances_complete"]).equals(
            want_r.select(rk + ["host", "records", "shortest_count", "instances_complete"]).cast(
                dict(got_r.select(rk + ["host", "records", "shortest_count", "instances_complete"]).schema)))
        for c in ("lat_mean_s", "rel_lat_mean"):
            _close(got_r, want_r, c, 1e-9)
        # exporter frames: per-rank start skew and last event time (same row order as ranks)
        hashes = {"twenty-two": 22, f"{11:016x}": 11, f"{0xFFFF_0000_0000_0001:016x}": 0xFFFF_0000_0000_0001}
        sk = it.skew.with_columns(comm_hash=pl.col("comm").replace_strict(hashes, return_dtype=pl.UInt64)).sort(rk)
        np.testing.assert_allclose(sk["skew_s"].to_numpy().astype(float), want_r["skew_s"].to_numpy().astype(float),
                                   rtol=0, atol=1e-12)
        le = it.last_event.sort("rank", "last_event_s")
        want_le = want_r.select("rank", "last_event_s").sort("rank", "last_event_s")
        assert le["rank"].to_list() == want_le["rank"].to_list()
        assert le["last_event_s"].to_list() == want_le["last_event_s"].to_list()
        # exporter histograms: per (key, host) bucket counts and sums
        h = it.histograms
        hw = hist_ref.filter(pl.col("w") == w)
        ref = {}
        for row in hw.iter_rows(named=True):
            k = (row["host"], row["func"], row["algo"], row["proto"], row["size_bucket"])
            ref.setdefault((row["comm_hash"],) + k, {})[row["b"]] = (row["n"], row["s"])
        seen = 0
        for i in range(len(h["host"])):
            k = (hashes[h["comm"][i]], h["host"][i], h["func"][i], h["algo"][i], h["proto"][i], int(h["size_bucket"][i]))
            want_b = ref.get(k, {})
            counts = h["counts"][i]
            assert {b: int(c) for b, c in enumerate(counts) if c} == {b: n for b, (n, _) in want_b.items()}, k
            assert h["sum_s"][i] == pytest.approx(sum(s for _, s in want_b.values()), rel=1e-9, abs=1e-15)
            seen += bool(want_b)
        assert seen == len(ref)
    assert biggest >= 300
