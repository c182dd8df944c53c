"""Step-paced streams in their first warm-up are also charted by the short-baseline CUSUMs.

A job whose collectives all come once per 2-10 s training step (`JobCadence.paced`: its windows
with data come every >= 1.5 windows) gives each of its streams one sample per step, however many
instances the step holds. Their first fixed baseline then waits ``baseline.warmup`` samples: 60
steps, 120-150 s at a 2-2.5 s step (the whole of a test-bed run), during which only the early
chart (a 1.5x bar, 5 MAD-sigma, two successive samples) judged them; a 1.3x throttle was never
reported and a 1.6x one waited for its second step.

Rule: such a stream's samples are also fed to the sparse streams' warm-up CUSUMs
(`dynamiccl.detector.early_cusum`) from ``early_min`` samples on: each standardised against the
winsorised baseline of its warm-up samples before the excursion, with the threshold that holds
the per-stream false-alarm rate for a baseline of that many samples
(`dynamiccl.detector.arl.cusum_threshold_estimated`), the rate per window divided over the
stream's sample spacing. The hand-over thus depends on what the baseline has seen (samples),
not on calendar windows, and the threshold carries the short baseline's estimation error: 10
samples is where it first becomes usable (delta 6 at 1e5 / 4 windows per sample: 13 sigma at
10 samples, 113 at 6, 772 at 4), and it shrinks as the warm-up grows (2.7 at 20). The baseline
keeps improving: every in-control sample joins the warm-up until the fixed baseline takes over.

Two parts keep a step's hiccup apart from a change (`PacedConfirm`): an alarm resting on one
sample waits for the stream's next sample, and an alarm resting on two successive samples
beyond ``fusion.confirm_z`` (or the early chart's two values beyond ``early_z``) carries the
fusion stage's confirmation already, so it is not held another step for it.

Dense jobs (a window with data every window) are not paced: the simulated suite is unchanged.
The short-baseline threshold cannot alarm on fewer than ``early_min`` samples (10: 13 sigma for
delta 6 at 4 windows per sample; 113 at 6, 772 at 4), so a job with one sample per 2.5 s step
can alarm from 25 s, not from issue 17's 10 s: what is left needs the step's instances as
samples of their own.
"""
from __future__ import annotations

import numpy as np

__all__ = ["PacedWarmup"]


class PacedWarmup:
    """The gate: which of a window's streams the warm-up CUSUMs chart, with its counter."""

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self.n_charted = 0   # samples of step-paced (not pooled) streams given to the warm-up CUSUMs

    def charted(self, cadence, codes: np.ndarray, thin: np.ndarray, window_s: float) -> tuple[np.ndarray, np.ndarray]:
        """(charted, confirm): ``thin`` (pooled samples, always charted) or'ed with the streams
        of step-paced jobs, and which of them wait for their next sample (`PacedConfirm`)."""
        thin = np.asarray(thin, bool)
        paced = np.zeros(thin.size, bool)
        if self.enabled and codes.size:
            jobs = [c for c in np.unique(codes).tolist() if cadence.paced(c, window_s)]
            if jobs:
                paced = np.isin(codes, jobs) & ~thin
        self.n_charted += int(paced.sum())
        return thin | paced, paced


class PacedConfirm:
    """A step-paced stream's warm-up CUSUM alarm stands only if the stream's next sample confirms it.

    Rule: an alarm that rests on one sample alone (every chart that crossed stood at 0 before
    it: the large-shift chart's one-sample test) is held (``pending``) for one sample; it is
    reported, with its onset at the
    excursion's first sample, when the next sample still lies on its side of the warm-up
    baseline by at least the firing chart's reference value k (delta / 2 sigma: the value the
    CUSUM counts as evidence); otherwise the excursion is dropped and its statistics cleared.

    Why: a step's collectives are not independent evidence. One slow step (a stall of the shared
    machine, a straggling compute phase) moves every stream of the job in the same window: on the
    test bed single steps 1.6-3.6x above the baseline, followed by a normal step, alarmed two
    streams at once, which the fusion stage's big-shift rule (2 streams) took for a change, and
    the early chart's two successive values (``early.PERSIST``) are what kept it out before. The
    one-sample delay is the early chart's and the fusion stage's confirmation for sparse streams;
    it is not a fitted figure.
    """

    @staticmethod
    def count_beyond(cusum, i: int, x: float, row: np.ndarray, c: int, floor: float) -> None:
        """Stream ``i``'s run of successive samples ``confirm_z`` or more away from its warm-up
        baseline (the open excursion's samples before it, else all ``c``), signed by side."""
        from ._baseline import robust_baseline
        n = int(cusum.keep[i]) if cusum.keep[i] >= cusum.min_samples else c
        loc, scale = robust_baseline(row[:n], cusum.estimator)
        z = (x - float(loc)) / max(float(scale), floor)
        side = int(np.sign(z)) if abs(z) >= cusum.confirm_z else 0
        run = int(cusum.beyond_run[i])
        cusum.beyond_run[i] = side * min(abs(run) + 1, 2) if side and side * run > 0 else side

    @staticmethod
    def mark_confirmed(cusum, t: int, j: np.ndarray, fired: np.ndarray, direction: np.ndarray) -> None:
        """Fired alarms of step-paced streams whose last two samples were both ``confirm_z``
        away on the alarm's side carry the fusion stage's confirmation already."""
        k = np.flatnonzero(fired)
        ok = cusum.beyond_run[j[k]] * direction[k] >= 2
        cusum.confirmed_at[j[k[ok]]] = t

    @staticmethod
    def lone(cusum, i: int, before: tuple[np.ndarray, np.ndarray], h: np.ndarray) -> bool:
        """Stream ``i``'s alarm rests on this sample alone: every chart that crossed ``h`` stood
        at 0 before it (an alarm accumulated over successive samples needs no confirmation)."""
        up = cusum.up[i] >= h
        side, prev = (up, before[0]) if up.any() else (cusum.down[i] >= h, before[1])
        return bool(np.all(prev[side] == 0.0))

    @staticmethod
    def hold(cusum, i: int, direction: int, h: np.ndarray) -> None:
        """Stream ``i``'s chart crossed ``h`` on ``direction``'s side: wait for its next sample
        (k of the smallest delta that crossed)."""
        stat = cusum.up[i] if direction > 0 else cusum.down[i]
        crossed = stat >= h
        cusum.pending[i] = direction
        cusum.pending_k[i] = float(np.min(cusum.deltas[crossed])) / 2.0
        cusum.n_held += 1

    @staticmethod
    def judge(cusum, i: int, x: float, row: np.ndarray, floor: float) -> int:
        """Stream ``i``'s sample after a held alarm: the alarm's direction if it confirms, else
        0 (the excursion is dropped; the sample is then judged afresh)."""
        from ._baseline import robust_baseline
        d = int(cusum.pending[i])
        n = int(cusum.keep[i])
        ok = n >= cusum.min_samples
        if ok:
            loc, scale = robust_baseline(row[:n], cusum.estimator)
            z = (x - float(loc)) / max(float(scale), floor)
            ok = d * z >= cusum.pending_k[i]
        if ok:
            return d
        cusum.forget(i)
        cusum.n_unconfirmed += 1
        return 0
