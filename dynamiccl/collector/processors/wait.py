"""Wait stand-ins: what a window can still say about records that carry no duration.

On NCCL 2.31+ after a send/recv the plugin refuses the KernelCh GPU times (TIMING_SUSPECT): the records are
untimed and keep only their enqueue time (docs/real-nccl.md). For an instance of a collective seen once on
every rank of its communicator, each record's **wait** is the instance's latest enqueue minus its own: how
long the rank waited for the last one to arrive. A rank that starts arriving late waits less (the last one
waits 0) and every other rank waits more, so a rising wait names a late rank; a uniformly slower transfer
leaves every wait unchanged (a wait is not a latency and says nothing of a link).

Rules (each one a named gate below, each refusal counted):

* only collectives (send/recv instances are not seen on every rank);
* only instances whose every record in the window is untimed: a record with a duration keeps it, and an
  instance is never split between a duration stream and a wait stream;
* ``complete``: exactly one record per rank of the communicator (``missing_rank`` when fewer distinct ranks,
  ``duplicate`` when a rank has several records);
* ``gap``: the instance's largest wait at most ``max_wait_s`` (enqueue clocks of different hosts that
  disagree by seconds say nothing about arrival).

Enqueue times of one instance are compared across ranks: ranks on different hosts compare their hosts'
clocks, so a constant clock offset is a constant part of the wait (its change is what the detector sees).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamiccl.contracts.collectives import COLLECTIVES

__all__ = ["WAIT_OUTCOMES", "WaitCounts", "wait_stand_ins", "attach_waits"]

#: outcomes counted per untimed instance: made a wait stand-in, or refused and why
WAIT_OUTCOMES = ("instances", "missing_rank", "duplicate", "gap")

# per 4-bit func code of the packed key: True for a collective (all ranks take part)
_COLLECTIVE = np.zeros(16, bool)
_COLLECTIVE[[c.code for c in COLLECTIVES if not c.p2p and c.code < 16]] = True
_U = np.uint64


@dataclass
class WaitCounts:
    """Untimed collective instances of one window by outcome (see the module's rules)."""
    instances: int = 0       # given wait stand-ins
    missing_rank: int = 0
    duplicate: int = 0
    gap: int = 0

    def as_dict(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in WAIT_OUTCOMES}


def _instances(kc: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense instance ids over (communicator, func, seqNumber mod 2^40) and their number."""
    code = ((kc >> 12).astype(_U) << _U(40)) | seq.astype(_U)
    _, iid = np.unique(code, return_inverse=True)
    iid = iid.reshape(-1)
    return iid, int(iid.max()) + 1 if len(iid) else 0


def wait_stand_ins(cols: dict[str, np.ndarray], max_wait_s: float) -> tuple[dict[str, np.ndarray] | None, WaitCounts]:
    """The window's columns of the records that get a wait stand-in (``dur`` = their wait, in seconds), or
    None when none does, and the untimed instances' outcomes.

    >>> cols = {"kc": np.full(4, 1 << 12), "seq": np.zeros(4, np.int64), "rank": np.arange(4, dtype=np.int32),
    ...         "nranks": np.full(4, 4, np.int32), "dur": np.full(4, np.nan), "rel": np.array([.1, .1, .1, .3])}
    >>> sub, counts = wait_stand_ins(cols, 1.0)
    >>> sub["dur"].round(3).tolist(), counts.as_dict()
    ([0.2, 0.2, 0.2, 0.0], {'instances': 1, 'missing_rank': 0, 'duplicate': 0, 'gap': 0})
    >>> wait_stand_ins(cols, 0.1)[1].gap, wait_stand_ins({k: v[:3] for k, v in cols.items()}, 1.0)[1].missing_rank
    (1, 1)
    """
    counts = WaitCounts()
    kc, dur = cols["kc"], cols["dur"]
    coll = _COLLECTIVE[(kc >> 12) & 0xF]
    if not (coll & np.isnan(dur)).any():
        return None, counts
    sel = np.flatnonzero(coll)
    iid, ni = _instances(kc[sel], cols["seq"][sel])
    rank, nranks, rel = cols["rank"][sel], cols["nranks"][sel], cols["rel"][sel]
    n = np.bincount(iid, minlength=ni)
    timed = np.bincount(iid, weights=~np.isnan(dur[sel]), minlength=ni)
    pairs = np.unique((iid.astype(np.int64) << 32) | rank.astype(np.int64))
    distinct = np.bincount(pairs >> 32, minlength=ni)
    want = np.zeros(ni, np.int64)
    want[iid] = nranks                          # the communicator's size, as its records say
    last = np.full(ni, -np.inf)
    np.maximum.at(last, iid, rel)
    first = np.full(ni, np.inf)
    np.minimum.at(first, iid, rel)
    untimed = timed == 0
    dup = untimed & (n > distinct)
    missing = untimed & ~dup & (distinct < want)
    gap = untimed & ~dup & ~missing & (last - first > max_wait_s)
    ok = untimed & ~dup & ~missing & ~gap & (want >= 2)
    counts.instances, counts.missing_rank = int(ok.sum()), int(missing.sum())
    counts.duplicate, counts.gap = int(dup.sum()), int(gap.sum())
    if not counts.instances:
        return None, counts
    keep = ok[iid]
    rows = sel[keep]
    out = {name: a[rows] for name, a in cols.items()}
    out["dur"] = (last[iid] - rel)[keep]
    return out, counts


def attach_waits(features, waits_features):
    """``features`` (the window's WindowFeatures) with the wait stand-ins' aggregation ``waits_features``
    attached: its keys rows become the window's ``waits`` frame (bandwidth null: a wait moves no bytes), and
    its per-rank votes for the shortest value (the rank that arrived last waits least) add to the ranks
    frame's ``shortest_count``. Those instances are untimed, so they had no vote there: nothing is counted
    twice, and the ranks frame keeps its rows and schema."""
    import dataclasses

    import polars as pl

    waits = waits_features.keys.with_columns(pl.lit(None, pl.Float64).alias("algbw_Bps"),
                                             pl.lit(None, pl.Float64).alias("busbw_Bps"))
    on = ["job_id", "comm_hash", "rank"]
    votes = waits_features.ranks.select(*on, pl.col("shortest_count").alias("_wait_votes"))
    ranks = (features.ranks.join(votes, on=on, how="left", maintain_order="left")
             .with_columns((pl.col("shortest_count") + pl.col("_wait_votes").fill_null(0)).alias("shortest_count"))
             .drop("_wait_votes"))
    return dataclasses.replace(features, ranks=ranks, waits=waits)
