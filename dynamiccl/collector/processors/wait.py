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
  disagree by seconds say nothing about arrival);
* ``withheld`` (lossy communicator): the instances of a communicator that lost records as late or too early
  while the window was open (more than ``LOSSY_SHARE`` of its records in the window; ``lossy_records``). A
  dropped record's communicator is known (the aggregator codes (job, communicator) before it drops), so the
  drops are attributed to it and the job's other communicators (dozens: tensor-, pipeline-, data-parallel
  groups) keep their waits, as do other jobs. Drops of an unknown communicator, or past the bound on
  communicators tracked (processors/wait_window.py), count against the whole job (``LOSSY_JOB``). Records
  lost elsewhere (window_full, queue_full, flood, clock_range, delivery gaps) feed the same rule, each as far
  as its drop knows (processors/wait_losses.py);
* ``withheld``: a (communicator, collective) whose untimed instances in the window were refused more than
  ``WITHHOLD_SHARE`` of the time gives no waits in that window: records are being lost or held back (a host's
  clock jumped, a rank vanished), and the instances that stay complete are a biased sample (on the simulated
  bad-input run, a clock jump on another node raised tp0's median wait by 40 % while its complete instances
  fell from ~450 to 4-100 a window). An instance split across two windows is refused in both: a share of
  about (wait spread / window) of the instances, far below it.

Enqueue times of one instance are compared across ranks: ranks on different hosts compare their hosts'
clocks, so a constant clock offset is a constant part of the wait (its change is what the detector sees).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamiccl.contracts.collectives import COLLECTIVES

__all__ = ["WAIT_OUTCOMES", "WaitCounts", "wait_stand_ins", "attach_waits", "window_waits", "LOSSY_SHARE",
           "lossy_records", "LOSSY_COMM", "LOSSY_JOB", "LOSSY_SCOPES", "LostRecords", "MAX_LOSSY_COMMS"]

#: outcomes counted per untimed instance: made a wait stand-in, or refused and why
WAIT_OUTCOMES = ("instances", "missing_rank", "duplicate", "gap", "withheld")
#: refused share of a (communicator, collective)'s untimed instances above which its window gives no waits
WITHHOLD_SHARE = 0.25
#: records of a communicator (or job, for drops not attributed to one) dropped as late / too early since the
#: last window closed, as a share of its records in the window, above which it gives no waits in the window
#: (`lossy_records`)
LOSSY_SHARE = 0.01
#: the scope of a record's lossy mark (``lossy_records``): its communicator lost records, or its job did (the
#: drop's communicator unknown or past the bound); a larger value wins
LOSSY_COMM, LOSSY_JOB = 1, 2
LOSSY_SCOPES = {LOSSY_COMM: "communicator", LOSSY_JOB: "job"}
#: communicators whose drops are tracked between two window closes (a job has dozens: tensor-, pipeline-,
#: data-parallel groups); a drop of another communicator past it counts against its whole job (``LostRecords``)
MAX_LOSSY_COMMS = 4096

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
    withheld: int = 0        # complete, but their (communicator, collective) lost too many in the window
    #: (communicator, collective) code (``kc >> 12``) of each instance withheld because records were lost, and
    #: the scope of that loss (LOSSY_COMM or LOSSY_JOB) per such instance
    lossy_groups: np.ndarray | None = None
    lossy_scope: np.ndarray | None = None

    def as_dict(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in WAIT_OUTCOMES}


def _codes(kc: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Instance code (communicator, func, seqNumber mod 2^40) of each record, as u64."""
    return ((kc >> 12).astype(_U) << _U(40)) | seq.astype(_U)


def _group(code: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One sort of the untimed records' codes: (order, group starts in sorted order, the groups' codes,
    each record's dense group id)."""
    order = np.argsort(code, kind="stable")
    sc = code[order]
    starts = np.r_[0, np.flatnonzero(sc[1:] != sc[:-1]) + 1]
    gid = np.empty(len(code), np.int64)
    gid[order] = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(code)]))
    return order, starts, sc[starts], gid


def _lossy(group: np.ndarray, ok: np.ndarray, refused: np.ndarray) -> np.ndarray:
    """Per instance: whether its (communicator, collective) ``group`` had more than WITHHOLD_SHARE of its
    untimed instances refused in the window."""
    _, g = np.unique(group, return_inverse=True)
    n_ok = np.bincount(g, weights=ok, minlength=g.max() + 1)
    n_ref = np.bincount(g, weights=refused, minlength=g.max() + 1)
    return (n_ref > WITHHOLD_SHARE * (n_ok + n_ref))[g]


