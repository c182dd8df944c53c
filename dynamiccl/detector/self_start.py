"""Self-starting baselines: a stream is monitored after a short warm-up and its baseline keeps
learning, with no threshold inflation for the estimation error.

Rule (Hawkins' self-starting CUSUM): a value is standardised against the running mean and
scale of the ``n`` in-control values before it, and its Student-t probability (``n - 1``
degrees of freedom, prediction variance ``scale^2 (1 + 1/n)``) is mapped to the normal
quantile. For Gaussian data these standardised values are exactly N(0, 1) whatever ``n``, so
the known-baseline threshold holds the stated false-alarm rate from the first monitored window
on: a 5-sample baseline only makes the chart less sensitive (a t with few degrees of freedom
has heavy tails), never more trigger-happy. For serially correlated per-window noise
(``long_run_variance`` v) the effective sample count is ``n / v``: prediction variance
``scale^2 (1 + v/n)``, ``(n - 1) / v`` degrees of freedom.

After an alarm the stream re-learns its level from a short warm-up while its scale, in log
units the same multiplicative noise, is pooled with the scale it had (unless the new regime is
over twice as noisy): ``n`` counts the samples behind the mean, ``n_var`` those behind the
scale, and the prediction variance is ``scale^2 (1 + v/n)`` with ``(n_var - 1) / v`` degrees of
freedom. A second step 10 s after the first is then judged against a well-known scale.

Learning: an in-control value (|u| < 3, the stream's charts quiet) joins the running mean and
variance with weight ``1 / n`` (an expanding window up to ``memory`` values, then exponential
forgetting with that horizon); the variance of a normal truncated at 3 sigma is 0.9733 of the
full one. A value outside (a spike, an excursion that may be a change) is not learned.
"""
from __future__ import annotations

import numpy as np
from scipy.special import ndtri, stdtr

__all__ = ["SelfStart", "TRUNC_VAR"]

TRUNC_VAR = 0.9733   # variance of N(0,1) truncated at +-3
_IN_CONTROL = 3.0


class SelfStart:
    """Per-stream running baseline (count, mean, unfloored variance) of log-latency."""

    def __init__(self, capacity: int, *, memory: int, long_run_variance: float):
        self.memory = int(memory)
        self.v = float(long_run_variance)
        self.n = np.zeros(capacity, np.int64)        # samples behind the mean; 0: warming up
        self.n_var = np.zeros(capacity, np.int64)    # samples behind the scale
        self.mean = np.zeros(capacity, np.float64)
        self.var = np.zeros(capacity, np.float64)

    def grow(self, extra: int) -> None:
        self.n = np.concatenate([self.n, np.zeros(extra, np.int64)])
        self.n_var = np.concatenate([self.n_var, np.zeros(extra, np.int64)])
        self.mean = np.concatenate([self.mean, np.zeros(extra)])
        self.var = np.concatenate([self.var, np.zeros(extra)])

    def start(self, idx, mean, scale, n, n_var=None) -> None:
        """Streams ``idx`` are monitored from a baseline of ``n`` samples (``n_var`` behind its
        scale, default ``n``)."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        n = np.minimum(np.broadcast_to(np.asarray(n, np.int64), idx.shape), self.memory)
        self.n[idx] = n
        self.n_var[idx] = n if n_var is None else np.minimum(
            np.broadcast_to(np.asarray(n_var, np.int64), idx.shape), self.memory)
        self.mean[idx] = mean
        self.var[idx] = np.asarray(scale, np.float64) ** 2

    def pooled_scale(self, old_scale, old_n, new_scale, new_n) -> tuple[np.ndarray, np.ndarray]:
        """(scale, samples) of a re-learnt level: the old scale pooled with the new warm-up's,
        or the new one alone where it is over twice the old (a noisier regime)."""
        old_n = np.asarray(old_n, np.float64)
        pooled = np.sqrt((old_n * np.square(old_scale) + new_n * np.square(new_scale)) / (old_n + new_n))
        keep_old = (old_n > 0) & np.isfinite(old_scale) & (new_scale <= 2.0 * old_scale)
        return (np.where(keep_old, pooled, new_scale),
                np.where(keep_old, np.minimum(old_n + new_n, self.memory), new_n).astype(np.int64))

    def standardise(self, idx: np.ndarray, z: np.ndarray) -> np.ndarray:
        """u (N(0,1) in control) from z = (x - mean) / scale of streams ``idx``."""
        n = np.maximum(self.n[idx], 2).astype(np.float64)
        dof = np.maximum((np.maximum(self.n_var[idx], 2) - 1.0) / self.v, 1.0)
        t = z / np.sqrt(1.0 + self.v / n)
        # the lower tail on both sides: exact far out (no 1 - p cancellation)
        p = stdtr(dof, -np.abs(t))
        return -np.sign(t) * ndtri(p)

    def learn(self, idx: np.ndarray, x: np.ndarray, u: np.ndarray, quiet: np.ndarray) -> np.ndarray:
        """Add the in-control values of streams ``idx``; returns which ones were learned."""
        ok = quiet & (np.abs(u) < _IN_CONTROL) & (self.n[idx] > 0)
        j, xv = idx[ok], x[ok]
        if j.size:
            n = np.minimum(self.n[j] + 1, self.memory)
            w = 1.0 / n
            d = xv - self.mean[j]
            self.mean[j] += w * d
            self.var[j] = (1.0 - w) * (self.var[j] + w * d * d / TRUNC_VAR)
            self.n[j] = n
            self.n_var[j] = np.minimum(self.n_var[j] + 1, self.memory)
        return ok
