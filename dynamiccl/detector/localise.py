"""Where a change is: a slow rank or a slow link, from per-instance offsets between ranks.

No clock is compared across hosts in absolute terms: within each instance (one collective call,
``(comm_hash, seq_number)``, seen by every rank) each rank's enqueue and finish times are taken
relative to that instance's median rank, and only the *change* of a rank's median offset from
before the onset to after it is used — a constant per-host clock offset cancels.

The slowest rank is the one whose arrival and finish offsets grew most; two named rules say what
it is (developed on the test-bed corpus's development half, docs/corpus.md):

* ``late_arrival`` — its arrival grew by at least ``ARRIVAL_SHARE`` of its finish: it reaches
  the collective late (a compute straggler, or a rank whose input arrives over a slow ingress
  link: in a DDP-like step the batch is loaded before the buckets are launched). Its peers wait
  for it. Verdict: the rank.
* ``late_finish`` — otherwise: what it receives is slow (its ingress, or its ring predecessor's
  egress; a late finish also delays its next arrival when steps run back to back, hence the share
  rather than "no late arrival"). Verdict: the link into that rank, named as the pair
  ``(predecessor, rank)`` in gloo's ring order.

The confidence is the winner's shift over the sum of all ranks' positive shifts (1.0 when one rank
carries the whole shift), each shift in units of that rank's pre-onset spread (MAD), floored by
``min_shift_s`` so that scheduling jitter on a quiet machine is not a signature.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

__all__ = ["Where", "read_instances", "instance_offsets", "rank_shifts", "localise", "judge"]

PRE_S = 20.0      # baseline span before the onset
POST_MIN_S = 3.0  # at least this much after the onset is looked at
MIN_SHIFT_S = 2e-3
ARRIVAL_SHARE = 0.8  # dev half: ingress/bulk 1.0-2.1x the finish shift, egress 0.08-0.67x


@dataclass(frozen=True)
class Where:
    kind: str                       # "rank" (late arrival) or "link" (late finish)
    rank: int                       # the slow rank, or the rank the slow link leads into
    link: tuple[int, int] | None    # (from, to) in ring order for "link"
    confidence: float
    rule: str

    def as_dict(self) -> dict:
        return asdict(self)


def read_instances(records_dir: Path | str) -> pl.DataFrame:
    """rank, comm_hash, seq_number, enqueue_ns, end_ns of every collective record under ``records_dir``."""
    files = sorted(str(p) for p in Path(records_dir).rglob("*.parquet"))
    if not files:
        return pl.DataFrame(schema={"rank": pl.Int32, "nranks": pl.Int32, "comm_hash": pl.UInt64,
                                    "seq_number": pl.UInt64, "enqueue_ns": pl.Int64, "end_ns": pl.Int64})
    cols = ["rank", "nranks", "comm_hash", "seq_number", "enqueue_ns", "cpu_end_ns", "gpu_end_ns"]
    df = pl.concat([pl.read_parquet(f, columns=cols) for f in files], how="vertical_relaxed")
    end = pl.when(pl.col("cpu_end_ns") > 0).then(pl.col("cpu_end_ns")).otherwise(pl.col("gpu_end_ns"))
    return (df.with_columns(end.cast(pl.Int64).alias("end_ns"), pl.col("enqueue_ns").cast(pl.Int64))
              .filter(pl.col("end_ns") > pl.col("enqueue_ns"))
              .select("rank", "nranks", "comm_hash", "seq_number", "enqueue_ns", "end_ns"))


def instance_offsets(df: pl.DataFrame) -> pl.DataFrame:
    """Per record of a complete instance: enqueue (``arr``) and finish (``fin``) offsets from the
    instance's median rank, and the instance's time ``t_ns`` (its median enqueue). Instances are
    joined by ``(comm_hash, seq_number)``, never by time, so per-host clock offsets cancel."""
    if "arr" in df.columns:
        return df
    inst = ["comm_hash", "seq_number"]
    return (df.with_columns(pl.len().over(inst).alias("_n"))
              .filter(pl.col("_n") == pl.col("nranks"))
              .with_columns((pl.col("enqueue_ns") - pl.col("enqueue_ns").median().over(inst)).alias("arr"),
                            (pl.col("end_ns") - pl.col("end_ns").median().over(inst)).alias("fin"),
                            pl.col("enqueue_ns").median().over(inst).alias("t_ns")))


def rank_shifts(records: pl.DataFrame, onset_s: float, detected_s: float) -> pl.DataFrame | None:
    """Per rank: median arrival / finish offset change (s) and its pre-onset spread (MAD, s)."""
    lo, on = (onset_s - PRE_S) * 1e9, onset_s * 1e9
    hi = max(detected_s, onset_s + POST_MIN_S) * 1e9
    win = instance_offsets(records)
    win = win.filter((pl.col("t_ns") >= lo) & (pl.col("t_ns") < hi))
    pre, post = win.filter(pl.col("t_ns") < on), win.filter(pl.col("t_ns") >= on)
    if pre.height == 0 or post.height == 0:
        return None

    def stats(d: pl.DataFrame, tag: str) -> pl.DataFrame:
        return d.group_by("rank").agg(
            (pl.col("arr").median() / 1e9).alias(f"arr_{tag}"), (pl.col("fin").median() / 1e9).alias(f"fin_{tag}"),
            ((pl.col("arr") - pl.col("arr").median()).abs().median() / 1e9).alias(f"arr_mad_{tag}"),
            ((pl.col("fin") - pl.col("fin").median()).abs().median() / 1e9).alias(f"fin_mad_{tag}"))

    s = stats(pre, "pre").join(stats(post, "post"), on="rank", how="inner")
    return s.with_columns((pl.col("arr_post") - pl.col("arr_pre")).alias("d_arr"),
                          (pl.col("fin_post") - pl.col("fin_pre")).alias("d_fin")).sort("rank")


def _score(shift: pl.Series, mad: pl.Series, min_shift_s: float) -> list[float]:
    return [max(0.0, d) / max(3 * m, min_shift_s) for d, m in zip(shift.to_list(), mad.to_list())]


def _pick(ranks: list[int], scores: list[float]) -> tuple[int, float] | None:
    best = max(range(len(ranks)), key=lambda i: scores[i])
    total = sum(scores)
    if scores[best] < 1.0 or total <= 0:
        return None
    return ranks[best], scores[best] / total


def _slowest(s: pl.DataFrame, min_shift_s: float) -> tuple[int, float] | None:
    """The rank whose arrival and finish offsets grew most (in units of its pre-onset spread)."""
    arr = _score(s["d_arr"], s["arr_mad_pre"], min_shift_s)
    fin = _score(s["d_fin"], s["fin_mad_pre"], min_shift_s)
    return _pick(s["rank"].to_list(), [a + f for a, f in zip(arr, fin)])


def late_arrival(s: pl.DataFrame, k: int, confidence: float) -> Where | None:
    """The slowest rank arrives late by at least ``ARRIVAL_SHARE`` of its finish shift: it reaches
    the collective late (a compute straggler, or its input comes in over a slow ingress link: a
    DDP-like step loads its batch before launching its buckets). Its peers wait for it."""
    row = s.filter(pl.col("rank") == k).row(0, named=True)
    if row["d_arr"] < ARRIVAL_SHARE * row["d_fin"]:
        return None
    return Where("rank", k, None, round(confidence, 3), "late_arrival")


def late_finish(s: pl.DataFrame, k: int, confidence: float) -> Where | None:
    """The slowest rank finishes late more than it arrives late: what it receives is slow — the
    link into it from its ring predecessor, ``k + 1`` (gloo's ring passes data to the next lower
    rank: an egress throttle on rank r delays rank r - 1's finish, dev half)."""
    n = int(s["rank"].max()) + 1
    return Where("link", k, ((k + 1) % n, k), round(confidence, 3), "late_finish")


RULES = (late_arrival, late_finish)


def localise(records: pl.DataFrame, *, onset_s: float, detected_s: float,
             min_shift_s: float = MIN_SHIFT_S) -> Where | None:
    """The first rule with a verdict, or None (no rank or link stands out: a job-wide change)."""
    return judge(rank_shifts(records, onset_s, detected_s), min_shift_s)


def judge(s: pl.DataFrame | None, min_shift_s: float = MIN_SHIFT_S) -> Where | None:
    """The rules on per-rank shifts (``rank``, ``d_arr``, ``d_fin``, ``arr_mad_pre``,
    ``fin_mad_pre``; from records, :func:`rank_shifts`, or from the windows' rank offsets,
    `dynamiccl.detector.where`)."""
    if s is None or s.height < 2:
        return None
    hit = _slowest(s, min_shift_s)
    if hit is None:
        return None
    for rule in RULES:
        where = rule(s, *hit)
        if where is not None:
            return where
    return None
