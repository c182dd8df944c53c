"""`CUSUM`'s change-start split (``start_split``, default None: off): the start of an alarming
excursion moved to where its own mean steps, when that step is significant.

Page's ``change_start`` (one after the last zero of the alarming statistic) is the
maximum-likelihood change time for the targeted shift. When the values just before a larger
jump sit near the reference k (a seasonal upswing, a slow approach), the statistic leaves zero
early and the start is dated too soon (TCPD's `jfk_passengers`: 9 samples before the label).

Rule, at an alarm: over the excursion's capped standardised values (at most the last ``warmup``
of them, a bounded ring), find the split that maximises the CUSUM of deviations from the
excursion's mean, in the alarm's direction (the later part higher); its statistic
max |sum (z - mean)| / sqrt(n) is, with no step inside the excursion, the supremum of a Brownian
bridge (Kolmogorov's distribution, unit variance: the baseline's). If it exceeds ``start_split``
(1.22 = 10 %, 1.36 = 5 %) the start moves to the split. Only the location changes: the alarm,
its time and the false-alarm rate are untouched. The test uses the baseline's variance, not
the serial long-run one, so on correlated series it moves starts more often than its nominal
level.
"""

from __future__ import annotations

import math


def split_start(zs, idxs, up: bool, crit: float) -> int | None:
    """Input index where the excursion (capped z values ``zs`` at input indices ``idxs``) steps
    in direction ``up``, if its bridge statistic exceeds ``crit``; else None (module rule)."""
    n = len(zs)
    if n < 3:
        return None
    sign = 1.0 if up else -1.0
    mean = sum(zs) / n
    run = best = 0.0
    at = -1
    for j in range(n - 1):  # a split before element j + 1
        run += sign * (zs[j] - mean)
        if run < best:
            best, at = run, j
    if at < 0 or -best / math.sqrt(n) <= crit:
        return None
    return idxs[at + 1]


def locate(det, run: int) -> None:
    """Move ``det``'s ``change_start`` by the split of its alarming run of ``run`` steps."""
    steps = list(det._steps)[-run:]
    moved = split_start([z for z, _ in steps], [j for _, j in steps], det._direction == "up",
                        det.start_split)
    if moved is not None:
        det._change_start = moved


def validate_start_split(start_split) -> float | None:
    """Check the split's critical value: None (off) or a positive number."""
    if start_split is None:
        return None
    if isinstance(start_split, bool) or not isinstance(start_split, (int, float)) \
            or not start_split > 0.0 or not math.isfinite(start_split):
        raise ValueError(f"start_split must be None or a positive number, got {start_split!r}")
    return float(start_split)
