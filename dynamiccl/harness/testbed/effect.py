"""Which labelled changes moved collective latency at all, measured from the run's own records.

A secondary scorer figure (`dynamiccl.harness.corpus`): a ``tc`` throttle the job's collectives
never feel (a rate above what the buckets need, a direction the ring does not use) is labelled but
cannot be reported from collective latency. This labeller does not use the detector. Per stream
(communicator, message bytes), each 1 s window's median record duration (``end - enqueue``) is
its level, like the detector's replay windows. A labelled change **moved** latency when, for
some stream, the median of its windows in the ``POST_S`` after the onset sits, in the change's
direction, at least ``RATIO`` times and ``Z`` spreads away from the median of its windows before
(from the previous change's onset, at most ``PRE_S``), the spread being the robust sd
(1.4826 × MAD) of the windows before a degradation (the detector's old sigmas), and for an
improvement the smaller of the two sides' (a throttled regime and a draining queue are both noisy). The thresholds are the detector's documented smallest change, not fitted here:

* ``RATIO`` = ``incidents.step_ratio`` (1.1): the smallest level move the detector reports as a
  change of its own (`dynamiccl.detector.steps`);
* ``Z`` = ``fusion.confirm_z`` (3.0): the move, in old sigmas, that confirms an alarm;
* ``POST_S`` = the scorer's 5 s match window: a change that shows nothing within it cannot be
  reported within it; ``PRE_S`` = 20 s, the localiser's baseline span (`dynamiccl.detector.localise`).

Rules on top (each a named function):

* ``unmeasured_counts`` — a change with no stream that has ``MIN_PRE_WINDOWS`` windows before it
  and one after (a sparse, step-paced job) is counted as effective: only a change shown not to
  move latency leaves the effective set.
* ``release_of_no_effect`` — an improvement (release, ``bulk_off``, softer throttle) is no-effect
  when no degradation since the test bed was last at its base state was effective: releasing a
  throttle nobody felt moves nothing either, whatever the noise says.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from dynamiccl.detector.config_groups import FusionConfig, IncidentConfig

__all__ = ["Effect", "stream_windows", "moved", "label", "label_run", "RATIO", "Z"]

RATIO = IncidentConfig.step_ratio
Z = FusionConfig.confirm_z
PRE_S = 20.0
POST_S = 5.0
WINDOW_S = 1.0
MIN_PRE_WINDOWS = 3
MAD_SD = 1.4826
BASE_STATE = ("release", "bulk_off")   # after these the test bed is back at its base state


@dataclass(frozen=True)
class Effect:
    index: int
    effective: bool
    rule: str            # "moved", "no_move", "unmeasured", "release_of_no_effect"
    ratio: float         # the largest move in the change's direction (new/old, or old/new)
    z: float             # that stream's move in pre-onset spreads


def stream_windows(records_dir: Path | str) -> pl.DataFrame:
    """Per stream ``(comm_hash, bytes)`` and 1 s window ``w`` (epoch s): ``med``, the median
    record duration (s) in it."""
    files = sorted(str(p) for p in Path(records_dir).rglob("*.parquet"))
    schema = {"comm_hash": pl.UInt64, "bytes": pl.UInt64, "w": pl.Int64, "med": pl.Float64}
    if not files:
        return pl.DataFrame(schema=schema)
    cols = ["comm_hash", "bytes", "enqueue_ns", "cpu_end_ns", "gpu_end_ns"]
    df = pl.concat([pl.read_parquet(f, columns=cols) for f in files], how="vertical_relaxed")
    end = pl.when(pl.col("cpu_end_ns") > 0).then(pl.col("cpu_end_ns")).otherwise(pl.col("gpu_end_ns"))
    df = (df.with_columns(end.cast(pl.Int64).alias("end"), pl.col("enqueue_ns").cast(pl.Int64).alias("enq"))
            .filter(pl.col("end") > pl.col("enq"))
            .with_columns(((pl.col("end") - pl.col("enq")) / 1e9).alias("dur"),
                          (pl.col("enq") // int(WINDOW_S * 1e9)).alias("w")))
    return (df.group_by("comm_hash", "bytes", "w").agg(pl.col("dur").median().alias("med"))
              .select(pl.col("comm_hash").cast(pl.UInt64), pl.col("bytes").cast(pl.UInt64),
                      pl.col("w").cast(pl.Int64), pl.col("med").cast(pl.Float64))
              .sort("comm_hash", "bytes", "w"))


def moved(pre: np.ndarray, post: np.ndarray, degrades: bool) -> tuple[float, float]:
    """One stream's move in the change's direction: (ratio ≥ 1 when it moved that way, z in
    robust sds of the quieter side, `_lower_regime_sd`; inf when it did not vary)."""
    m0, m1 = float(np.median(pre)), float(np.median(post))
    sd = _lower_regime_sd(pre, post, degrades)
    shift = (m1 - m0) if degrades else (m0 - m1)
    ratio = (m1 / m0 if degrades else m0 / m1) if m0 > 0 and m1 > 0 else float("nan")
    z = shift / sd if sd > 0 else (float("inf") if shift > 0 else 0.0)
    return ratio, z


def _lower_regime_sd(pre: np.ndarray, post: np.ndarray, degrades: bool) -> float:
    """The quieter side's spread: the windows before a degradation (the detector's old-sigma
    rule); for an improvement the smaller of the two sides' spreads, because either can be the
    noisy one — a throttled regime under competing traffic (dev seed 34's ``bulk_off``, 200-400
    ms: in its own sds a 5x drop to 60 ms was 2 sds) or the queue draining after a release (dev
    seed 38's release: 116-158 ms then 70-83 ms within its 5 s)."""
    def spread(v: np.ndarray) -> float:
        return MAD_SD * float(np.median(np.abs(v - np.median(v))))
    if degrades or len(post) < MIN_PRE_WINDOWS:
        return spread(pre)
    return min(spread(pre), spread(post))


def _spans(events: list, i: int) -> tuple[float, float, float, float]:
    e = events[i]
    prev = events[i - 1].onset_wall if i > 0 else -np.inf
    nxt = events[i + 1].onset_wall if i + 1 < len(events) else np.inf
    return max(e.onset_wall - PRE_S, prev), e.onset_wall, e.onset_wall, min(e.onset_wall + POST_S, nxt)


def _measure(windows: pl.DataFrame, events: list, i: int) -> Effect:
    """The rule ``moved`` / ``no_move``, or ``unmeasured_counts`` when no stream has the windows."""
    e = events[i]
    a, b, c, d = _spans(events, i)
    moves: list[tuple[bool, float, float]] = []
    sel = windows.filter((pl.col("w") >= int(np.floor(a))) & (pl.col("w") < int(np.ceil(d))))
    for _, g in sel.group_by("comm_hash", "bytes"):
        w, med = g["w"].to_numpy(), g["med"].to_numpy()
        # whole windows only: a window holding the onset is partly the old regime
        pre, post = med[(w >= a) & (w + WINDOW_S <= b)], med[(w >= c) & (w < d)]
        if len(pre) < MIN_PRE_WINDOWS or len(post) < 1:
            continue
        r, z = moved(pre, post, e.degrades)
        moves.append((bool(r >= RATIO and z >= Z), r if r == r else -np.inf, z))
    if not moves:
        return unmeasured_counts(e.index)
    hit, r, z = max(moves, key=lambda m: (m[0], m[1]))
    return Effect(e.index, hit, "moved" if hit else "no_move", r, z)


def unmeasured_counts(index: int) -> Effect:
    """No stream with enough windows around the onset: cannot be shown not to move, so it counts."""
    return Effect(index, True, "unmeasured", float("nan"), float("nan"))


def release_of_no_effect(effects: list[Effect], events: list, i: int) -> bool:
    """An improvement with no effective degradation since the test bed was last at base state."""
    for j in range(i - 1, -1, -1):
        if events[j].do in BASE_STATE:
            return True
        if events[j].degrades and effects[j].effective:
            return False
    return True


def label(events: list, windows: pl.DataFrame) -> list[Effect]:
    """One `Effect` per event (``TruthEvent``s), in onset order."""
    events = sorted(events, key=lambda e: e.onset_wall)
    out: list[Effect] = []
    for i, e in enumerate(events):
        eff = _measure(windows, events, i)
        if eff.effective and not e.degrades and release_of_no_effect(out, events, i):
            eff = Effect(e.index, False, "release_of_no_effect", eff.ratio, eff.z)
        out.append(eff)
    return out


def label_run(events: list, records_dir: Path | str) -> list[Effect]:
    return label(events, stream_windows(records_dir))
