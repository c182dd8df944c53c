"""Mergeable node partials: what a node collector sends upstream for one event-time window.

A partial holds only sums, counts, extremes and fixed-bucket histograms, so merging the partials of
every node gives exactly what one collector computes over all records (durations are carried in
integer nanoseconds: their sums merge bit-exactly). Three frames:

* ``keys``  per (job, comm, func, algo, proto, size_bucket): records, bytes, timed records, duration
  sum / max, tuner-config version, and the duration histogram on the collector's fixed log buckets
  (``hist`` frame, sparse: one row per non-empty bucket).
* ``inst``  per collective instance (job, comm, func, seq) and node: its local ranks' count, timed
  count, duration min / max, how many ranks took the minimum and which rank (the straggler arrives
  last, so its duration is the shortest: the central tier names it from these).
* ``ranks`` per (job, comm, rank): records, timed records, duration sum, host.

With waits on (``waits=True``) a fifth frame, ``waitq``: the node's untimed collective records, from which
the merger forms the wait stand-ins (scaleout/waits.py), and ``waits_lossy`` (1: the node cut them or lost
records while the window was open; the merger then withholds the window's waits).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from dynamiccl.collector.metrics import DURATION_BUCKETS_S
from dynamiccl.collector.processors.wait import MAX_LOSSY_COMMS
from dynamiccl.contracts.partition import comm_partition
from dynamiccl.scaleout.node_agg import aggregate, compact
from dynamiccl.scaleout.waits import MAX_WAIT_RECORDS, node_waitq

__all__ = ["KEY_COLS", "INST_COLS", "BOUNDS_S", "SUB_BUCKETS", "node_partial", "merge_partials", "split_partial",
           "NodePartial"]

KEY_COLS = ["job_id", "comm_hash", "func", "algo", "proto", "size_bucket"]
INST_COLS = ["job_id", "comm_hash", "func", "seq"]
#: buckets per factor 2 of the partials' duration histogram: a quantile read back from it is within
#: (2^(1/8) - 1) / 2 ≈ 4.5 % of the exact one, close enough that the detector decides as on exact quantiles
#: (tests/scaleout/test_shard_loop.py); the collector's /metrics keep their factor-2 buckets
SUB_BUCKETS = 8
BOUNDS_S = DURATION_BUCKETS_S[0] * 2.0 ** (np.arange((len(DURATION_BUCKETS_S) - 1) * SUB_BUCKETS + 1) / SUB_BUCKETS)
_BOUNDS_NS = np.round(BOUNDS_S * 1e9)
NodePartial = dict  # {"node", "window", "keys", "hist", "inst", "ranks"[, "waitq", "waits_lossy"][, "partition"]}
_FRAMES = ("keys", "hist", "inst", "ranks")


def _frames(p: NodePartial) -> tuple[str, ...]:
    return _FRAMES + ("waitq",) if p.get("waitq") is not None else _FRAMES


def node_partial(ev, *, node: str, job_id: str, window: int, window_s: float, waits: bool = False,
                 max_wait_records: int = MAX_WAIT_RECORDS, lossy: bool = False,
                 lossy_comms: list[int] | tuple = ()) -> NodePartial:
    """The partial of one node's records (``wire_format.EVENT_DTYPE``, or their ``node_agg.compact``
    columns) of window ``window``; with ``waits``, its untimed collective records too (``lossy``: the node
    lost records of no tracked communicator while the window was open; ``lossy_comms``: the communicators
    that did, at most MAX_LOSSY_COMMS). ``waits_cut`` (not sent): the untimed records cut by the bound."""
    c = compact(ev) if isinstance(ev, np.ndarray) else ev
    frames = aggregate(c, job_id=job_id, host=node, bounds_ns=_BOUNDS_NS)
    p = {"node": node, "window": int(window), "window_s": float(window_s), **frames}
    if waits:
        p["waitq"], cut = node_waitq(c, job_id, max_wait_records)
        many = len(lossy_comms) > MAX_LOSSY_COMMS          # past the bound: the whole window is lossy
        p["waits_lossy"], p["waits_cut"] = int(lossy or cut > 0 or many), cut
        p["waits_lossy_comms"] = [] if many else sorted(int(c) for c in lossy_comms)
    return p


def split_partial(p: NodePartial, partitions: int) -> list[NodePartial]:
    """The partial cut by communicator partition (``contracts.partition.comm_partition``): one per
    partition, every frame row in exactly the partition of its ``comm_hash``, so each is a whole
    partial of its communicators. A partition without records gets an empty partial, so the central
    tier's merger for it hears from this node and does not wait."""
    names = _frames(p)
    comms = pl.concat([p[n]["comm_hash"] for n in names]).unique().to_list()
    part_of: dict[int, int] = {c: comm_partition(c, partitions) for c in comms}
    which = {n: p[n]["comm_hash"].replace_strict(part_of, return_dtype=pl.Int32) for n in names}
    out = []
    for i in range(partitions):
        q = {**p, "partition": i, **{n: p[n].filter(which[n] == i) for n in names}}
        if p.get("waits_lossy_comms"):   # each partition's merger needs its own communicators' marks only
            q["waits_lossy_comms"] = [c for c in p["waits_lossy_comms"] if comm_partition(c, partitions) == i]
        out.append(q)
    return out