def wait_stand_ins(cols: dict[str, np.ndarray], max_wait_s: float, wholly_untimed: np.ndarray,
                   lossy: np.ndarray | None = None) -> tuple[dict[str, np.ndarray] | None, WaitCounts]:
    """The window's columns of the records that get a wait stand-in (``dur`` = their wait, in seconds), or
    None when none does, and the untimed instances' outcomes. ``wholly_untimed``: per record, whether its
    instance has no timed record in the window (the window aggregation's own instance table,
    ``WindowResult.wholly_untimed``): a partly timed instance is timed, neither a wait nor a refusal.
    ``lossy``: per record, 0 or the scope (LOSSY_COMM, LOSSY_JOB) of the records lost while the window was
    open (:func:`lossy_records`): its complete instances are ``withheld`` (their groups in
    ``counts.lossy_groups``, the scopes in ``counts.lossy_scope``).

    Cost: one sort of those records; nothing when every record is timed.

    >>> cols = {"kc": np.full(4, 1 << 12), "seq": np.zeros(4, np.int64), "rank": np.arange(4, dtype=np.int32),
    ...         "nranks": np.full(4, 4, np.int32), "dur": np.full(4, np.nan), "rel": np.array([.1, .1, .1, .3])}
    >>> sub, counts = wait_stand_ins(cols, 1.0, np.ones(4, bool))
    >>> sub["dur"].round(3).tolist(), counts.as_dict()
    ([0.2, 0.2, 0.2, 0.0], {'instances': 1, 'missing_rank': 0, 'duplicate': 0, 'gap': 0, 'withheld': 0})
    >>> wait_stand_ins(cols, 0.1, np.ones(4, bool))[1].gap
    1
    >>> wait_stand_ins({k: v[:3] for k, v in cols.items()}, 1.0, np.ones(3, bool))[1].missing_rank
    1
    """
    counts = WaitCounts()
    kc = cols["kc"]
    sel = np.flatnonzero(_COLLECTIVE[(kc >> 12) & 0xF] & wholly_untimed)
    if not len(sel):
        return None, counts
    order, starts, ucodes, iid = _group(_codes(kc[sel], cols["seq"][sel]))
    ni = len(starts)
    rank, rel = cols["rank"][sel], cols["rel"][sel]
    n = np.diff(np.r_[starts, len(sel)])
    want = cols["nranks"][sel][order][starts].astype(np.int64)   # the communicator's size, as its records say
    # (instance, rank) pairs, one sort (np.unique hashes: 8x slower here); the rank's 32 bits only
    pairs = np.sort((iid << 32) | (rank.astype(np.int64) & 0xFFFFFFFF))
    distinct = np.bincount(pairs[np.r_[True, pairs[1:] != pairs[:-1]]] >> 32, minlength=ni)
    rs = rel[order]
    last = np.maximum.reduceat(rs, starts)
    first = np.minimum.reduceat(rs, starts)
    dup = n > distinct
    missing = ~dup & (distinct < want)
    gap = ~dup & ~missing & (last - first > max_wait_s)
    ok = ~dup & ~missing & ~gap & (want >= 2)
    withheld = ok & _lossy(ucodes >> _U(40), ok, dup | missing | gap)
    ok &= ~withheld
    if lossy is not None:
        scope = np.maximum.reduceat(lossy[sel][order].astype(np.uint8), starts)
        cut = ok & (scope > 0)
        counts.lossy_groups = (ucodes[cut] >> _U(40)).astype(np.int64)
        counts.lossy_scope = scope[cut]
        withheld |= cut
        ok &= ~cut
    counts.withheld = int(withheld.sum())
    counts.instances, counts.missing_rank = int(ok.sum()), int(missing.sum())
    counts.duplicate, counts.gap = int(dup.sum()), int(gap.sum())
    if not counts.instances:
        return None, counts
    keep = ok[iid]
    rows = sel[keep]
    # every record of the window kept (an untimed job): the columns as they are, no copy
    out = dict(cols) if len(rows) == len(kc) else {name: a[rows] for name, a in cols.items()}
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


