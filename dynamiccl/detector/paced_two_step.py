"""A step-paced job's change seen on two successive steps, the second on several streams.

A step-paced job (`dynamiccl.detector.sparse.JobCadence.paced`) gives each stream one sample per
2-10 s step. In its first warm-up that sample is judged by the early chart (two successive
values >= ``early_ratio`` x and >= ``early_z`` MAD-sigma) and the short-baseline warm-up CUSUMs
(`dynamiccl.detector.paced_warmup`), whose threshold at 10-30 samples carries the short
baseline's estimation error. On the test bed (corpus dev seed 2, 5.2x bulk traffic, 24 warm-up
samples) the first two post-onset steps of the job's paced stream were 2.9-3.1x its warm-up
median and 4.4 / 6.1 sigma out, and in the second step the job's two other streams were
3.3-3.9x too; neither chart had crossed, so the alarm came with the third step and the change
was reported 6.6 s after its onset.

Rule (`PacedTwoStep`, switch ``baseline.paced_two_step``): a step-paced stream alarms, already
confirmed, when its last two samples both lie >= ``fusion.confirm_z`` sigma and >= ``early_ratio``
x on one side of its warm-up reference (the samples before the open excursion: the warm-up
CUSUMs' own, so the change never enters it) and each is backed by its job's step: in that
window at least ``fusion.corroborate`` judged streams of the job (itself included) lie beyond
both bars on that side, or all of them do. Evidence counted in steps and streams, not windows:
two steps are two looks at the job's network state (the fusion stage's confirmation of a lone
alarm is its next window beyond ``confirm_z``), each corroborated by the job's other collectives
(the fusion stage's ``corroborate``). One slow step of the whole job (the next step back) has one
step; a chance outlier of one stream is not backed by its step's other streams (nor is a stall
that follows it); a shift below 1.5x is left to the CUSUMs.
"""
from __future__ import annotations

import math

import numpy as np

from ._baseline import robust_baseline

__all__ = ["PacedTwoStep"]


class PacedTwoStep:
    """Per stream: the side of its last sample beyond both bars; the counter."""

    def __init__(self, capacity: int, *, enabled: bool = False, ratio: float = 1.5, corroborate: int = 2):
        self.enabled = bool(enabled)
        self.log_ratio = math.log(ratio) if ratio > 1 else math.inf
        self.corroborate = int(corroborate)
        self.last = np.zeros(capacity, np.int8)   # side of the stream's last sample beyond both bars, else 0
        self.n_fired = 0   # alarms raised by this rule (no warm-up chart had crossed)

    def grow(self, extra: int) -> None:
        self.last = np.concatenate([self.last, np.zeros(extra, np.int8)])

    def forget(self, idx) -> None:
        self.last[idx] = 0

    def sides(self, cusum, j: np.ndarray, x: np.ndarray, rows: np.ndarray, counts: np.ndarray,
              floor: float) -> np.ndarray:
        """Per sample: +-1 where it lies >= ``confirm_z`` sigma and >= ``early_ratio`` x from its
        stream's warm-up reference (the samples before its open excursion, else all), 0 where it
        does not, -2 where it is not judged (fewer than ``early_min`` warm-up samples)."""
        side = np.full(j.size, -2, np.int8)
        if not self.enabled:
            return side
        for m, (i, xi, c) in enumerate(zip(j.tolist(), x.tolist(), counts.tolist())):
            if c < cusum.min_samples:
                continue
            n = int(cusum.keep[i]) if cusum.keep[i] >= cusum.min_samples else int(c)
            loc, scale = robust_baseline(rows[m, :n], cusum.estimator)
            d = xi - float(loc)
            far = abs(d) >= self.log_ratio and abs(d) >= cusum.confirm_z * max(float(scale), floor)
            side[m] = (1 if d > 0 else -1) if far else 0
        return side

    def backed(self, side: np.ndarray, codes: np.ndarray | None) -> np.ndarray:
        """Per sample: its job's step backs it. In this window ``corroborate`` judged samples of
        its job lie beyond on its side, or all of them do (a job whose streams complete their
        samples in different windows: a pooled stream's every other step)."""
        ok = np.zeros(side.size, bool)
        if codes is None or not (np.abs(side) == 1).any():
            return ok
        codes = codes.astype(np.int64)
        judged = side != -2
        for code in np.unique(codes[np.abs(side) == 1]).tolist():
            mine = (codes == code) & judged
            for s in (-1, 1):
                n = int((mine & (side == s)).sum())
                if n and (n >= self.corroborate or n == int(mine.sum())):
                    ok |= mine & (side == s)
        return ok

    def check(self, i: int, side: int, backed: bool) -> int:
        """Stream ``i``'s sample on ``side`` (0: not beyond), ``backed`` by its job's step: the
        alarm's direction when its previous sample was a backed one on the same side, else 0."""
        side = side if backed and abs(side) == 1 else 0
        prev = int(self.last[i])
        self.last[i] = side
        return side if side and side == prev else 0
