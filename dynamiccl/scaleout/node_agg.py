"""The node partial's group-bys over the fixed-size records (the node collector's hot path).

Each grouping packs its key columns into one int64. The few-group ones (keys, histogram, ranks) are
polars hash group-bys on that one column; the instances (many groups, records arriving nearly in
instance order) are a stable sort (runs make it cheap; a group's first record is its first in arrival
order) with sums by ``np.add.reduceat`` over int64 (exact) and extremes by ``minimum/maximum.reduceat``. The output frames are the ones ``partials.node_partial`` documents,
with the same columns and dtypes.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from dynamiccl.collector.records import event_time_ns, size_bucket
from dynamiccl.collector.wire_format import TimingSource

__all__ = ["aggregate", "compact", "timing", "duration_bucket", "KEPT_FIELDS"]

#: the record fields a partial reads as they are (``compact`` adds each record's duration and whether
#: it is timed, from the timestamps)
KEPT_FIELDS = ("comm_hash", "func", "algo", "proto", "bytes", "seq_number", "rank", "nranks", "nnodes",
               "tuner_config_version")

_M40 = (1 << 40) - 1
_NONE = np.iinfo(np.int64).max      # an untimed record's duration in a minimum
_UNTIMED_BUCKET = 255                # never counted in the histogram


def duration_bucket(dns: np.ndarray, bounds_ns: np.ndarray) -> np.ndarray:
    """``searchsorted(bounds_ns, dns, 'left')``; the bounds are whole nanoseconds, so the search runs
    on int64 (twice as fast as on float, same result)."""
    return np.searchsorted(bounds_ns.astype(np.int64), dns, "left")


def _comm_ids(ch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct comm hashes sorted, each record's index into them); a window has few comms."""
    u = np.unique(ch[:4096])
    idx = np.minimum(np.searchsorted(u, ch), len(u) - 1)
    if not np.array_equal(u[idx], ch):
        u, idx = np.unique(ch, return_inverse=True)
    if len(u) >= 1 << 15:
        raise ValueError(f"node partial: {len(u)} communicators in one window (at most 32767)")
    return u, idx.astype(np.int64)


def _groups(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stable order, sorted keys, group starts) of one packed key."""
    order = np.argsort(key, kind="stable")
    s = key[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if len(s) else np.zeros(0, np.int64)
    return order, s, starts


def timing(ev: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(timed, duration ns or 0) of records with event times ``t``: GPU end for KERNEL_GPU, CPU end
    for KERNEL_CPU; untimed or negative durations count as untimed."""
    ts = ev["timing_source"]
    gpu = ts == TimingSource.KERNEL_GPU
    dns = np.where(gpu, ev["gpu_end_ns"], ev["cpu_end_ns"]).view(np.int64) - t
    timed = (gpu | (ts == TimingSource.KERNEL_CPU)) & (dns >= 0)
    return timed, np.where(timed, dns, 0)


def compact(ev: np.ndarray, t: np.ndarray | None = None) -> dict:
    """The columns a partial reads, out of the 128-byte records (``t``: their event times, when the
    caller has them; kept as column ``t``: an untimed record's enqueue, for the waits; contiguous copies)."""
    t = event_time_ns(ev) if t is None else t
    timed, dur = timing(ev, t)
    out = {f: np.ascontiguousarray(ev[f]) for f in KEPT_FIELDS}
    out.update(timed=timed, dur=dur, t=np.asarray(t, np.int64))
    return out


def _columns(c: dict, bounds_ns: np.ndarray) -> dict:
    timed, dur = c["timed"], c["dur"]
    bucket = np.full(len(dur), _UNTIMED_BUCKET, np.int64)
    bucket[timed] = duration_bucket(dur[timed], bounds_ns)
    return {"timed": timed, "dur": dur, "bucket": bucket, "sb": size_bucket(c["bytes"]).astype(np.int64)}


def _split_key(k: np.ndarray, comms: np.ndarray, job_id: str) -> dict:
    return {"job_id": pl.Series([job_id] * len(k), dtype=pl.String), "comm_hash": comms[k >> 40],
            "func": ((k >> 32) & 255).astype(np.int32), "algo": ((k >> 24) & 255).astype(np.int32),
            "proto": ((k >> 16) & 255).astype(np.int32), "size_bucket": (((k >> 8) & 255) - 1).astype(np.int32)}


