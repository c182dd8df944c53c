"""Grouping a window's ``keys`` rows into streams: one row per (job, communicator, collective,
size bucket) with its 64-bit key hash, and the ranks of each stream's communicator reporting."""
from __future__ import annotations

import numpy as np
import polars as pl

from dynamiccl.collector.wire_format import ALGOS, PROTOS

__all__ = ["STREAM_KEY", "group_streams", "reporting", "rank_masks"]

STREAM_KEY = ("job_id", "comm_hash", "func", "size_bucket")
_AP_CODE = {(a, p): i * len(PROTOS) + j for i, a in enumerate(ALGOS) for j, p in enumerate(PROTOS)}
_AP_UNKNOWN = 63
_ALGO_CODE = {a: i for i, a in enumerate(ALGOS)}
_PROTO_CODE = {p: i for i, p in enumerate(PROTOS)}


def group_streams(keys: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray]:
    """One row per stream (lat of the row with most records, sums, (algo, proto) bit set) and
    the streams' 64-bit key hashes. The common case, one row per stream, needs no group_by."""
    if keys.height == 0:
        return pl.DataFrame(), np.zeros(0, np.uint64)
    if "lat_p90_s" not in keys.columns:     # optional: without it no window is seen as mixed
        keys = keys.with_columns(pl.lit(None, dtype=pl.Float64).alias("lat_p90_s"))
    code = (keys.get_column("algo").replace_strict(_ALGO_CODE, default=-1, return_dtype=pl.Int64) * len(PROTOS)
            + keys.get_column("proto").replace_strict(_PROTO_CODE, default=-1, return_dtype=pl.Int64))
    code = code.to_numpy()
    code = np.where((code >= 0) & (code < _AP_UNKNOWN), code, _AP_UNKNOWN)
    bit = np.left_shift(np.uint64(1), code.astype(np.uint64))
    h = keys.select(pl.struct(*STREAM_KEY).hash(seed=7)).to_series().to_numpy()
    hs = np.sort(h)
    if not (hs[1:] == hs[:-1]).any():
        agg = keys.select(*STREAM_KEY, "comm_name", "nnodes", "records", "instances", "bytes_total",
                          pl.col("lat_p50_s").fill_nan(None).alias("lat"),
                          pl.col("lat_p90_s").fill_nan(None).alias("lat90"),
                          pl.Series("ap_bits", bit, dtype=pl.UInt64))
        return agg, h
    k = keys.with_columns(pl.Series("ap_bit", bit, dtype=pl.UInt64),
                          pl.col("lat_p50_s").fill_nan(None), pl.col("lat_p90_s").fill_nan(None))
    agg = k.group_by(STREAM_KEY, maintain_order=True).agg(
        pl.col("comm_name").first(),
        pl.col("nnodes").max(),
        pl.col("records").sum(),
        pl.col("instances").sum(),
        pl.col("bytes_total").sum(),
        pl.col("lat_p50_s").sort_by("records", descending=True).first().alias("lat"),
        pl.col("lat_p90_s").sort_by("records", descending=True).first().alias("lat90"),
        pl.col("ap_bit").unique().sum().alias("ap_bits"),
    )
    return agg, agg.select(pl.struct(*STREAM_KEY).hash(seed=7)).to_series().to_numpy()


def reporting(agg: pl.DataFrame, ranks: pl.DataFrame) -> np.ndarray:
    """Per stream row of ``agg``: ranks of its communicator with records in the ranks frame
    (-1 where the frame says nothing about it)."""
    if ranks is None or ranks.height == 0 or "records" not in ranks.columns:
        return np.full(agg.height, -1, np.int64)
    n = (ranks.filter(pl.col("records") > 0).group_by("job_id", "comm_hash")
         .agg(pl.col("rank").n_unique().cast(pl.Int64).alias("n_reporting")))
    out = agg.select("job_id", "comm_hash").join(n, on=["job_id", "comm_hash"], how="left",
                                                   maintain_order="left")
    return out.get_column("n_reporting").fill_null(-1).to_numpy().astype(np.int64)


def rank_masks(agg: pl.DataFrame, ranks: pl.DataFrame) -> np.ndarray:
    """Per stream row of ``agg``: the ranks of its communicator with records in the ranks frame,
    as bits ``1 << (rank % 64)`` (0 where the frame says nothing about it)."""
    if ranks is None or ranks.height == 0 or "records" not in ranks.columns:
        return np.zeros(agg.height, np.uint64)
    seen = ranks.filter(pl.col("records") > 0).unique(["job_id", "comm_hash", "rank"]).select(
        "job_id", "comm_hash", "rank")
    shift = (seen.get_column("rank").to_numpy().astype(np.int64) % 64).astype(np.uint64)
    bit = np.left_shift(np.ones(seen.height, np.uint64), shift)
    # distinct ranks: their bits' sum is their union
    bits = seen.with_columns(pl.Series("_bit", bit, pl.UInt64)).group_by("job_id", "comm_hash").agg(
        pl.col("_bit").sum().alias("_mask"))
    out = agg.select("job_id", "comm_hash").join(bits, on=["job_id", "comm_hash"], how="left", maintain_order="left")
    return out.get_column("_mask").fill_null(0).to_numpy().astype(np.uint64)
