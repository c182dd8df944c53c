"""Each warm-up CUSUM chart's excursion has its own reference (`early_cusum.SparseWarmupCusum`).

Rule: a chart (one delta, both sides) that stands at 0 has no open excursion; it is standardised
against all the stream's warm-up samples so far, with the threshold for that many samples
(`dynamiccl.detector.arl.cusum_threshold_estimated`). When its statistic leaves 0 its reference is
frozen at the samples before that (so a change never enters its own reference), until it is back
at 0 or alarms.

Why: the charts shared one excursion, opened by whichever chart left 0 first and closed only when
all were back at 0. The small-shift chart (delta 2, k = 1) stays above 0 for as long as the later
samples sit 1 sigma above an early, short reference, which a stream's warm-up slowly drifting
(or a short reference's own error: 0.3-0.4 sigma at 10 samples) keeps doing; the large-shift chart
was then judged against those first samples too, with their threshold. On a test-bed step-paced
job (dev seed 32) the reference stayed at the first 11 samples for 25 more: the delta-6 threshold
stayed 13.1 (90 for delta 2) instead of the 2.5-3.2 that 20-25 samples give, and a 7.8x bulk-traffic
slowdown and a 4.7x throttle were never reported. Each chart's threshold is calibrated for a
chart started afresh on a baseline of n samples; one chart's open excursion says nothing about
the other's, so each keeps its own. No value is chosen.
"""
from __future__ import annotations

import numpy as np

__all__ = ["ChartExcursions"]


class ChartExcursions:
    """Per-stream, per-chart reference sizes and onsets, with the counter of charts that
    re-opened on a larger reference than the stream's oldest open excursion."""

    def __init__(self, capacity: int, n_charts: int):
        self.n_charts = int(n_charts)
        self._alloc(capacity)
        self.n_wider = 0   # charts judged on more samples than the oldest open excursion's

    def _alloc(self, n: int) -> None:
        self.keep = np.full((n, self.n_charts), -1, np.int64)   # samples before the chart's excursion; -1 none
        self.start = np.zeros((n, self.n_charts), np.int64)     # step of its first sample

    def grow(self, extra: int) -> None:
        keep, start = self.keep, self.start
        self._alloc(extra)
        self.keep, self.start = np.concatenate([keep, self.keep]), np.concatenate([start, self.start])

    def forget(self, idx) -> None:
        self.keep[idx] = -1

    def reference(self, i: int, c: int, min_samples: int) -> np.ndarray:
        """Samples each chart of stream ``i`` is judged on (``c``: its warm-up samples so far); an
        excursion opened on too few samples is judged afresh."""
        k = self.keep[i]
        n = np.where(k >= 0, k, c)
        short = n < min_samples
        if short.any():
            self.keep[i, short] = -1
            n = np.where(short, c, n)
        if (k >= 0).any() and (n > k[k >= 0].min()).any():
            self.n_wider += 1
        return n

    def update(self, i: int, t: int, n: np.ndarray, up: np.ndarray, down: np.ndarray) -> None:
        """After the charts' statistics moved: open the excursions that left 0, close those back."""
        active = (up > 0) | (down > 0)
        opened = active & (self.keep[i] < 0)
        self.keep[i, opened] = n[opened]
        self.start[i, opened] = t
        self.keep[i, ~active] = -1

    def oldest(self, i: int) -> tuple[int, int]:
        """(samples before, onset step) of stream ``i``'s oldest open excursion; (-1, 0) if none."""
        k = self.keep[i]
        if not (k >= 0).any():
            return -1, 0
        j = int(np.flatnonzero(k >= 0)[np.argmin(k[k >= 0])])
        return int(k[j]), int(self.start[i, j])

    def of_alarm(self, i: int, crossed: np.ndarray) -> tuple[int, int]:
        """(samples before, onset step) of the crossing charts' excursion: the latest onset among
        them (the tightest estimate, as the banks take it)."""
        j = np.flatnonzero(crossed)
        j = j[np.argmax(self.start[i, j])]
        return int(self.keep[i, j]), int(self.start[i, j])
