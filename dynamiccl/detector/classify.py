"""Kind of a latency regime change: bandwidth (shift grows with message size) or latency
(constant additive shift, so the *ratio* is largest for small messages).

A bandwidth loss multiplies the bandwidth-bound part of a collective's time, which dominates
large messages: the new/old latency ratio grows with the message size (small messages barely
change). Added latency adds a per-step constant: the ratio is largest for small messages and
shrinks with size. So the sign of the slope of log(ratio) against log(bytes), fitted by
weighted least squares over the streams of the affected communicators (and the other
multi-node streams of the job), separates the two. With a single size (or a slope that is not
significant) the fallback is by size: messages of at least ``large_bytes`` → bandwidth,
smaller → latency.

>>> import numpy as np
>>> b = np.array([2.0**16, 2.0**20, 2.0**24])
>>> classify_size_response(b, np.log([1.12, 1.5, 1.9]), np.full(3, 0.01))[0]
'bandwidth'
>>> classify_size_response(b, np.log([2.8, 2.1, 1.2]), np.full(3, 0.01))[0]
'latency'
>>> classify_size_response(b[2:], np.log([1.5]), np.full(1, 0.01))[0]
'bandwidth'
>>> classify_size_response(np.r_[b, b], np.log([1.1, 1.4, 1.9, 1.12, 1.5, 1.8]), np.full(6, 0.01),
...                        group=[0, 0, 0, 1, 1, 1])[0]
'bandwidth'
"""
from __future__ import annotations

import numpy as np

__all__ = ["classify_size_response", "LARGE_BYTES", "SLOPE_Z_MIN"]

LARGE_BYTES = 1 << 20
SLOPE_Z_MIN = 2.0   # a size-response slope this many standard errors from 0 decides the kind


def classify_size_response(bytes_per_record: np.ndarray, log_ratio: np.ndarray, sigma: np.ndarray,
                           group=None, *, large_bytes: float = LARGE_BYTES, z_min: float = SLOPE_Z_MIN,
                           ) -> tuple[str, dict]:
    """``('bandwidth' | 'latency', evidence)`` from per-stream sizes, log ratios and their noise.

    ``sigma`` is each log ratio's standard error; streams with a NaN anywhere are ignored.
    ``group`` (e.g. the communicator of each stream): when some group has two sizes or more the
    slope is fitted within groups (sizes compared on the same ranks and links); otherwise
    across all streams. Without a significant slope, the size of the most affected stream
    decides (large → bandwidth).
    """
    b = np.asarray(bytes_per_record, np.float64)
    y = np.asarray(log_ratio, np.float64)
    s = np.asarray(sigma, np.float64)
    g = np.zeros(len(b), np.int64) if group is None else np.unique(np.asarray(group), return_inverse=True)[1]
    ok = np.isfinite(b) & np.isfinite(y) & np.isfinite(s) & (b > 0) & (s > 0)
    b, y, s, g = b[ok], y[ok], s[ok], g[ok]
    x = np.log2(b) if b.size else b
    ev: dict = {"n_sizes": int(np.unique(np.round(x)).size) if b.size else 0}
    b0, y0, s0 = b, y, s
    sign = np.sign(np.median(y)) if y.size else 1.0
    top = int(np.argmax(y0 * sign / s0)) if b0.size else -1
    if b0.size:     # recorded even when the slope decides: a combiner pooling partitions' fits falls back on it
        ev["fallback_bytes"] = float(b0[top])
    if ev["n_sizes"] >= 2:
        w = 1.0 / s ** 2
        # within-group centring (fixed effects) when groups have several sizes
        # distinct sizes per group, vectorised (jobs can have thousands of communicators)
        pairs = np.unique(np.stack([g, np.round(x).astype(np.int64)]), axis=1)
        sizes_per_group = np.bincount(pairs[0], minlength=int(g.max()) + 1)
        if group is not None and (sizes_per_group >= 2).any():
            multi = sizes_per_group[g] >= 2
            x, y, w, g = x[multi], y[multi], w[multi], g[multi]
            sw = np.bincount(g, w)
            with np.errstate(invalid="ignore", divide="ignore"):
                xc = x - (np.bincount(g, w * x) / sw)[g]
                yc = y - (np.bincount(g, w * y) / sw)[g]
            n_par = int((sw > 0).sum()) + 1
            ev["within"] = True
        else:
            xc = x - np.sum(w * x) / np.sum(w)
            yc = y - np.sum(w * y) / np.sum(w)
            n_par = 2
        sxx = np.sum(w * xc ** 2)
        if sxx > 0:
            slope = np.sum(w * xc * yc) / sxx
            resid = yc - slope * xc
            dof = max(len(yc) - n_par, 1)
            # standard error with the residual scatter (at least the stated noise)
            s2 = max(float(np.sum(w * resid ** 2) / dof), 1.0)
            se = float(np.sqrt(s2 / sxx))
            ev.update(slope_per_doubling=float(slope), slope_se=float(se))
            z = slope * sign / se if se > 0 else 0.0
            if abs(z) >= z_min:
                return ("bandwidth" if z > 0 else "latency"), ev
    if not b0.size:
        return "bandwidth", ev
    return ("bandwidth" if not b0[top] < large_bytes else "latency"), ev
