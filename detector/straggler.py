"""Straggler localisation from the collector's ``ranks`` frames (no cross-host clocks).

In a synchronous collective every rank waits for the last one to arrive, so the late rank's own
duration is the *shortest* of the instance while its peers' durations absorb its delay. The
collector counts, per window and (job, communicator, rank), the instances where a rank had the
strictly shortest duration (``shortest_count``). Durations are measured on each rank's own GPU
clock, so nothing here compares timestamps across hosts.

A rank is a straggler of a communicator when, over the windows since a change's onset, it was
the strict shortest in more instances than any other rank and either in at least ``share`` of the
instances that had a unique shortest rank (with at least ``min_instances`` of them), or (a first
window only partly after the onset) in at least twice its usual share with a binomial z ≥ 5; and
it was not already dominant before the onset.

>>> import polars as pl
>>> from collector.features import RANKS_SCHEMA
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
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import polars as pl

__all__ = ["RankHistory", "StragglerCandidate", "find_stragglers", "comm_hosts"]


class RankHistory:
    """The last ``size`` windows' ranks frames (bounded)."""

    def __init__(self, size: int):
        self.frames: deque[tuple[int, pl.DataFrame]] = deque(maxlen=size)

    def add(self, step: int, ranks: pl.DataFrame) -> None:
        if ranks is not None and ranks.height:
            self.frames.append((step, ranks))

    def window(self, job: str, comms, lo: int, hi: int | None = None) -> pl.DataFrame | None:
        parts = [f for s, f in self.frames if s >= lo and (hi is None or s < hi)]
        if not parts:
            return None
        df = pl.concat(parts, how="vertical_relaxed")
        return df.filter((pl.col("job_id") == job) & pl.col("comm_hash").is_in(list(comms)))


@dataclass(frozen=True)
class StragglerCandidate:
    comm_hash: int
    rank: int
    host: str
    share: float          # of instances with a unique shortest rank, since the onset
    instances: int        # such instances
    share_before: float   # same share before the onset (nan if unknown)


def _shares(df: pl.DataFrame) -> pl.DataFrame:
    per = df.group_by("comm_hash", "rank").agg(pl.col("shortest_count").sum().alias("short"),
                                               pl.col("host").first())
    return per.with_columns(pl.col("short").sum().over("comm_hash").alias("total"),
                            pl.len().over("comm_hash").alias("n_ranks"),
                            pl.col("short").max().over("comm_hash").alias("top")).with_columns(
        (pl.col("short") / pl.col("total")).alias("share"))


def find_stragglers(history: RankHistory, job: str, comms, *, onset_step: int, share: float = 0.6,
                    min_instances: int = 3) -> list[StragglerCandidate]:
    """Dominant-shortest ranks of ``comms`` since ``onset_step``, best first."""
    post = history.window(job, comms, onset_step)
    if post is None or post.height == 0:
        return []
    s = _shares(post).filter((pl.col("total") >= min_instances) & (pl.col("short") == pl.col("top"))
                             & (pl.col("short") > 0))
    if s.height == 0:
        return []
    pre = history.window(job, comms, 0, onset_step)
    before: dict[tuple[int, int], float] = {}
    if pre is not None and pre.height:
        p = _shares(pre).filter(pl.col("total") >= min_instances)
        before = {(c, r): v for c, r, v in zip(p["comm_hash"].to_list(), p["rank"].to_list(),
                                                p["share"].to_list())}
    out = []
    for c, r, h, sh, tot, n in zip(s["comm_hash"].to_list(), s["rank"].to_list(), s["host"].to_list(),
                                   s["share"].to_list(), s["total"].to_list(), s["n_ranks"].to_list()):
        b = before.get((c, r), float("nan"))
        if b == b and b >= share:  # already dominant before the change: not this change
            continue
        # dominant outright, or (a partial first window) far above its usual share
        p0 = min(max(b if b == b else 0.0, 1.0 / max(n, 1)), 0.99)
        z = (sh - p0) * tot / math.sqrt(tot * p0 * (1.0 - p0))
        if not (sh >= share or (z >= 5.0 and sh >= 2.0 * p0)):
            continue
        out.append(StragglerCandidate(int(c), int(r), str(h), float(sh), int(tot), float(b)))
    out.sort(key=lambda c: (c.share * min(c.instances, 50), c.instances), reverse=True)
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
