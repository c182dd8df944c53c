"""Opt-in rule of `CUSUM` (``min_effective_warmup``): a full baseline must rest on enough
*effective* samples, else the warm-up slides instead of freezing.

A warm-up of ``n`` samples whose AR(1) long-run variance is ``v`` and whose capped values have
the variance excess ``r`` (`dynamiccl.detector._serial`) carries about ``n / (v r)`` independent
samples' worth of information on its level. When that is below the number the chart needs for
its first baseline (``min_warmup``), the warm-up is not one stationary regime (a level change
inside it, a trend, a random walk): freezing it gives a threshold hundreds of sigma high and a
chart that reports nothing for the rest of the stream (a step at 330 inside the post-alarm
warm-up of a step at 300: h = 647, a later 5-sigma step of 200 samples missed). The warm-up then
drops its oldest half and keeps learning (provisional charts at their own thresholds), and is
checked again when it is full.

Off by default: on the development halves it raised RTT F1 0.505 -> 0.558 and TCPD F1 0.645 ->
0.709 but lowered NAB 28.6 -> 21.5 (false alarms 221 -> 449, mostly seasonal Twitter-volume
series whose frozen charts had been silent): docs/evaluation/2026-11-27-cusum-public.md.
"""

from __future__ import annotations

import numpy as np

from ._baseline import robust_baseline
from ._serial import ar1_long_run_variance, capped_variance_ratio


def effective_samples(buffer: list[float], *, estimator: str, min_rel_scale: float,
                      cap: float) -> float:
    """``n / (v r)`` of a warm-up: its sample count over its long-run and capped-variance
    excess, with the same baseline, floor and estimates as the full warm-up's threshold."""
    values = np.asarray(buffer, dtype=np.float64)
    med, scale = robust_baseline(values, estimator)
    level = float(med)
    scale = max(float(scale), min_rel_scale * abs(level))
    v = ar1_long_run_variance(values, level, scale)
    return values.size / (v * capped_variance_ratio(values, level, scale, cap))


def unsettled(det, buffer: list[float]) -> bool:
    """True when ``det.min_effective_warmup`` is set and the full warm-up falls short of it."""
    floor = det.min_effective_warmup
    return floor is not None and effective_samples(
        buffer, estimator=det.estimator, min_rel_scale=det.min_rel_scale, cap=det._cap) < floor


def validate_min_effective(min_effective_warmup, warmup: int) -> int | None:
    """Check the effective-sample floor (None: off); it must be reachable by a full warm-up."""
    if min_effective_warmup is None:
        return None
    if not (isinstance(min_effective_warmup, int) and not isinstance(min_effective_warmup, bool)
            and 2 <= min_effective_warmup <= warmup // 2):
        raise ValueError(f"min_effective_warmup must be None or an int in [2, warmup // 2], "
                         f"got {min_effective_warmup!r}")
    return min_effective_warmup
