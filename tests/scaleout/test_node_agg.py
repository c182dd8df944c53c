"""The node collector's numpy group-bys equal polars group-bys over the same records, frame for frame
(the reference below is the straightforward polars formulation of ``partials.node_partial``)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dynamiccl.collector.records import event_time_ns, size_bucket
from dynamiccl.collector.wire_format import TimingSource
from dynamiccl.harness.collector_testing import synthetic_events
from dynamiccl.scaleout.partials import _BOUNDS_NS, INST_COLS, KEY_COLS, node_partial

_M40 = (1 << 40) - 1


def _record_frame(ev: np.ndarray, job_id: str, host: str, window_start_ns: int) -> pl.DataFrame:
    ts = ev["timing_source"]
    gpu = ts == TimingSource.KERNEL_GPU
    t = event_time_ns(ev)
    end = np.where(gpu, ev["gpu_end_ns"], ev["cpu_end_ns"]).view(np.int64)
    dns = end - t
    timed = (gpu | (ts == TimingSource.KERNEL_CPU)) & (dns >= 0)
    return pl.DataFrame({
        "job_id": pl.Series([job_id] * len(ev), dtype=pl.String),
        "comm_hash": ev["comm_hash"], "func": ev["func"].astype(np.int32),
        "algo": ev["algo"].astype(np.int32), "proto": ev["proto"].astype(np.int32),
        "size_bucket": size_bucket(ev["bytes"]), "seq": (ev["seq_number"] & _M40).astype(np.int64),
        "rank": ev["rank"].astype(np.int32), "nranks": ev["nranks"].astype(np.int32),
        "nnodes": ev["nnodes"].astype(np.int32), "bytes": ev["bytes"].astype(np.int64),
        "tcv": ev["tuner_config_version"].astype(np.int64), "timed": timed,
        "dur_ns": pl.Series(np.where(timed, dns, 0)).cast(pl.Int64),
        "dur_or_null": pl.Series(np.where(timed, dns, -1)).cast(pl.Int64).replace(-1, None),
        "bucket": np.searchsorted(_BOUNDS_NS, dns, side="left").astype(np.int32),
        "start_ns": t - window_start_ns, "host": pl.Series([host] * len(ev), dtype=pl.String),
    })


def reference(ev: np.ndarray, *, node: str, job_id: str, window: int, window_s: float) -> dict:
    """The partial of one node's records (``wire_format.EVENT_DTYPE``) of window ``window``."""
    window_start_ns = int(round(window * window_s * 1e9))
    df = _record_frame(ev, job_id, node, window_start_ns)
    keys = df.group_by(KEY_COLS).agg(
        pl.len().alias("records"), pl.col("bytes").sum().alias("bytes_sum"),
        pl.col("timed").sum().cast(pl.Int64).alias("timed"), pl.col("dur_ns").sum().alias("dur_sum_ns"),
        pl.col("dur_or_null").max().alias("dur_max_ns"), pl.col("tcv").max().alias("tcv"),
        pl.col("nranks").first(), pl.col("nnodes").first())
    hist = (df.filter(pl.col("timed")).group_by(KEY_COLS + ["bucket"]).agg(pl.len().alias("count")))
    dmin = pl.col("dur_or_null").min()
    inst = df.group_by(INST_COLS).agg(
        pl.col("algo").min(), pl.col("proto").min(), pl.col("size_bucket").min(), pl.col("nranks").max(),
        pl.len().alias("n"), pl.col("timed").sum().cast(pl.Int64).alias("n_t"),
        dmin.alias("dmin_ns"),
        pl.col("dur_or_null").max().alias("dmax_ns"),
        (pl.col("dur_or_null") == dmin).sum().cast(pl.Int64).alias("n_at_min"),
        pl.col("rank").filter(pl.col("dur_or_null") == dmin).first().alias("min_rank"))
    ranks = df.group_by(["job_id", "comm_hash", "rank"]).agg(
        pl.len().alias("records"), pl.col("timed").sum().cast(pl.Int64).alias("timed"),
        pl.col("dur_ns").sum().alias("dur_sum_ns"), pl.col("host").first())
    return {"node": node, "window": int(window), "window_s": float(window_s),
            "keys": keys, "hist": hist, "inst": inst, "ranks": ranks}



@pytest.mark.parametrize("seed", [0, 4])
def test_numpy_partial_equals_polars_group_bys(seed):
    ev = synthetic_events(3000, nranks=8, seed=seed, rate_per_s=3000.0, straggler_rank=5,
                          untimed_fraction=0.1, cpu_timed_fraction=0.2, p2p_fraction=0.1,
                          comm_hashes=(1, 2, 0xFFFF_FFFF_FFFF_FFF0))
    ev["rank"][::97] = 3                     # ties and odd ranks
    if seed:
        ev["tuner_config_version"][len(ev) // 2:] = 7   # a retune inside the window
    got = node_partial(ev, node="n", job_id="j", window=0, window_s=1.0)
    want = reference(ev, node="n", job_id="j", window=0, window_s=1.0)
    order = {"keys": KEY_COLS, "hist": KEY_COLS + ["bucket"], "inst": INST_COLS,
             "ranks": ["job_id", "comm_hash", "rank"]}
    for name, cols in order.items():
        a, b = got[name].sort(cols), want[name].sort(cols).select(got[name].columns)
        assert a.schema == b.schema, name
        assert a.equals(b), name
