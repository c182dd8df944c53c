"""Per-job feature vector of one window, for the autoencoder.

For each (collective, size bucket) of a job: the median over its communicators of
``log(lat_p50_s)`` and of ``log(busbw_Bps)``; plus the job's median relative cross-rank spread
``spread_p50_s / lat_p50_s``. Names are ``lat:AllReduce:24``, ``bw:AllReduce:24``, ``spread``.
The autoencoder fixes its feature set on the first window it learns and imputes anything
missing later, so a job's vector may vary in content from window to window.

>>> import polars as pl
>>> from dynamiccl.collector.features import KEYS_SCHEMA
>>> keys = pl.DataFrame({"job_id": ["j", "j"], "comm_name": ["a", "b"], "func": ["AllReduce"] * 2,
...     "algo": ["RING"] * 2, "proto": ["SIMPLE"] * 2, "comm_hash": [1, 2], "size_bucket": [20, 20],
...     "nranks": [8, 8], "nnodes": [2, 2], "records": [8, 8], "instances": [1, 1],
...     "bytes_total": [8 << 20] * 2, "lat_mean_s": [1e-3] * 2, "lat_p50_s": [1e-3, 1e-3],
...     "lat_p90_s": [1e-3] * 2, "lat_p99_s": [1e-3] * 2, "lat_max_s": [1e-3] * 2,
...     "algbw_Bps": [1e9] * 2, "busbw_Bps": [1.75e9] * 2, "spread_p50_s": [1e-5] * 2,
...     "spread_max_s": [1e-5] * 2, "tuner_config_version": [0] * 2}, schema=KEYS_SCHEMA)
>>> v = job_vectors(keys)["j"]
>>> sorted(v), round(v["spread"], 3)
(['bw:AllReduce:20', 'lat:AllReduce:20', 'spread'], 0.01)
"""
from __future__ import annotations

import math

import polars as pl

__all__ = ["job_vectors", "MAX_FEATURES"]

MAX_FEATURES = 33


def job_vectors(keys: pl.DataFrame, max_features: int = MAX_FEATURES) -> dict[str, dict[str, float]]:
    if keys.height == 0:
        return {}
    k = keys.filter((pl.col("lat_p50_s") > 0) & pl.col("lat_p50_s").is_finite())
    if k.height == 0:
        return {}
    per = (k.group_by("job_id", "func", "size_bucket")
           .agg(pl.col("lat_p50_s").log().median().alias("lat"),
                pl.col("busbw_Bps").filter(pl.col("busbw_Bps") > 0).log().median().alias("bw"),
                pl.col("records").sum())
           .sort("job_id", "records", descending=[False, True]))
    spread = (k.filter(pl.col("spread_p50_s").is_not_null())
              .group_by("job_id").agg((pl.col("spread_p50_s") / pl.col("lat_p50_s")).median().alias("s")))
    out: dict[str, dict[str, float]] = {}
    n_pairs = max(1, (max_features - 1) // 2)
    for job, func, sb, lat, bw, _ in per.iter_rows():
        v = out.setdefault(job, {})
        if len(v) >= 2 * n_pairs:
            continue
        v[f"lat:{func}:{sb}"] = float(lat)
        if bw is not None and math.isfinite(bw):
            v[f"bw:{func}:{sb}"] = float(bw)
    for job, s in spread.iter_rows():
        if job in out and s is not None and math.isfinite(s):
            out[job]["spread"] = float(s)
    return out
