"""`CUSUM`'s trend veto (``trend_veto``, default True): during a warm-up, an excursion that
only continues the warm-up's own trend raises no alarm.

A warm-up's provisional chart measures each value against the warm-up's level. On a series
that trends (a seasonal rise, a growing count, a latency creeping up with a queue) the trend
itself carries the values away from that level, so the chart fires after about h x scale /
slope samples whatever happens in the series, and dates the "change" where the trend crossed
the level (TCPD's monthly passenger counts; NAB's daily Twitter volumes, 236 of the 293
development false alarms in Session 16 were on such daily-seasonal files). The series does
what its warm-up already did: there is no change to report.

Rule, at an alarm raised while the warm-up is still open: fit the least-squares line to the
warm-up samples before the alarming excursion (`dynamiccl.detector._cusum_settle.trend_fit`);
if that line trends significantly (|t| > ``max_trend_t``, the trend gate's critical value) in
the alarm's direction, and the excursion's mean residual from the extrapolated line, in the
line's residual scales (capped at ``z_cap``) and in the alarm's direction, is under the
reference value k = delta / 2 (the CUSUM's own boundary between "no shift" and "the shift it
targets"), the alarm is vetoed: that side's statistic restarts from 0. A step on top of a trend
departs from the line by its own size and is reported as before. Closed (settled) charts are
never vetoed: their warm-up did not trend. The veto runs only when an alarm would be raised,
never per sample.
"""

from __future__ import annotations

import numpy as np

from ._baseline import robust_baseline
from ._cusum_settle import trend_fit


def explained_by_trend(det, up: bool) -> bool:
    """Whether ``det``'s alarming excursion (the last run of its open warm-up's samples, in
    direction ``up``) continues the trend of the warm-up samples before it (module rule)."""
    buffer = det._buffer
    t_max = det.max_trend_t
    run = det._run_up if up else det._run_down
    n = len(buffer) - run
    if t_max is None or run < 1 or n < (det.min_warmup or det.warmup):
        return False
    arr = np.asarray(buffer, dtype=np.float64)
    pre = arr[:n]
    t, slope = trend_fit(pre, estimator=det.estimator, min_rel_scale=det.min_rel_scale,
                         cap=det._cap)
    if not (abs(t) > t_max and np.isfinite(slope) and (slope > 0.0) == up):
        return False
    med, mad_scale = robust_baseline(pre - slope * np.arange(n), det.estimator)
    level = float(med)
    scale = max(float(mad_scale), det.min_rel_scale * abs(level))
    if not scale > 0.0:
        return False
    resid = (arr[n:] - slope * np.arange(n, arr.size) - level) / scale
    mean = float(np.clip(resid, -det._cap, det._cap).mean())
    return (mean if up else -mean) < det._k


def veto_trend(det, fired_up: bool, fired_down: bool) -> tuple[bool, bool]:
    """``det``'s (fired_up, fired_down) after the trend veto; a vetoed side's statistic
    restarts from 0."""
    if fired_up and explained_by_trend(det, True):
        fired_up, det._s_up, det._run_up = False, 0.0, 0
    if fired_down and explained_by_trend(det, False):
        fired_down, det._s_down, det._run_down = False, 0.0, 0
    return fired_up, fired_down


def validate_trend_veto(trend_veto) -> bool:
    """Check the trend veto's switch."""
    if not isinstance(trend_veto, bool):
        raise ValueError(f"trend_veto must be True or False, got {trend_veto!r}")
    return trend_veto
