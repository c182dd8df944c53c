"""`CUSUM`'s change-start split (``start_split``, default 1.36: the
conventional 5 % level, chosen as the convention, not by a score; None: off): the start of an alarming
excursion moved to where its own mean steps, when that step is significant.

Page's ``change_start`` (one after the last zero of the alarming statistic) is the
maximum-likelihood change time for the targeted shift. When the values just before a larger
jump sit near the reference k (a seasonal upswing, a slow approach), the statistic leaves zero
early and the start is dated too soon (TCPD's `jfk_passengers`: 9 samples before the label).

Rule, at an alarm: over the excursion's capped standardised values (at most the last ``warmup``
of them, a bounded ring), find the split that maximises the CUSUM of deviations from the
excursion's mean, in the alarm's direction (the later part higher); its statistic
max |sum (z - mean)| / sqrt(n v) is, with no step inside the excursion, the supremum of a
Brownian bridge (Kolmogorov's distribution; one-sided here, so at most its two-sided level). v is
the long-run variance of the capped z that the chart's threshold uses (`_cusum_warmup`: the
warm-up's AR(1) long-run variance times its capped-value variance excess, 1 without ``serial``):
a partial sum of correlated values wanders sqrt(v) times further than the baseline's sd says, and
with the baseline's variance an AR(1) 0.9 series moved 29 % of clean steps' starts at the 5 %
value. If the statistic exceeds ``start_split`` (1.22 = 10 %, 1.36 = 5 %, 1.63 = 1 %) the start
moves to the split. Only the location changes: the alarm, its time and the false-alarm rate are
untouched.
"""

from __future__ import annotations

import math


def split_start(zs, idxs, up: bool, crit: float, long_run_var: float = 1.0) -> int | None:
    """Input index where the excursion (capped z values ``zs`` at input indices ``idxs``) steps
    in direction ``up``, if its bridge statistic, in units of the long-run standard deviation
    ``sqrt(long_run_var)``, exceeds ``crit``; else None (module rule)."""
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
    if at < 0 or -best / math.sqrt(n * long_run_var) <= crit:
        return None
    return idxs[at + 1]


def locate(det, run: int) -> None:
    """Move ``det``'s ``change_start`` by the split of its alarming run of ``run`` steps."""
    steps = list(det._steps)[-run:]
    moved = split_start([z for z, _ in steps], [j for _, j in steps], det._direction == "up",
                        det.start_split, det._long_run_var)
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