def _keys_and_hist(ev, c, cid, comms, job_id) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One hash group-by (polars) over the records on the packed (key, bucket); the keys are then
    summed over their buckets (a window has few keys: no sort of the records)."""
    kb = ((cid << 40) | (ev["func"].astype(np.int64) << 32) | (ev["algo"].astype(np.int64) << 24)
          | (ev["proto"].astype(np.int64) << 16) | ((c["sb"] + 1) << 8) | c["bucket"])
    g = (pl.DataFrame({"k": kb, "t": c["timed"], "d": c["dur"], "dt": np.where(c["timed"], c["dur"], -1),
                       "bytes": ev["bytes"]}).with_row_index("i")
         .group_by("k").agg(pl.len().alias("n"), pl.col("bytes").sum().cast(pl.Int64), pl.col("d").sum(),
                            pl.col("dt").max(), pl.col("i").min()))
    g = g.with_columns((pl.col("k") // 256).alias("key"), (pl.col("k") % 256).alias("b"))
    tcv = ev["tuner_config_version"].astype(np.int64)
    kg = g.group_by("key").agg(pl.col("n").sum().alias("records"), pl.col("bytes").sum(),
                               pl.col("n").filter(pl.col("b") != _UNTIMED_BUCKET).sum().alias("timed"),
                               pl.col("d").sum(), pl.col("dt").max(), pl.col("i").min()).sort("key")
    first = kg["i"].to_numpy()                               # the key's first record in arrival order
    key = kg["key"].to_numpy() << 8
    keys = pl.DataFrame({
        **_split_key(key, comms, job_id), "records": kg["records"].cast(pl.UInt32), "bytes_sum": kg["bytes"],
        "timed": kg["timed"].cast(pl.Int64), "dur_sum_ns": kg["d"], "dur_max_ns": kg["dt"].replace(-1, None),
        "tcv": _max_per_key(tcv, kb >> 8, kg["key"].to_numpy()),
        "nranks": ev["nranks"][first].astype(np.int32), "nnodes": ev["nnodes"][first].astype(np.int32)})
    h = g.filter(pl.col("b") != _UNTIMED_BUCKET).sort("k")
    hk = h["k"].to_numpy()
    hist = pl.DataFrame({**_split_key(hk, comms, job_id), "bucket": (hk & 255).astype(np.int32),
                         "count": h["n"].cast(pl.UInt32)})
    return keys, hist


def _max_per_key(v: np.ndarray, key: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Max of ``v`` per key; the tuner config version is the same for a whole window as a rule,
    so one comparison settles it and the group-by runs only when it differs."""
    if v.min() == v.max():
        return np.full(len(keys), v[0], np.int64)
    m = pl.DataFrame({"k": key, "v": v}).group_by("k").agg(pl.col("v").max()).sort("k")
    return m["v"].to_numpy()


def _instances(ev, c, cid, comms, job_id) -> pl.DataFrame:
    ik = (cid << 48) | (ev["func"].astype(np.int64) << 40) | (ev["seq_number"] & _M40).astype(np.int64)
    order, s, starts = _groups(ik)
    timed, dur = c["timed"][order], c["dur"][order]
    dmin = np.minimum.reduceat(np.where(timed, dur, _NONE), starts)
    dmax = np.maximum.reduceat(np.where(timed, dur, -1), starts)
    grp = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(s)]))
    at_min = timed & (dur == dmin[grp])
    hit = np.flatnonzero(at_min)
    first_hit = hit[np.r_[True, grp[hit][1:] != grp[hit][:-1]]] if len(hit) else hit
    min_rank = np.full(len(starts), -1, np.int64)
    min_rank[grp[first_hit]] = ev["rank"][order][first_hit]
    k = s[starts]
    none = dmin == _NONE
    return pl.DataFrame({
        "job_id": pl.Series([job_id] * len(k), dtype=pl.String), "comm_hash": comms[k >> 48],
        "func": ((k >> 40) & 255).astype(np.int32), "seq": (k & _M40).astype(np.int64),
        "algo": np.minimum.reduceat(ev["algo"][order], starts).astype(np.int32),
        "proto": np.minimum.reduceat(ev["proto"][order], starts).astype(np.int32),
        "size_bucket": np.minimum.reduceat(c["sb"][order], starts).astype(np.int32),
        "nranks": np.maximum.reduceat(ev["nranks"][order], starts).astype(np.int32),
        "n": np.diff(np.r_[starts, len(s)]).astype(np.uint32),
        "n_t": np.add.reduceat(timed.astype(np.int64), starts),
        "dmin_ns": pl.Series(np.where(none, -1, dmin)).replace(-1, None),
        "dmax_ns": pl.Series(dmax).replace(-1, None),
        "n_at_min": np.add.reduceat(at_min.astype(np.int64), starts),
        "min_rank": pl.Series(min_rank).replace(-1, None).cast(pl.Int32)})


def _ranks(ev, c, cid, comms, job_id, host) -> pl.DataFrame:
    rk = (cid << 32) | (ev["rank"].astype(np.int64) & 0xFFFFFFFF)
    g = (pl.DataFrame({"k": rk, "t": c["timed"], "d": c["dur"]})
         .group_by("k").agg(pl.len().alias("records"), pl.col("t").sum().cast(pl.Int64), pl.col("d").sum()).sort("k"))
    k = g["k"].to_numpy()
    return pl.DataFrame({
        "job_id": pl.Series([job_id] * len(k), dtype=pl.String), "comm_hash": comms[k >> 32],
        "rank": (k & 0xFFFFFFFF).astype(np.int32), "records": g["records"].cast(pl.UInt32),
        "timed": g["t"], "dur_sum_ns": g["d"], "host": pl.Series([host] * len(k), dtype=pl.String)})


def aggregate(ev, *, job_id: str, host: str, bounds_ns: np.ndarray) -> dict:
    """The frames ``keys``, ``hist``, ``inst``, ``ranks`` of one node's records of one window (the
    records, or their :func:`compact` columns)."""
    if isinstance(ev, np.ndarray):
        ev = compact(ev)
    if not len(ev["rank"]):
        raise ValueError("node partial: no records")
    c = _columns(ev, bounds_ns)
    comms, cid = _comm_ids(ev["comm_hash"])
    keys, hist = _keys_and_hist(ev, c, cid, comms, job_id)
    return {"keys": keys, "hist": hist, "inst": _instances(ev, c, cid, comms, job_id),
            "ranks": _ranks(ev, c, cid, comms, job_id, host)}
