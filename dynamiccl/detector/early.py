"""The early chart: large shifts during a stream's first warm-up.

A stream is monitored by its CUSUMs only once ``baseline.warmup`` windows have given it a fixed
baseline. A change inside that time (the test bed's first change comes ~35 s after the start)
went unreported and became part of the baseline. While a stream is in its *first* warm-up,
this chart judges each value against the warm-up samples so far (median, MAD-sigma floored
at ``scale_floor``):

* a value is *beyond* when it is at least ``early_ratio`` x (or 1 / ``early_ratio`` x) the
  running median and at least ``early_z`` robust sigma away, with ``early_min`` samples
  behind the median;
* the chart alarms when ``PERSIST`` successive values of the stream are beyond on the same
  side (a one-window hiccup is not a change), with the onset at the first of them.

Its alarms are ordinary stream alarms for the fusion stage (pre-onset median and scale as the
old baseline). The warm-up samples before the onset are kept; whenever the stream's old
baseline is restored (a recovery, an unconfirmed alarm) its warm-up goes on from them, so the
changed regime never enters the fixed baseline. After the first warm-up the chart is off:
monitored streams are judged by the CUSUMs alone, exactly as without it.

Sparse streams (pooled samples, `dynamiccl.detector.sparse`) are also judged by CUSUMs with a
threshold for their short baseline (`dynamiccl.detector.early_cusum`): their first warm-up lasts
``warmup`` pooled samples (10 minutes at one all-reduce per 5 s), too long for this chart alone.

Only the streams a job starts with are charted (first seen within ``warmup`` windows of the
job's first window): a stream that appears later (a new message size of a running job) is
a workload change of a monitored job, whose other streams already watch it; charting it
reported a flapping event's on-phases a second time in the simulated suite.
"""
from __future__ import annotations

import math

import numpy as np

from ._baseline import MAD_TO_SIGMA

__all__ = ["EarlyChart", "EarlyAlarms", "PERSIST"]

PERSIST = 2   # successive beyond values that make an alarm


class EarlyAlarms:
    """One window's early alarms (indices into the stream table)."""

    __slots__ = ("idx", "direction", "start", "median", "scale")

    def __init__(self, idx, direction, start, median, scale):
        self.idx, self.direction, self.start, self.median, self.scale = idx, direction, start, median, scale

    @classmethod
    def none(cls) -> "EarlyAlarms":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros(0, np.int64), np.zeros(0), np.zeros(0))