def _merge_inst(inst: pl.DataFrame) -> pl.DataFrame:
    """Instances across nodes: sums add, extremes combine, the minimum's rank comes from the node
    holding the global minimum (its tie count adds over the nodes that share it)."""
    gmin = pl.col("dmin_ns").min().over(INST_COLS)
    at_min = pl.col("dmin_ns") == gmin
    return (inst.with_columns(at_min.fill_null(False).alias("_at_min"))
            .group_by(INST_COLS).agg(
                pl.col("algo").min(), pl.col("proto").min(), pl.col("size_bucket").min(),
                pl.col("nranks").max(), pl.col("n").sum(), pl.col("n_t").sum(),
                pl.col("dmin_ns").min(), pl.col("dmax_ns").max(),
                pl.col("n_at_min").filter(pl.col("_at_min")).sum(),
                pl.col("min_rank").filter(pl.col("_at_min")).first()))


def merge_partials(parts: list[NodePartial]) -> NodePartial:
    """One partial from several nodes' partials of the same window (associative: a merged partial
    merges again)."""
    if not parts:
        raise ValueError("merge_partials: no partials")
    windows = {p["window"] for p in parts}
    if len(windows) != 1:
        raise ValueError(f"merge_partials: partials of different windows {sorted(windows)}")
    keys = pl.concat([p["keys"] for p in parts]).group_by(KEY_COLS).agg(
        pl.col("records").sum(), pl.col("bytes_sum").sum(), pl.col("timed").sum(),
        pl.col("dur_sum_ns").sum(), pl.col("dur_max_ns").max(), pl.col("tcv").max(),
        pl.col("nranks").max(), pl.col("nnodes").max())
    hist = pl.concat([p["hist"] for p in parts]).group_by(KEY_COLS + ["bucket"]).agg(pl.col("count").sum())
    ranks = pl.concat([p["ranks"] for p in parts]).group_by(["job_id", "comm_hash", "rank"]).agg(
        pl.col("records").sum(), pl.col("timed").sum(), pl.col("dur_sum_ns").sum(), pl.col("host").first())
    out = {"node": "+".join(sorted(p["node"] for p in parts)), "window": parts[0]["window"],
           "window_s": parts[0]["window_s"], "keys": keys, "hist": hist,
           "inst": _merge_inst(pl.concat([p["inst"] for p in parts])), "ranks": ranks}
    waitqs = [p["waitq"] for p in parts if p.get("waitq") is not None]
    if waitqs:               # the records themselves: the waits need every rank's enqueue (scaleout/waits.py)
        out["waitq"] = pl.concat(waitqs)
        out["waits_lossy"] = int(max(p.get("waits_lossy", 0) for p in parts))
        out["waits_lossy_comms"] = sorted({c for p in parts for c in p.get("waits_lossy_comms") or ()})
    return out
