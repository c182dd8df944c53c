"""A step inside a pooled stream's first warm-up buffer is reported.

Gate (``baseline.warmup_step``): pooled streams (`dynamiccl.detector.sparse`) are judged by the
warm-up charts, in their *first* warm-up, only once ``early_min`` samples are behind a value:
20 instances (100 s) at one all-reduce per 5 s step pooled two at a time. A throttle 8-10 instances in puts
its samples into that buffer, and every later value is then judged against a baseline that
already holds the changed regime: the change was never reported (issue 17's blind spot).

Rule: from ``early_min`` samples on (the buffer plus the current value), every split with at
least ``MIN_SIDE`` samples on each side whose first after-sample is one of the buffer's first
``early_min`` (the samples no chart judged: a later step is judged by the early chart and the
warm-up CUSUMs against a baseline without it) is tested; a split is a step when

* the after side's median is at least ``early_ratio`` x (or 1 / x) the before side's median and
  at least ``early_z`` robust sigma away, the sigma the larger of the two sides' MAD-sigma
  (floored at ``scale_floor``): the early chart's bars, with the spread of the changed regime
  counted too (a short before side's MAD alone can be tiny);
* every after sample lies beyond the midpoint of the two medians on the step's side (the after
  side is one regime, not a spike or two that move a median of three).

The split with the largest step (in sigma) is reported as an early alarm: its onset the split's
first after-sample, the before samples the old baseline, and the warm-up is kept from them
(`EarlyChart._fire`, `EarlyChart.resume`), so the fusion stage and localisation see an early
alarm like any other. Its three or more after-samples, all on the step's side, are the fusion
stage's confirmation (the next sample on the alarm's side) already: it is not held another
sample for it (10 s at a 5 s step; test-bed dev seed 4: 14 -> 11 steps).

False alarms: the early chart alarms on two successive values beyond both bars; a split here
needs at least ``MIN_SIDE`` (3) successive values beyond the midpoint with their median beyond
both bars (so at least two of them beyond the bars too): the chart's evidence and one more
consistent sample, which (with the after side's spread in the scale) pays for a before side of
3-9 samples estimating its median less well than the chart's 10 or more. The splits tested at
one sample are nested views of one buffer, only the best is taken, and only splits among the
first ``early_min`` samples are tested; what the multiple testing leaves is measured:
no report added on the corpus development half (its figures unchanged) and the simulated
suite (docs/evaluation/2026-11-27-detection.md, Session 21c).

Only pooled streams: step-paced streams (`dynamiccl.detector.paced_warmup`, one sample per 2-2.5
s step of many instances) were tried and left out: on the corpus development half their warm-ups
hold several regimes 15 s apart, and the gate added 2 false alarms for 1 change (seed 2; with the
before side required to be one regime too: +1 false alarm, +0 changes). Dense streams (a whole
sample per window, monitored after 60 windows) are not charted: the simulated suite is unchanged.
"""
from __future__ import annotations

import math

import numpy as np

from ._baseline import MAD_TO_SIGMA

__all__ = ["WarmupStep", "MIN_SIDE", "best_split"]

MIN_SIDE = 3   # samples on each side of a split: a median and a spread on each


def _sigma(v: np.ndarray) -> float:
    return MAD_TO_SIGMA * float(np.median(np.abs(v - np.median(v))))


def best_split(s: np.ndarray, log_ratio: float, z: float, floor: float, last: int | None = None) -> tuple[int, int]:
    """(direction, split) of the largest step in ``s`` (log latency, oldest first) passing the
    bars, its first after-sample at most ``last``; (0, 0) where none does. ``split`` is the
    index of the first after-sample."""
    n = s.size
    if n < 2 * MIN_SIDE or float(s.max() - s.min()) < log_ratio:
        return 0, 0
    best, where, side = 0.0, 0, 0
    for k in range(MIN_SIDE, min(n - MIN_SIDE, n if last is None else last) + 1):
        b, a = s[:k], s[k:]
        mb = float(np.median(b))
        d = float(np.median(a)) - mb
        if abs(d) < log_ratio:
            continue
        scale = max(_sigma(b), _sigma(a), floor)
        score = abs(d) / scale
        if score < z or score <= best:
            continue
        sign = 1 if d > 0 else -1
        if np.all(sign * (a - (mb + d / 2.0)) > 0):
            best, where, side = score, k, sign
    return side, where


class WarmupStep:
    """The gate, the step at which each warm-up sample was taken, and its counter."""

    def __init__(self, capacity: int, width: int, *, enabled: bool, ratio: float, z: float, min_samples: int,
                 scale_floor: float):
        self.enabled = bool(enabled) and ratio > 0
        self.width = int(width)
        self.log_ratio = math.log(ratio) if ratio > 0 else math.inf
        self.z, self.min_samples, self.floor = float(z), int(min_samples), float(scale_floor)
        self.steps = np.zeros((capacity, self.width), np.int64)
        self.n_steps = 0   # early alarms raised by a step inside a warm-up buffer

    def grow(self, extra: int) -> None:
        self.steps = np.concatenate([self.steps, np.zeros((extra, self.width), np.int64)])

    def note(self, t: int, j: np.ndarray, counts: np.ndarray) -> None:
        """The values of streams ``j`` at step ``t`` become warm-up sample ``counts``."""
        ok = counts < self.width
        self.steps[j[ok], counts[ok]] = t

    def test(self, t: int, j: np.ndarray, x: np.ndarray, rows: np.ndarray, counts: np.ndarray,
             charted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Streams ``j`` (``charted``: the ones the gate judges) with value ``x`` at step ``t``
        after warm-up samples ``rows[:, :counts]``: (fired, direction, onset step, samples before it)."""
        fired = np.zeros(j.size, bool)
        direction = np.zeros(j.size, np.int8)
        start = np.full(j.size, t, np.int64)
        keep = np.zeros(j.size, np.int64)
        if not self.enabled:
            return fired, direction, start, keep
        for m in np.flatnonzero(charted & (counts >= self.min_samples)).tolist():
            c = int(counts[m])
            s = np.append(rows[m, :c], x[m])
            side, k = best_split(s, self.log_ratio, self.z, self.floor, self.min_samples - 1)
            if side:
                fired[m], direction[m], keep[m] = True, side, k
                start[m] = self.steps[j[m], k] if k < c else t
        self.n_steps += int(fired.sum())
        return fired, direction, start, keep