class EarlyChart:
    """Per-stream state of the early chart; the samples are the bank's warm-up buffer."""

    def __init__(self, capacity: int, *, warmup: int, ratio: float, z: float, min_samples: int, scale_floor: float,
                 deltas: tuple[float, ...] = (2.0, 6.0), arl0: float = 1e5, confirm_z: float = 3.0,
                 per_chart: bool = False, step: bool = False, two_step: bool = False,
                 corroborate: int = 2):
        from .early_cusum import SparseWarmupCusum
        from .warmup_step import WarmupStep
        self.warmup = int(warmup)
        self.step = WarmupStep(capacity, self.warmup, enabled=step, ratio=ratio, z=z, min_samples=min_samples,
                               scale_floor=scale_floor)
        self.sparse = SparseWarmupCusum(capacity, deltas=deltas, min_samples=min_samples, confirm_z=confirm_z,
                                        per_chart=per_chart, two_step=two_step, ratio=ratio,
                                        corroborate=corroborate)
        self.arl0 = float(arl0)   # the stream table's per-stream ARL0 (it retargets it)
        self.log_ratio = math.log(ratio) if ratio > 0 else math.inf
        self.z = float(z)
        self.min_samples = int(min_samples)
        self.scale_floor = float(scale_floor)
        self.enabled = ratio > 0
        self._alloc(capacity)
        self.saved: dict[int, np.ndarray] = {}   # stream -> pre-onset warm-up samples of an open alarm
        self.job_start: dict[int, int] = {}      # job code -> step of its first window
        self.n_alarms = 0
        self.n_resumed = 0

    def _alloc(self, n: int) -> None:
        self.run = np.zeros(n, np.int8)          # signed count of successive beyond values
        self.run_start = np.zeros(n, np.int64)   # step of the first of them
        self.run_keep = np.zeros(n, np.int64)    # warm-up samples before it
        self.first = np.ones(n, bool)            # still in the first warm-up
        self.seen = np.zeros(n, bool)            # slot's stream seen (its eligibility is known)
        self.starter = np.zeros(n, bool)         # ... among the streams its job started with

    def grow(self, extra: int) -> None:
        names = ("run", "run_start", "run_keep", "first", "seen", "starter")
        old = [getattr(self, n) for n in names]
        self._alloc(extra)
        self.sparse.grow(extra)
        self.step.grow(extra)
        for n, a in zip(names, old):
            setattr(self, n, np.concatenate([a, getattr(self, n)]))

    def forget(self, idx: np.ndarray) -> None:
        """Slots freed or given a new workload: a new stream's first warm-up."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        self.run[idx], self.first[idx], self.seen[idx] = 0, True, False
        self.sparse.forget(idx)
        for i in idx.tolist():
            self.saved.pop(i, None)

    def release(self, idx: np.ndarray) -> np.ndarray:
        """Streams ``idx`` got a new workload: their open alarms' samples are of the old one.
        Returns which of ``idx`` had an open alarm."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        if not self.saved:
            return np.zeros(idx.size, bool)
        return np.fromiter((self.saved.pop(i, None) is not None for i in idx.tolist()), bool, idx.size)

    def monitored(self, idx: np.ndarray) -> None:
        """Streams ``idx`` got a fixed baseline: the chart is off for them from now on."""
        self.first[idx] = False
        self.run[idx] = 0
        self.sparse.forget(idx)

    def _starters(self, t: int, idx: np.ndarray, codes: np.ndarray) -> None:
        new = ~self.seen[idx]
        if new.any():
            j, c = idx[new], codes[new]
            for code in np.unique(c).tolist():
                self.job_start.setdefault(code, t)
            start = np.fromiter((self.job_start[k] for k in c.tolist()), np.int64, c.size)
            self.starter[j] = t - start < self.warmup
            self.seen[j] = True

    def check(self, t: int, idx: np.ndarray, codes: np.ndarray, x: np.ndarray, bank,
              thin: np.ndarray | None = None, now_s: float = 0.0, window_s: float = 0.0,
              confirm: np.ndarray | None = None) -> EarlyAlarms:
        """Judge values ``x`` of streams ``idx`` (jobs ``codes``; before ``bank`` learns them;
        ``thin``: the ones charted by the warm-up CUSUMs, ``confirm``: those of them whose alarm
        waits for the next sample) against their warm-up samples; returns the alarms (their
        pre-onset samples are saved)."""
        if not self.enabled or idx.size == 0:
            return EarlyAlarms.none()
        self._starters(t, idx, codes)
        cand = self.first[idx] & self.starter[idx] & bank.warming_up[idx]
        cand &= np.isin(idx, list(self.saved), invert=True) if self.saved else True
        j, xv = idx[cand], x[cand]
        thin_j = np.zeros(j.size, bool) if thin is None else np.asarray(thin, bool)[cand]
        confirm_j = np.zeros(j.size, bool) if confirm is None else np.asarray(confirm, bool)[cand]
        if j.size == 0:
            return EarlyAlarms.none()
        rows, counts = bank.warm_samples(j)
        self.step.note(t, j, counts)
        ok = (counts >= self.min_samples) & (counts < bank.warmup - 1)   # not the value completing it
        beyond = np.zeros(j.size, np.int8)
        med = np.full(j.size, np.nan)
        scale = np.full(j.size, np.nan)
        if ok.any():
            # a value within log(ratio) of every sample cannot be beyond: no median needed
            lo, hi = np.nanmin(rows[ok], axis=1), np.nanmax(rows[ok], axis=1)
            far = (xv[ok] - self.log_ratio >= lo) | (xv[ok] + self.log_ratio <= hi)
            k = np.flatnonzero(ok)[far]
            if k.size:
                m = np.nanmedian(rows[k], axis=1)
                s = np.maximum(MAD_TO_SIGMA * np.nanmedian(np.abs(rows[k] - m[:, None]), axis=1), self.scale_floor)
                d = xv[k] - m
                big = (np.abs(d) >= self.log_ratio) & (np.abs(d) >= self.z * s)
                beyond[k] = np.where(big, np.sign(d), 0).astype(np.int8)
                med[k], scale[k] = m, s
        prev = self.run[j]
        same = (beyond != 0) & (np.sign(prev) == beyond)
        fresh = (beyond != 0) & ~same
        self.run_start[j[fresh]] = t
        self.run_keep[j[fresh]] = counts[fresh]
        self.run[j] = np.where(same, prev + beyond, beyond)
        fire = same & (np.abs(self.run[j]) >= PERSIST)
        # two successive values beyond (>= early_z sigma) of a step-paced stream carry the fusion
        # stage's confirmation already (`dynamiccl.detector.paced_warmup.PacedConfirm`)
        if self.z >= self.sparse.confirm_z:
            self.sparse.confirmed_at[j[fire & confirm_j]] = t
        if thin_j.any():
            fire, beyond = self._sparse(t, j, xv, rows, counts, thin_j, fire, beyond, now_s, window_s, confirm_j,
                                        codes[cand])
            fire, beyond = self._step(t, j, xv, rows, counts, thin_j & ~confirm_j, fire, beyond)
        return self._fire(j[fire], beyond[fire], rows[fire], bank)

    def _sparse(self, t, j, xv, rows, counts, thin, fire, beyond, now_s, window_s, confirm, codes):
        """The sparse streams' CUSUMs (`dynamiccl.detector.early_cusum`); a stream both charts fire
        for keeps the chart's onset."""
        m = np.flatnonzero(thin & (counts < self.warmup - 1))
        if m.size == 0:
            return fire, beyond
        f, d, start, keep = self.sparse.step(t, j[m], xv[m], rows[m], counts[m], self.scale_floor, self.arl0,
                                             now_s, window_s, confirm[m], codes=codes[m])
        new = m[f & ~fire[m]]
        self.run_start[j[new]] = start[f & ~fire[m]]
        self.run_keep[j[new]] = keep[f & ~fire[m]]
        fire, beyond = fire.copy(), beyond.copy()
        fire[new], beyond[new] = True, d[f & ~fire[m]]
        return fire, beyond

    def _step(self, t, j, xv, rows, counts, thin, fire, beyond):
        """A step inside the buffer of a stream the warm-up CUSUMs chart
        (`dynamiccl.detector.warmup_step`); a stream another chart fired for keeps that onset."""
        f, d, start, keep = self.step.test(t, j, xv, rows, counts, thin & ~fire & (counts < self.warmup - 1))
        if not f.any():
            return fire, beyond
        self.run_start[j[f]] = start[f]
        self.run_keep[j[f]] = keep[f]
        # its >= 3 after-samples all on the step's side carry the fusion stage's confirmation
        # (the next sample on the alarm's side) already
        self.sparse.confirmed_at[j[f]] = t
        return fire | f, np.where(f, d, beyond).astype(np.int8)

    def _fire(self, j, direction, rows, bank) -> EarlyAlarms:
        if j.size == 0:
            return EarlyAlarms.none()
        keep = self.run_keep[j]
        med = np.empty(j.size)
        scale = np.empty(j.size)
        for n, (i, r, c) in enumerate(zip(j.tolist(), rows, keep.tolist())):
            pre = r[:c].copy()
            self.saved[i] = pre
            med[n] = np.median(pre)
            scale[n] = max(MAD_TO_SIGMA * float(np.median(np.abs(pre - med[n]))), self.scale_floor)
        self.run[j] = 0
        # the warm-up CUSUMs' statistics belong to the excursion just reported: the stream warms up
        # again (from its pre-onset samples on a restore), so they start afresh
        self.sparse.forget(j)
        self.n_alarms += int(j.size)
        return EarlyAlarms(j, direction, self.run_start[j].copy(), med, scale)

    def resume(self, idx: np.ndarray, banks) -> np.ndarray:
        """Streams of ``idx`` with an open early alarm warm up again from their pre-onset
        samples (in every bank); returns the other streams of ``idx``."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        mine = np.fromiter((i in self.saved for i in idx.tolist()), bool, idx.size)
        j = idx[mine]
        if j.size:
            width = banks[0].warmup
            rows = np.full((j.size, width), np.nan)
            counts = np.zeros(j.size, np.int64)
            for n, i in enumerate(j.tolist()):
                pre = self.saved.pop(i)[: width - 1]
                rows[n, : pre.size], counts[n] = pre, pre.size
            for bank in banks:
                bank.resume_warmup(j, rows, counts)
            self.run[j] = 0
            self.first[j] = True
            self.n_resumed += int(j.size)
        return idx[~mine]
