"""Where a live change is: a slow rank or a slow link, from the windows' per-rank offsets.

The collector's ranks frame carries, per (communicator, rank) and window, the rank's mean
enqueue and finish offsets from its complete instances' mean over ranks (``arr_off_s``,
``fin_off_s``; offsets within an instance, so no clock is compared across hosts). Here the
change of each rank's median offset from the ``PRE_S`` before the change's onset to the windows
since it, in units of its pre-onset spread, goes through the same rules as offline localisation
(`dynamiccl.detector.localise.judge`): a rank that arrives late is the slow rank; one that
finishes late is at the end of a slow link.
"""
from __future__ import annotations

import polars as pl

from .localise import PRE_S, Where, judge
from .straggler import RankHistory

__all__ = ["locate"]

MIN_PRE_WINDOWS = 3   # fewer pre-onset windows with offsets: no verdict


def _shifts(df: pl.DataFrame, onset_step: int) -> pl.DataFrame | None:
    df = df.filter(pl.col("arr_off_s").is_not_null() & pl.col("fin_off_s").is_not_null())
    pre, post = df.filter(pl.col("step") < onset_step), df.filter(pl.col("step") >= onset_step)
    if pre.get_column("step").n_unique() < MIN_PRE_WINDOWS or post.height == 0:
        return None

    def stats(d: pl.DataFrame, tag: str) -> pl.DataFrame:
        return d.group_by("rank").agg(
            pl.col("arr_off_s").median().alias(f"arr_{tag}"), pl.col("fin_off_s").median().alias(f"fin_{tag}"),
            (pl.col("arr_off_s") - pl.col("arr_off_s").median()).abs().median().alias(f"arr_mad_{tag}"),
            (pl.col("fin_off_s") - pl.col("fin_off_s").median()).abs().median().alias(f"fin_mad_{tag}"))

    s = stats(pre, "pre").join(stats(post, "post"), on="rank", how="inner")
    return s.with_columns((pl.col("arr_post") - pl.col("arr_pre")).alias("d_arr"),
                          (pl.col("fin_post") - pl.col("fin_pre")).alias("d_fin")).sort("rank")


def _pre_start(ranks: RankHistory, onset_step: int, window_s: float) -> int:
    """The first step of the ``PRE_S`` of event time before the onset: by the windows' start times
    where kept (a step-paced job's windows with data come seconds apart: 20 steps of one were
    50 s and reached into the regime before the last one, dev half seed 22), else ``PRE_S / window_s``
    steps."""
    t_on = ranks.start_of(onset_step)
    lo = ranks.step_at(t_on - PRE_S) if t_on is not None else None
    return lo if lo is not None else onset_step - max(1, int(round(PRE_S / window_s)))


def _window_before(ranks: RankHistory, onset_step: int, window_s: float) -> int | None:
    """The step of the window just before the onset's (starting one ``window_s`` earlier), if kept."""
    t_on = ranks.start_of(onset_step)
    if t_on is None:
        return onset_step - 1
    return next((s for s, t in reversed(ranks.starts) if s < onset_step and t >= t_on - window_s - 1e-6), None)


def _onset_slack(part: pl.DataFrame, onset_step: int, before: int | None,
                 counters: dict | None) -> pl.DataFrame | None:
    """Rule ``onset_slack``: while no window since the onset estimate holds a complete instance
    (a throttled collective outlasting its window, a step-paced job between steps), the window just
    before the estimate is judged as the first post-onset one: the estimate is a CUSUM's reset
    point, uncertain by about a window (dev half: -1.5 to +1.6 s off the true onset), and that
    window may hold the change's only instances so far (dev half seed 32: the onset's window had the
    bulk-loaded rank's late finish, the next four none complete)."""
    if before is None:
        return None
    has = part.filter(pl.col("arr_off_s").is_not_null() & pl.col("fin_off_s").is_not_null())
    if has.filter(pl.col("step") >= onset_step).height or not has.filter(pl.col("step") == before).height:
        return None
    if counters is not None:
        counters["where_onset_slack"] = counters.get("where_onset_slack", 0) + 1
    return _shifts(part, before)


def locate(ranks: RankHistory, job: str, comms: list[int], *, onset_step: int, now_step: int,
           window_s: float, counters: dict | None = None) -> tuple[int, Where] | None:
    """The most confident verdict over ``comms`` (communicator hash, verdict), or None."""
    lo = _pre_start(ranks, onset_step, window_s)
    df = ranks.window(job, comms, lo, now_step + 1)
    if df is None or df.height == 0 or "arr_off_s" not in df.columns:
        return None
    before = _window_before(ranks, onset_step, window_s)
    best = None
    for (comm,), part in df.group_by(["comm_hash"]):
        sh = _shifts(part, onset_step)
        w = judge(sh if sh is not None else _onset_slack(part, onset_step, before, counters))
        if w is not None and (best is None or w.confidence > best[1].confidence):
            best = (int(comm), w)
    return best
