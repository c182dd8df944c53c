"""Straggler localisation from the collector's ``ranks`` frames (no cross-host clocks).

In a synchronous collective every rank waits for the last one to arrive, so the late rank's own
duration is the *shortest* of the instance while its peers' durations absorb its delay. The
collector counts, per window and (job, communicator, rank), the instances where a rank had the
strictly shortest duration (``shortest_count``). Durations are measured on each rank's own GPU
clock, so nothing here compares timestamps across hosts.

A rank is a straggler of a communicator when, over the windows since a change's onset, it was
the strict shortest in more instances than any other rank (ties allowed) and not already dominant
before the onset, and one of:

* it was the strict shortest in at least ``share`` of the instances that had a unique shortest
  rank (with at least ``min_instances`` of them), significantly more often than its usual share
  (binomial z ≥ ``z_min`` against max(its share before the onset, 1/ranks)): on a 4-rank
  communicator 5 of 8 instances is 0.62 but z = 2.4, which one quiet window of a shared machine
  produces by itself;
* (a window only partly after the onset) at least twice its usual share with a binomial z ≥ 5
  and an exact binomial tail ≤ ``PARTIAL_FAMILY_ALPHA`` / ranks (on 800 ranks one shortest
  instance of 29 is z = 5.2 but any rank draws it with probability 0.036);
  where its durations are known (``rel_z`` given), either count rule also needs the rank's
  collectives shorter than its peers' by ``REL_CORROBORATE_Z`` robust σ;
* its own collectives are, on average, far shorter than its peers' in the same instances: its
  ``rel_lat_mean`` (duration / mean of the instance's other ranks) is the lowest of the
  communicator and below the communicator's median by ≥ ``rel_z`` robust σ of that deviation
  in the windows before the onset. The counts alone can miss a straggler whose late-launched record of an
  instance falls into the next window: that instance is incomplete in this one and its "shortest"
  vote goes to a peer (measured on the test bed: half the votes of the first windows after a
  one-rank throttle); the leave-one-out duration ratio is not diluted that way.

The window holding the onset is partly before it (its instances are as much the old regime's as
the new one's): when the later windows hold ``min_instances`` instances of their own and the
whole span shows no straggler, they are judged without it.

>>> import polars as pl
>>> from dynamiccl.collector.features import RANKS_SCHEMA
>>> def frame(counts):
...     return pl.DataFrame({"job_id": ["j"] * 4, "comm_hash": [7] * 4, "rank": [0, 1, 2, 3],
...                          "host": ["h0", "h0", "h1", "h1"], "records": [10] * 4,
...                          "lat_mean_s": [1e-3] * 4, "rel_lat_mean": [1.0] * 4,
...                          "shortest_count": counts, "instances_complete": [10] * 4},
...                         schema=RANKS_SCHEMA)
>>> h = RankHistory(8)
>>> for step, counts in enumerate([[3, 2, 3, 2], [2, 3, 2, 3], [0, 0, 10, 0], [1, 0, 9, 0]]):
...     h.add(step, frame(counts))
>>> [(c.rank, c.host, round(c.share, 2)) for c in find_stragglers(h, "j", [7], onset_step=2)]
[(2, 'h1', 0.95)]

The onset's window (step 4) is mostly the old regime; the next one alone shows rank 3:

>>> def frame2(counts, rel=(1.0, 1.0, 1.0, 1.0), records=(8, 8, 8, 8)):
...     return frame(counts).with_columns(pl.Series("rel_lat_mean", rel), pl.Series("records", records))
>>> h = RankHistory(16)
>>> quiet = [([2, 3, 2, 3], (1.02, 0.98, 1.0, 1.01)), ([3, 2, 3, 2], (0.99, 1.01, 1.03, 0.97))] * 2
>>> for step, (counts, rel) in enumerate(quiet + [([2, 5, 1, 4], (1.04, 0.98, 1.01, 0.97)),
...                                             ([0, 0, 0, 6], (1.16, 1.17, 1.1, 0.63))]):
...     h.add(step, frame2(counts, rel))
>>> [(c.rank, c.share, c.instances) for c in find_stragglers(h, "j", [7], onset_step=4)]
[(3, 1.0, 6)]

Five of eight instances on 4 ranks is no straggler (binomial z = 2.4 < ``z_min``):

>>> h.add(6, frame2([5, 1, 1, 1]))
>>> find_stragglers(h, "j", [7], onset_step=6)
[]

Rank 2's record of half the instances fell into the next window, so the counts tie with rank 3;
its duration ratio does not (``rel_z``; `dynamiccl.detector.fusion` uses it to classify a change that the
latency streams already show, not to open one):

>>> h.add(7, frame2([0, 0, 4, 4], (1.08, 1.05, 0.65, 1.07), (8, 8, 4, 8)))
>>> find_stragglers(h, "j", [7], onset_step=7)
[]
>>> [c.rank for c in find_stragglers(h, "j", [7], onset_step=7, rel_z=STRAGGLER_REL_Z)]
[2]
>>> has_rank_evidence(h, "j", [7], 7), has_rank_evidence(h, "j", [7], 8)
(True, False)

Every rank slowed alike (a job-wide bandwidth drop): rank 2 is the strict shortest of most
instances by chance, but its durations are its peers' (``REL_CORROBORATE_Z``), so when the
durations are known it is no straggler:

>>> h = RankHistory(16)
>>> for step, (counts, rel) in enumerate(quiet + [([0, 1, 9, 0], (1.0, 1.01, 0.995, 1.0))]):
...     h.add(step, frame2(counts, rel))
>>> [c.rank for c in find_stragglers(h, "j", [7], onset_step=4)]
[2]
>>> find_stragglers(h, "j", [7], onset_step=4, rel_z=STRAGGLER_REL_Z)
[]
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy.stats import binom

__all__ = ["RankHistory", "StragglerCandidate", "find_stragglers", "has_rank_evidence", "comm_hosts",
           "STRAGGLER_REL_Z"]


class RankHistory:
    """The last ``size`` windows' ranks frames (bounded), with their windows' start times where given."""

    def __init__(self, size: int):
        self.frames: deque[tuple[int, pl.DataFrame]] = deque(maxlen=size)
        self.starts: deque[tuple[int, float]] = deque(maxlen=size)

    def add(self, step: int, ranks: pl.DataFrame, start_s: float | None = None) -> None:
        if ranks is not None and ranks.height:
            self.frames.append((step, ranks))
            if start_s is not None:
                self.starts.append((step, float(start_s)))

    def start_of(self, step: int) -> float | None:
        """The event time the window ``step`` began at, if it is kept."""
        return next((t for s, t in self.starts if s == step), None)

    def step_at(self, t_s: float) -> int | None:
        """The first kept step whose window begins at or after ``t_s`` (steps count windows with
        data: a step-paced job's come seconds apart, so step arithmetic on ``window_s`` is wrong)."""
        return next((s for s, t in self.starts if t >= t_s - 1e-6), None)

    def window(self, job: str, comms, lo: int, hi: int | None = None) -> pl.DataFrame | None:
        """The frames of steps ``lo`` ≤ step < ``hi`` for ``job`` and ``comms``, with a ``step`` column."""
        parts = [f.with_columns(pl.lit(s, pl.Int64).alias("step"))
                 for s, f in self.frames if s >= lo and (hi is None or s < hi)]
        if not parts:
            return None
        df = pl.concat(parts, how="diagonal_relaxed")   # a stream may add optional columns
        return df.filter((pl.col("job_id") == job) & pl.col("comm_hash").is_in(list(comms)))


@dataclass(frozen=True)
class StragglerCandidate:
    comm_hash: int
    rank: int
    host: str
    share: float          # of instances with a unique shortest rank, since the onset
    instances: int        # such instances
    share_before: float   # same share before the onset (nan if unknown)
    rule: str = ""        # which rule named it: "counts", "partial" or "durations"


def _shares(df: pl.DataFrame) -> pl.DataFrame:
    per = df.group_by("comm_hash", "rank").agg(pl.col("shortest_count").sum().alias("short"),
                                               pl.col("host").first())
    return per.with_columns(pl.col("short").sum().over("comm_hash").alias("total"),
                            pl.len().over("comm_hash").alias("n_ranks"),
                            pl.col("short").max().over("comm_hash").alias("top")).with_columns(
        (pl.col("short") / pl.col("total")).alias("share"))


def _rel_by_rank(df: pl.DataFrame) -> dict[int, dict[int, float]]:
    """Records-weighted mean ``rel_lat_mean`` per (comm, rank) over ``df``'s windows."""
    if "rel_lat_mean" not in df.columns:
        return {}
    d = df.filter(pl.col("rel_lat_mean").is_not_null() & pl.col("rel_lat_mean").is_finite()
                  & (pl.col("records") > 0))
    if d.height == 0:
        return {}
    agg = d.group_by("comm_hash", "rank").agg(
        ((pl.col("rel_lat_mean") * pl.col("records")).sum() / pl.col("records").sum()).alias("rel"))
    out: dict[int, dict[int, float]] = {}
    for c, r, v in agg.iter_rows():
        out.setdefault(int(c), {})[int(r)] = float(v)
    return out


def _rel_deviation(rel: dict[int, float], rank: int) -> float:
    """``rank``'s rel minus the median rel of the communicator's ranks (negative: its collectives
    are shorter than its peers')."""
    if rank not in rel or len(rel) < 2:
        return math.nan
    return rel[rank] - float(np.median(list(rel.values())))


def _rel_sigma(pre: pl.DataFrame | None) -> dict[int, float]:
    """Per comm: robust σ (1.4826 MAD) of the single-window rel deviations before the onset
    (windows with ≥ 2 ranks; at least ``REL_MIN_SAMPLES`` of them; floored at ``REL_SIGMA_FLOOR``)."""
    if pre is None or pre.height == 0 or "rel_lat_mean" not in pre.columns:
        return {}
    rel = pl.col("rel_lat_mean")
    dev = (pre.filter(rel.is_not_null() & rel.is_finite())
              .with_columns((rel - rel.median().over("comm_hash", "step")).alias("dev"),
                            pl.len().over("comm_hash", "step").alias("n"))
              .filter(pl.col("n") >= 2))
    agg = dev.group_by("comm_hash").agg(pl.len().alias("k"),
                                        (pl.col("dev") - pl.col("dev").median()).abs().median().alias("mad"))
    return {int(c): max(1.4826 * float(m), REL_SIGMA_FLOOR)
            for c, k, m in agg.iter_rows() if k >= REL_MIN_SAMPLES and m is not None}


STRAGGLER_REL_Z = 5.0   # the rel path's threshold when the fusion classifies a change (robust σ)
#: the counts' straggler must also be shorter than its peers by this many robust σ where its durations
#: are known: a late rank's own collective is shorter by its lateness, while a change that slows every
#: rank alike (a job-wide bandwidth drop) leaves each rank's ratio to its peers where it was and makes
#: some rank the strict shortest of most instances by chance when the communicator is large
REL_CORROBORATE_Z = 2.0
#: family-wise false-naming rate of the ``partial`` count rule over a communicator's ranks
PARTIAL_FAMILY_ALPHA = 0.01
REL_SIGMA_FLOOR = 0.01   # rel deviations are ratios: 1 % is below any measured window-to-window noise
REL_MIN_SAMPLES = 12     # deviations before the onset needed to trust their spread (3 windows of 4 ranks, 6 of 2)


def find_stragglers(history: RankHistory, job: str, comms, *, onset_step: int, share: float = 0.6,
                    min_instances: int = 3, z_min: float = 3.0, rel_z: float | None = None,
                    later_alone: bool = True) -> list[StragglerCandidate]:
    """Dominant-shortest ranks of ``comms`` since ``onset_step``, best first (``rel_z`` None:
    the counts only; ``later_alone`` False: never the windows after the onset's on their own)."""
    pre = history.window(job, comms, 0, onset_step)
    before: dict[tuple[int, int], float] = {}
    if pre is not None and pre.height:
        p = _shares(pre).filter(pl.col("total") >= min_instances)
        before = {(c, r): v for c, r, v in zip(p["comm_hash"].to_list(), p["rank"].to_list(),
                                                p["share"].to_list())}
    sigma = _rel_sigma(pre) if rel_z is not None else {}
    kw = dict(share=share, min_instances=min_instances, z_min=z_min, rel_z=rel_z)
    out = _candidates(history.window(job, comms, onset_step), before, sigma, **kw)
    if not out and later_alone:
        # the onset's window is partly before the change: judge the later windows on their own
        later = history.window(job, comms, onset_step + 1)
        if later is not None and later.height:
            out = _candidates(later, before, sigma, **kw)
    return out


def has_rank_evidence(history: RankHistory, job: str, comms, step: int) -> bool:
    """Whether window ``step`` holds per-rank records (≥ 2 ranks) of any of ``comms``: a change
    first seen in the window holding its onset is classified one window later when it does (that
    window's instances are partly the old regime's, so its shortest ranks are as much the old
    regime's noise as the new straggler: on the test bed the throttled rank was the shortest in
    0–60 % of them, then in 100 % of the complete instances of the next window)."""
    df = history.window(job, comms, step, step + 1)
    return df is not None and df.height > 0 and bool(
        (df.filter(pl.col("records") > 0).group_by("comm_hash").len()["len"] >= 2).any())


def _candidates(post: pl.DataFrame | None, before, sigma, *, share, min_instances, z_min, rel_z
                ) -> list[StragglerCandidate]:
    if post is None or post.height == 0:
        return []
    s = _shares(post).filter((pl.col("total") >= min_instances) & (pl.col("short") == pl.col("top"))
                             & (pl.col("short") > 0))
    if s.height == 0:
        return []
    rel = _rel_by_rank(post) if rel_z is not None and sigma else {}
    out = []
    for c, r, h, sh, k, tot, n in zip(s["comm_hash"].to_list(), s["rank"].to_list(), s["host"].to_list(),
                                      s["share"].to_list(), s["short"].to_list(), s["total"].to_list(),
                                      s["n_ranks"].to_list()):
        b = before.get((c, r), float("nan"))
        if b == b and b >= share:  # already dominant before the change: not this change
            continue
        p0 = min(max(b if b == b else 0.0, 1.0 / max(n, 1)), 0.99)
        z = (sh - p0) * tot / math.sqrt(tot * p0 * (1.0 - p0))
        dominant = sh >= share and z >= z_min
        # a first window only partly after the onset; the normal approximation means nothing when
        # the expected count tot·p0 is far below 1 (one shortest instance of 29 on 800 ranks is
        # z = 5.2), so the exact binomial tail must also hold, Bonferroni over the ranks (any of n
        # could have drawn the top count)
        partial = (z >= 5.0 and sh >= 2.0 * p0
                   and n * float(binom.sf(k - 1, tot, p0)) <= PARTIAL_FAMILY_ALPHA)
        short_rel, corroborated = False, True
        cr = rel.get(int(c), {})
        if c in sigma and len(cr) >= 2 and r in cr:
            dev = _rel_deviation(cr, r)
            # naming a rank by its durations alone needs peers to compare it with (≥ 3 ranks)
            short_rel = len(cr) >= 3 and cr[r] <= min(cr.values()) and dev <= -rel_z * sigma[c]
            corroborated = dev <= -REL_CORROBORATE_Z * sigma[c]
        rule = ("counts" if dominant else "partial") if (dominant or partial) and corroborated else (
            "durations" if short_rel else "")
        if not rule:
            continue
        out.append(StragglerCandidate(int(c), int(r), str(h), float(sh), int(tot), float(b), rule))
    # best first; ties in (communicator, rank) order, not in polars' group_by order (which
    # varies between runs on the same records)
    out.sort(key=lambda c: (-(c.share * min(c.instances, 50)), -c.instances, c.comm_hash, c.rank))
    return out


def comm_hosts(history: RankHistory, job: str, comms) -> dict[int, set[str]]:
    """Hosts seen per communicator in the kept windows."""
    df = history.window(job, comms, 0)
    if df is None:
        return {}
    out: dict[int, set[str]] = {}
    for c, h in df.select("comm_hash", "host").unique().iter_rows():
        out.setdefault(int(c), set()).add(h)
    return out
