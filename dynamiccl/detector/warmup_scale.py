"""A warm-up's scale from its differences at lags 1..L (`baseline.diff_scale`).

Rule: the scale is the smaller of the bank's marginal scale and the largest, over lags
``l = 1..DIFF_LAGS``, of ``1.4826 * median|x_t - x_(t-l)| / sqrt(2)``. Why:

- for independent noise every lag gives sigma (the differences' variance is 2 sigma^2);
- a level shift inside the warm-up (two regimes) contaminates only ``l`` of the ``n - l``
  lag-l differences, and a one-window spike two of them, so the median ignores both, while
  the marginal scale (median / winsorised sd of the levels) is widened by the shift and by
  a cluster of spikes;
- serial correlation makes short-lag differences under-estimate the marginal sigma (AR(1)
  rho: ``sqrt(1 - rho^l)``; rho = 0.6 at lag 1 gives 0.63 sigma); the largest lag-l estimate
  is within ``sqrt(1 - rho^L)`` of it (0.96 at L = 5), so the threshold's false-alarm rate
  holds on positively correlated streams;
- the smaller of the two scales never widens a stream's scale (no sensitivity lost).

A pure function: no state, no counter (the caller counts the streams whose scale it narrowed).
"""
from __future__ import annotations

import numpy as np

from ._baseline import MAD_TO_SIGMA

__all__ = ["DIFF_LAGS", "diff_scale", "narrowed_scale"]

DIFF_LAGS = 5            # lags whose difference scales are compared (AR(1) 0.6: 0.6^5 = 0.08 left)
_MIN_DIFFS = 8           # a lag needs this many differences for a median


def diff_scale(values: np.ndarray, lags: int = DIFF_LAGS) -> np.ndarray:
    """Largest lag-l difference scale (l = 1..``lags``) along the last axis of ``values``;
    NaN where the warm-up is too short for lag 1."""
    values = np.asarray(values, np.float64)
    n = values.shape[-1]
    out = np.full(values.shape[:-1], np.nan)
    for lag in range(1, lags + 1):
        if n - lag < _MIN_DIFFS:
            break
        d = np.abs(values[..., lag:] - values[..., :-lag])
        s = MAD_TO_SIGMA * np.median(d, axis=-1) / np.sqrt(2.0)
        out = np.where(np.isnan(out), s, np.maximum(out, s))
    return out


def narrowed_scale(values: np.ndarray, scale: np.ndarray, lags: int = DIFF_LAGS) -> np.ndarray:
    """``min(scale, diff_scale(values))`` per row; ``scale`` where the difference scale is not
    finite or not positive (quantised warm-ups whose differences are mostly 0)."""
    d = diff_scale(values, lags)
    ok = np.isfinite(d) & (d > 0.0)
    return np.where(ok, np.minimum(scale, np.where(ok, d, np.inf)), scale)
