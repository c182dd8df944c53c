"""Wait stand-ins on the scale-out path: the same wait streams as the single collector, from node partials.

A record's wait (collector/processors/wait.py) is its instance's latest enqueue minus its own, over every
rank of the communicator: a node sees only its own ranks, so it cannot form it. Each node partial carries
instead its **untimed collective records** (frame ``waitq``: instance, rank, the record's key fields and its
event time, which for an untimed record is its enqueue), and the job-level merger, holding every node's,
forms the waits with the single collector's own gates (``wait_stand_ins``: only instances wholly untimed
across every node, complete, no duplicate, no gap over ``max_wait_s``, the (communicator, collective)
share rule) and aggregates them as the partials aggregate durations (``node_agg.aggregate`` on the waits,
then ``features.window_features``): the ``waits`` frame and the waits' ``shortest_count`` votes, as one
collector gives them (quantiles from the partials' histogram, within one bucket, as for durations).

Bounds: a node sends at most ``max_records`` untimed collective records of one window; past it it sends
none of that window's (a cut sample is a biased one) and says so (``waits_lossy``): the merger then withholds
that window's waits (counted ``withheld``). Records the node dropped as late or for a full buffer while the
window was open are attributed to their communicator (decoded: the node reads ``comm_hash`` of each dropped
record): a communicator that lost more than LOSSY_SHARE of its records' number on the node goes in the
partial's ``waits_lossy_comms`` (at most MAX_LOSSY_COMMS), and the merger withholds only that communicator's
waits, as the single collector does; drops past MAX_LOSSY_COMMS communicators count against the whole
node-window (``waits_lossy``). Timed records cost nothing here: they are not carried.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from dynamiccl.collector.processors.wait import (
    _COLLECTIVE,
    LOSSY_COMM,
    LOSSY_JOB,
    LOSSY_SHARE,
    WaitCounts,
    attach_waits,
    wait_stand_ins,
)

__all__ = ["WAITQ_FIELDS", "MAX_WAIT_RECORDS", "node_waitq", "empty_waitq", "merged_waits", "check_waitq",
           "lossy_comms"]

#: untimed collective records of one node-window a partial carries at most (8 ranks × ~550 records/s on a
#: 1 s window is ~4.4 k; 65536 leaves room for 100 ranks on a node at that rate)
MAX_WAIT_RECORDS = 1 << 16
#: the record columns a ``waitq`` row carries (besides job_id), in the compact columns' names
WAITQ_FIELDS = ("comm_hash", "func", "seq_number", "rank", "nranks", "algo", "proto", "bytes", "nnodes",
                "tuner_config_version", "t")
_M40 = (1 << 40) - 1


def empty_waitq() -> pl.DataFrame:
    return pl.DataFrame({"job_id": pl.Series([], dtype=pl.String),
                         **{f: pl.Series([], dtype=pl.Int64) for f in WAITQ_FIELDS}}).with_columns(
        pl.col("comm_hash").cast(pl.UInt64))


def node_waitq(c: dict, job_id: str, max_records: int = MAX_WAIT_RECORDS) -> tuple[pl.DataFrame, int]:
    """(the ``waitq`` frame of a node-window's compact columns ``c``, records cut): its untimed collective
    records, or none of them (all counted as cut) when more than ``max_records``."""
    sel = np.flatnonzero(~c["timed"] & _COLLECTIVE[np.minimum(c["func"], 15)] & (c["func"] < 16))
    if not len(sel):
        return empty_waitq(), 0
    if len(sel) > max_records:
        return empty_waitq(), len(sel)
    cols = {f: c[f][sel].astype(np.int64) for f in WAITQ_FIELDS if f != "comm_hash"}
    cols["seq_number"] &= _M40
    return pl.DataFrame({"job_id": pl.Series([job_id] * len(sel), dtype=pl.String),
                         "comm_hash": c["comm_hash"][sel].astype(np.uint64), **cols}), 0


def lossy_comms(comm_hash: np.ndarray, lost: dict[int, int]) -> list[int]:
    """The communicators (hashes, sorted) of ``lost`` (hash -> records dropped while the window was open) that
    lost more than LOSSY_SHARE of their records' number in the window (``comm_hash``: the window's records').

    >>> lossy_comms(np.array([7] * 50 + [9] * 200, np.uint64), {7: 1, 9: 2, 11: 1})
    [7, 11]
    """
    if not lost:
        return []
    keys = np.array(sorted(lost), np.uint64)
    at = np.minimum(np.searchsorted(keys, comm_hash), len(keys) - 1)
    n = np.bincount(at[keys[at] == comm_hash], minlength=len(keys))
    return [k for k, m in zip(keys.tolist(), n.tolist()) if lost[k] > LOSSY_SHARE * m]


def check_waitq(cols: dict[str, np.ndarray]) -> None:
    """A hostile node's ``waitq`` columns: ValueError naming what is wrong (the partial is refused, counted
    as a bad partial by its receiver)."""
    func, rank, nranks, seq = cols["func"], cols["rank"], cols["nranks"], cols["seq_number"]
    if not (func < 16).all() or not _COLLECTIVE[func].all():
        raise ValueError("partial: waitq holds a record that is not a collective")
    if not ((nranks >= 1) & (rank >= 0) & (rank < nranks)).all():
        raise ValueError("partial: waitq holds a rank outside 0 <= rank < nranks")
    if not ((seq >= 0) & (seq <= _M40)).all():
        raise ValueError("partial: waitq holds a sequence number outside [0, 2^40)")


def _stand_in_columns(wq: pl.DataFrame, window_start_ns: int) -> dict[str, np.ndarray]:
    """The columns ``wait_stand_ins`` reads, keyed as the single collector keys them: a dense code per
    (job, communicator) in ``kc >> 16``, the func in bits 12-15, ``rel`` the event time from the window's
    start (the single collector's, to the nanosecond)."""
    comm = wq.select(pl.struct("job_id", "comm_hash").rank("dense").cast(pl.Int64) - 1).to_series().to_numpy()
    n = wq.height
    return {"kc": (comm << 16) | (wq["func"].to_numpy() << 12), "seq": wq["seq_number"].to_numpy(),
            "rank": wq["rank"].to_numpy(), "nranks": wq["nranks"].to_numpy(),
            "rel": (wq["t"].to_numpy() - window_start_ns) * 1e-9, "dur": np.full(n, np.nan),
            "row": np.arange(n)}


def _lossy(wq: pl.DataFrame, p: dict) -> np.ndarray | None:
    """Per ``waitq`` row, the scope of the records lost while the window was open (processors/wait.py
    ``lossy_records``): LOSSY_JOB when a node marked the window lossy, LOSSY_COMM for a communicator a node
    marked; None when none."""
    if p.get("waits_lossy"):
        return np.full(wq.height, LOSSY_JOB, np.uint8)
    comms = p.get("waits_lossy_comms") or ()
    if not comms:
        return None
    marked = np.isin(wq["comm_hash"].to_numpy(), np.array(sorted(comms), np.uint64))
    return np.where(marked, LOSSY_COMM, 0).astype(np.uint8)


def merged_waits(p: dict, max_wait_s: float, bounds_ns: np.ndarray):
    """(the waits' (merged) partial, or None, and the outcomes) of a merged partial ``p`` whose ``waitq``
    holds every node's untimed collective records of the window."""
    from dynamiccl.scaleout.node_agg import aggregate
    from dynamiccl.scaleout.partials import INST_COLS

    counts = WaitCounts()
    wq = p.get("waitq")
    if wq is None or wq.height == 0:
        return None, counts
    timed = p["inst"].filter(pl.col("n_t") > 0).select(INST_COLS)
    wq = (wq.with_columns(pl.col("seq_number").alias("seq"), pl.col("func").cast(pl.Int32))
          .join(timed, on=INST_COLS, how="anti").drop("seq"))          # instances wholly untimed on every node
    if wq.height == 0:
        return None, counts
    wq = wq.with_columns(pl.col("func").cast(pl.Int64))
    cols = _stand_in_columns(wq, int(p["window"]) * int(round(p["window_s"] * 1e9)))
    lossy = _lossy(wq, p)
    sub, counts = wait_stand_ins(cols, max_wait_s, np.ones(wq.height, bool), lossy)
    if sub is None:
        return None, counts
    rows = wq[sub["row"]]
    c = {f: rows[f].to_numpy() for f in WAITQ_FIELDS if f != "t"}
    c["timed"] = np.ones(len(sub["row"]), bool)
    c["dur"] = np.round(sub["dur"] * 1e9).astype(np.int64)
    frames = aggregate(c, job_id=str(rows["job_id"][0]), host="", bounds_ns=bounds_ns)
    return {"node": p["node"], "window": p["window"], "window_s": p["window_s"], **frames}, counts


def with_merged_waits(p: dict, features, max_wait_s: float, bounds_ns: np.ndarray, window_features):
    """``features`` of the merged partial ``p`` with its waits attached (``attach_waits``, as the single
    collector does), and the outcomes."""
    wp, counts = merged_waits(p, max_wait_s, bounds_ns)
    if wp is None:
        return features, counts
    return attach_waits(features, window_features(wp)), counts