class LostRecords:
    """Records dropped (late, too early, buffer full) since the last window closed: per communicator code,
    and per job code for drops of no known communicator (code < 0) or past ``max_comms`` communicators
    (bounded: at most ``max_comms`` communicator entries; job entries bounded by the caller's job codes)."""

    def __init__(self, max_comms: int = MAX_LOSSY_COMMS) -> None:
        self.max_comms = max_comms
        self.comms: dict[int, int] = {}
        self.jobs: dict[int, int] = {}

    def dropped(self, job: int, comm: np.ndarray) -> int:
        """Records of job ``job`` dropped, ``comm`` their communicator codes; returns how many of those with a
        known communicator were counted against the job (past the bound)."""
        first = int(comm[0])
        if (comm == first).all():                  # the usual batch: one communicator
            codes, counts = [first], [len(comm)]
        else:
            u, c = np.unique(comm, return_counts=True)
            codes, counts = u.tolist(), c.tolist()
        folded = 0
        for code, n in zip(codes, counts):
            if code >= 0 and (code in self.comms or len(self.comms) < self.max_comms):
                self.comms[code] = self.comms.get(code, 0) + n
            else:
                self.jobs[job] = self.jobs.get(job, 0) + n
                folded += n if code >= 0 else 0
        return folded

    def dropped_job(self, job: int, n: int) -> None:
        """``n`` records of job ``job`` lost, their communicator unknown (a count: a forged record_seq jump
        of 2^40 costs nothing here)."""
        self.jobs[job] = self.jobs.get(job, 0) + n

    def take(self) -> tuple[dict[int, int], dict[int, int]]:
        """(per communicator, per job) since the last call, and start afresh (a window closed)."""
        out = self.comms, self.jobs
        self.comms, self.jobs = {}, {}
        return out


def lossy_records(job_of_gcomm: np.ndarray, kc: np.ndarray, lost_comms: dict[int, int],
                  lost_jobs: dict[int, int] | None = None) -> np.ndarray | None:
    """Per record (u8): LOSSY_COMM when its communicator lost more than LOSSY_SHARE of its window records'
    number as late or too early while the window was open (``lost_comms``: (job, communicator) code ``kc >>
    16`` -> records dropped), LOSSY_JOB when its job did by drops not attributed to a communicator
    (``lost_jobs``: job code -> records; ``job_of_gcomm``: the job code of each communicator code), else 0;
    None when no record is marked.

    >>> kc = np.array([0, 1 << 16, 1 << 16, 2 << 16])
    >>> lossy_records(np.array([0, 1, 1]), kc, {1: 1}).tolist()
    [0, 1, 1, 0]
    >>> lossy_records(np.array([0, 1, 1]), kc, {}, {1: 1}).tolist()
    [0, 2, 2, 2]
    """
    g = kc >> 16
    out = np.zeros(len(kc), np.uint8)
    if lost_comms:
        keys = np.array(sorted(lost_comms), np.int64)
        at = np.minimum(np.searchsorted(keys, g), len(keys) - 1)
        hit = keys[at] == g
        n = np.bincount(at[hit], minlength=len(keys))       # each lossy communicator's records in the window
        bad = np.array([lost_comms[k] for k in keys.tolist()]) > LOSSY_SHARE * n
        out[hit & bad[at]] = LOSSY_COMM
    if lost_jobs:
        job = job_of_gcomm[g]
        n = np.bincount(job, minlength=max(lost_jobs) + 1)
        bad_jobs = [j for j, k in lost_jobs.items() if k > LOSSY_SHARE * (n[j] if j < len(n) else 0)]
        out[np.isin(job, bad_jobs)] = LOSSY_JOB
    return out if out.any() else None


def window_waits(result, view: dict[str, np.ndarray], *, max_wait_s: float, lossy: np.ndarray | None,
                 aggregate, metrics):
    """The window's features (of its aggregation ``result``) with its waits attached (``aggregate``: the
    window aggregation, applied to the stand-ins), the outcomes counted in ``metrics``; the counts returned.

    ``lossy`` (:func:`lossy_records`): per record, whether its communicator (or, for drops not attributed to
    one, its job) lost records as late or too early while the window was open: those instances are all
    ``withheld``. Which instances stayed complete then depends on how the records were cut, a biased sample:
    a host's clock 30 s ahead closes the other hosts' windows early, and on the simulated bad-input run with
    every record untimed this gave a false change at +40 % wait. An instance's wait depends on its own
    communicator's records only, so another communicator's instances in the window keep their waits."""
    if result.wholly_untimed is None:         # every record timed
        return result.features, WaitCounts()
    features = result.features
    sub, counts = wait_stand_ins(view, max_wait_s, result.wholly_untimed, lossy)
    metrics.wait_outcomes(counts.as_dict())
    if sub is None:
        return features, counts
    return attach_waits(features, aggregate(sub).features), counts
