"""A warm-up that holds two regimes: the baseline restarts from the later one.

Rule: when a stream's warm-up buffer is full, Pettitt's rank test looks for one level shift in
it. Where the shift is significant (p < ``ALPHA``), moves the median by at least
``min_log_move`` (the detector's smallest reported level move, ``incidents.step_ratio``) and
leaves at least ``MIN_LATER`` samples after it, the baseline is learnt from the later samples
alone, with their count (the self-starting standardisation, `dynamiccl.detector.self_start`,
widens the chart for a short baseline, so the false-alarm rate holds whatever the split).

Why: a step inside the warm-up (a throttle the detector could not yet see, or a change missed
before a re-learn) gave a baseline between the two levels with a scale inflated by the step
(log-scale sigma 0.5-0.9 on the test bed): a later 7x shift then moved the CUSUM by ~1 a window
against h = 18. Ranks make the test scale-free and blind to heavy tails; its level is fixed by
the statistics, not by a score: Pettitt's approximation p = 2 exp(-6 K^2 / (n^3 + n^2)).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["later_regime", "ALPHA", "MIN_LATER"]

ALPHA = 1e-3      # false split rate per full warm-up of one stream (in-control data, independent)
MIN_LATER = 20    # samples behind a baseline: the shortest warm-up issue 17 allows (20 instances)
MIN_EARLIER = 5   # a shift in the first few samples is a start-up transient's business, not a regime


def later_regime(rows: np.ndarray, min_log_move: float) -> np.ndarray:
    """Per row of ``rows`` (streams x warm-up samples, log latency, all finite): the index where
    the later regime starts, 0 where the buffer holds one regime."""
    rows = np.asarray(rows, np.float64)
    m, n = rows.shape
    out = np.zeros(m, np.int64)
    if n < MIN_LATER + MIN_EARLIER:
        return out
    ranks = rows.argsort(axis=1).argsort(axis=1).astype(np.float64) + 1.0
    k = np.arange(1, n + 1, dtype=np.float64)
    u = 2.0 * np.cumsum(ranks, axis=1) - k[None, :] * (n + 1)     # Pettitt's U_k (no ties)
    lo, hi = MIN_EARLIER - 1, n - MIN_LATER                        # split after sample index j
    cand = np.abs(u[:, lo:hi])
    j = cand.argmax(axis=1) + lo
    big = cand.max(axis=1)
    p = 2.0 * np.exp(-6.0 * big**2 / (n**3 + n**2))
    for r in np.flatnonzero(p < ALPHA):
        split = int(j[r]) + 1
        move = abs(float(np.median(rows[r, split:]) - np.median(rows[r, :split])))
        if move >= min_log_move:
            out[r] = split
    return out


def min_move(step_ratio: float) -> float:
    """The smallest level move (log) a split must show: ``incidents.step_ratio``."""
    return math.log(step_ratio)


def split_warmups(table, done: np.ndarray) -> np.ndarray:
    """Streams ``done`` just finished their warm-up in ``table`` (`StreamTable`): those whose
    buffer holds two regimes warm up again from the later one's samples (the baseline keeps the
    full warm-up's sample count, so its calibrated threshold holds); counted in
    ``table.n_warmup_splits``. Returns the streams that stay monitored."""
    cfg = table.config
    if not cfg.baseline.split_warmup or done.size == 0:
        return done
    rows = table.banks[0].full_warmup(done)
    start = later_regime(rows, min_move(cfg.incidents.step_ratio))
    split = start > 0
    if not split.any():
        return done
    idx, s, n = done[split], start[split], rows.shape[1]
    later = np.full((idx.size, n), np.nan)
    for r, (row, k) in enumerate(zip(rows[split], s)):
        later[r, : n - k] = row[k:]
    for bank in table.banks:
        bank.resume_warmup(idx, later, n - s)
    table.n_warmup_splits += int(idx.size)
    return done[~split]
