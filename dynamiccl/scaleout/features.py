"""A merged partial → the collector's ``WindowFeatures`` (the detector's input, unchanged).

Exact (equal to one collector over all records): records, instances, bytes_total, lat_mean_s,
lat_max_s, spread_p50_s, spread_max_s, tuner_config_version, nranks, nnodes; per rank: records,
lat_mean_s, shortest_count, instances_complete. From the fixed-bucket histogram (within one bucket,
2^(1/8)): lat_p50/p90/p99_s, and algbw/busbw from the p50. rel_lat_mean: a rank's mean duration
over the mean of its communicator's other ranks (the collector's per-instance leave-one-out ratio
needs every record).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from dynamiccl.collector.features import KEYS_SCHEMA, RANKS_SCHEMA, WindowFeatures
from dynamiccl.collector.processors.wait import LOSSY_JOB, LOSSY_SCOPES
from dynamiccl.collector.records import busbw_factor
from dynamiccl.collector.wire_format import ALGOS, FUNCS, PROTOS
from dynamiccl.scaleout.partials import _BOUNDS_NS, BOUNDS_S, KEY_COLS, NodePartial
from dynamiccl.scaleout.waits import with_merged_waits

#: an instance whose ranks' enqueues lie further apart gives no waits (the collector's window.max_wait_s)
MAX_WAIT_S = 1.0

__all__ = ["window_features", "hist_quantile"]

_EDGES = np.r_[0.0, BOUNDS_S, 2 * BOUNDS_S[-1]]
_TIMES_NRANKS = {FUNCS.index("AllGather"), FUNCS.index("ReduceScatter")}


def _name(table, code: int) -> str:
    return table[code] if 0 <= code < len(table) else "UNKNOWN"


def hist_quantile(counts: np.ndarray, q: float) -> float:
    """Quantile q of a histogram on the collector's buckets, linear within the bucket.

    >>> round(hist_quantile(np.r_[0, 4, np.zeros(200)], 0.5) * 1e6, 3)   # [10, 10.905] µs
    10.453
    """
    total = counts.sum()
    if total == 0:
        return float("nan")
    target = q * total
    cum = np.cumsum(counts)
    b = int(np.searchsorted(cum, target, side="left"))
    before = cum[b - 1] if b else 0
    frac = (target - before) / counts[b] if counts[b] else 0.0
    return float(_EDGES[b] + (_EDGES[b + 1] - _EDGES[b]) * frac)


def hist_quantiles(counts: np.ndarray, q: float) -> np.ndarray:
    """:func:`hist_quantile` of every row of ``counts`` at once (the same arithmetic, element by element).

    >>> c = np.zeros((2, len(_EDGES) - 1)); c[0, 1] = 4
    >>> [round(x * 1e6, 3) for x in hist_quantiles(c, 0.5).tolist()]
    [10.453, nan]
    """
    total = counts.sum(axis=1)
    target = q * total
    cum = np.cumsum(counts, axis=1)
    b = (cum < target[:, None]).sum(axis=1)          # searchsorted(cum, target, "left") per row
    b = np.minimum(b, counts.shape[1] - 1)
    row = np.arange(len(counts))
    before = np.where(b > 0, cum[row, b - 1], 0)
    cb = counts[row, b]
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(cb != 0, (target - before) / np.where(cb != 0, cb, 1), 0.0)
    out = _EDGES[b] + (_EDGES[b + 1] - _EDGES[b]) * frac
    out[total == 0] = np.nan
    return out


def _key_quantiles(keys: pl.DataFrame, hist: pl.DataFrame) -> dict[str, list[float]]:
    """Per key row, its quantiles from the histogram rows (vectorised: one join, one scatter-add)."""
    nb = len(_EDGES) - 1
    counts = np.zeros((len(keys), nb))
    h = hist.join(keys.select(KEY_COLS).with_row_index("_row"), on=KEY_COLS, how="left", nulls_equal=True)
    if h["_row"].null_count():
        raise ValueError("partial: a histogram row without its key row")
    np.add.at(counts, (h["_row"].to_numpy().astype(np.int64), np.minimum(h["bucket"].to_numpy(), nb - 1)),
              h["count"].to_numpy())
    return {f"lat_p{int(q * 100)}_s": hist_quantiles(counts, q).tolist() for q in (0.5, 0.9, 0.99)}


def _instance_stats(inst: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    spread = ((pl.col("dmax_ns") - pl.col("dmin_ns")) * 1e-9).filter(pl.col("n_t") >= 2)
    per_key = inst.group_by(KEY_COLS).agg(pl.len().alias("instances"),
                                          spread.median().alias("spread_p50_s"), spread.max().alias("spread_max_s"))
    complete = inst.filter(pl.col("n") >= pl.col("nranks"))
    per_comm = complete.group_by(["job_id", "comm_hash"]).agg(pl.len().alias("instances_complete"))
    short = (complete.filter((pl.col("n_t") >= 2) & (pl.col("n_at_min") == 1))
             .group_by(["job_id", "comm_hash", "min_rank"]).agg(pl.len().alias("shortest_count"))
             .rename({"min_rank": "rank"}))
    return per_key, per_comm, short


def _keys_frame(p: NodePartial, per_key: pl.DataFrame) -> pl.DataFrame:
    keys = p["keys"].join(per_key, on=KEY_COLS, how="left").sort(KEY_COLS)
    q = _key_quantiles(keys, p["hist"])
    func = keys["func"].to_numpy()
    nranks = keys["nranks"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        lat_mean = keys["dur_sum_ns"].to_numpy() * 1e-9 / keys["timed"].to_numpy()
        traffic = 2.0 ** keys["size_bucket"].to_numpy() * np.where([f in _TIMES_NRANKS for f in func], nranks, 1)
        algbw = traffic / np.asarray(q["lat_p50_s"])
    return pl.DataFrame({
        "job_id": keys["job_id"], "comm_name": [""] * len(keys),
        "func": [_name(FUNCS, f) for f in func], "algo": [_name(ALGOS, a) for a in keys["algo"]],
        "proto": [_name(PROTOS, x) for x in keys["proto"]], "comm_hash": keys["comm_hash"],
        "size_bucket": keys["size_bucket"], "nranks": keys["nranks"], "nnodes": keys["nnodes"],
        "records": keys["records"], "instances": keys["instances"].fill_null(0),
        "bytes_total": keys["bytes_sum"], "lat_mean_s": pl.Series(lat_mean, nan_to_null=True),
        **{k: pl.Series(v, nan_to_null=True) for k, v in q.items()},
        "lat_max_s": keys["dur_max_ns"] * 1e-9, "algbw_Bps": pl.Series(algbw, nan_to_null=True),
        "busbw_Bps": pl.Series(algbw * busbw_factor(func, nranks), nan_to_null=True),
        "spread_p50_s": keys["spread_p50_s"], "spread_max_s": keys["spread_max_s"],
        "tuner_config_version": keys["tcv"],
    }, schema=KEYS_SCHEMA, strict=False)


def _ranks_frame(p: NodePartial, per_comm: pl.DataFrame, short: pl.DataFrame) -> pl.DataFrame:
    comm = ["job_id", "comm_hash"]
    r = p["ranks"].with_columns((pl.col("dur_sum_ns") * 1e-9 / pl.col("timed")).alias("lat_mean_s"))
    tot = r.group_by(comm).agg(pl.col("dur_sum_ns").sum().alias("_s"), pl.col("timed").sum().alias("_n"))
    r = (r.join(tot, on=comm).join(per_comm, on=comm, how="left")
         .join(short, on=comm + ["rank"], how="left")
         .with_columns((pl.col("lat_mean_s") / ((pl.col("_s") - pl.col("dur_sum_ns")) * 1e-9
                                                 / (pl.col("_n") - pl.col("timed")))).alias("rel_lat_mean"),
                       pl.col("shortest_count").fill_null(0), pl.col("instances_complete").fill_null(0))
         .sort(comm + ["rank"]))
    return r.select(list(RANKS_SCHEMA)).cast(RANKS_SCHEMA).fill_nan(None)


def window_features(p: NodePartial, counters: dict | None = None, max_wait_s: float = MAX_WAIT_S) -> WindowFeatures:
    """The feature-stream window of a (merged) partial; with the nodes' wait records (``waitq``), its
    ``waits`` frame as the single collector forms it (scaleout/waits.py), the outcomes in the counters
    (``wait_<outcome>``; the instances withheld for lost records also by scope, ``wait_lossy_communicator``
    and ``wait_lossy_job``)."""
    per_key, per_comm, short = _instance_stats(p["inst"])
    wf = WindowFeatures(p["window"] * p["window_s"], p["window_s"], _keys_frame(p, per_key),
                        _ranks_frame(p, per_comm, short), dict(counters or {}))
    if p.get("waitq") is None:
        return wf
    wf, counts = with_merged_waits(p, wf, max_wait_s, _BOUNDS_NS, window_features)
    wf.counters.update({f"wait_{k}": v for k, v in counts.as_dict().items()})
    scope = np.bincount(counts.lossy_scope if counts.lossy_scope is not None else np.zeros(0, np.uint8),
                        minlength=LOSSY_JOB + 1)
    wf.counters.update({f"wait_lossy_{name}": int(scope[s]) for s, name in LOSSY_SCOPES.items()})
    return wf
