"""`CUSUM`'s rule that a baseline comes from one regime (``min_effective_warmup``, default 20).

A warm-up of ``n`` samples whose AR(1) long-run variance is ``v`` and whose capped values have
the variance excess ``r`` (`dynamiccl.detector._serial`) carries about ``n / (v r)`` independent
samples' worth of information on its level. A warm-up that holds a level change (a second change
right after the one that alarmed: RTT path changes come a median 26 samples apart) reads as
strongly correlated and heavy-tailed, so its threshold is hundreds of sigma high and, since no
alarm ever resets it, the chart stays silent for the rest of the stream (before this rule: 39 %
of the RTT development samples were monitored at h > 20, nominal 4.72).

Rule, at every (re-)learn: when the warm-up has fewer than ``m`` effective samples, split it
once where the mean differs most between the two sides (the standardised cumulative-sum split,
the latest side at least ``m`` samples long); if that latest side alone has at least ``m``
effective samples it is a settled regime, and the earlier samples are dropped (the chart goes
on, provisional, from the latest regime). Otherwise nothing changes: a trend, a random walk or a
seasonal series stays unsettled on both sides of any split and keeps its wide threshold (the
silence that is right there). ``m`` defaults to the samples a first baseline needs
(``min_warmup`` = 20). Stationary streams are left alone: their warm-ups are settled, or their
latest side is as correlated as the whole (false alarms unchanged on iid, Student-t and AR(1)
noise, tests/detector/test_cusum_contaminated_warmup.py).
"""

from __future__ import annotations

import math

import numpy as np

from ._baseline import robust_baseline
from ._serial import ar1_long_run_variance, capped_variance_ratio


def effective_samples(values: np.ndarray, *, estimator: str, min_rel_scale: float,
                      cap: float) -> float:
    """``n / (v r)`` of a warm-up: its sample count over its long-run and capped-variance
    excess, with the same baseline, floor and estimates as the full warm-up's threshold."""
    med, scale = robust_baseline(values, estimator)
    level = float(med)
    scale = max(float(scale), min_rel_scale * abs(level))
    v = ar1_long_run_variance(values, level, scale)
    return values.size / (v * capped_variance_ratio(values, level, scale, cap))


def best_split(values: np.ndarray, min_tail: int) -> int:
    """Index j maximising the standardised mean difference of ``values[:j]`` and
    ``values[j:]`` (|cumulative sum of deviations| / sqrt(j (n - j) / n)), with
    ``n - j >= min_tail``."""
    n = values.size
    j = np.arange(1, n)
    stat = np.abs(np.cumsum(values - values.mean())[:-1]) / np.sqrt(j * (n - j) / n)
    stat[n - j < min_tail] = -1.0
    return int(np.argmax(stat)) + 1


def earlier_regime(buffer: list[float], m: int, *, estimator: str, min_rel_scale: float,
                   cap: float) -> int:
    """How many of the oldest warm-up samples belong to an earlier regime (0: none)."""
    if len(buffer) <= m:
        return 0
    values = np.asarray(buffer, dtype=np.float64)
    kw = dict(estimator=estimator, min_rel_scale=min_rel_scale, cap=cap)
    if effective_samples(values, **kw) >= m:
        return 0
    j = best_split(values, m)
    return j if effective_samples(values[j:], **kw) >= m else 0


def drop_earlier_regime(det, buffer: list[float]) -> None:
    """Drop ``det``'s warm-up samples of an earlier regime (no-op when the rule is off)."""
    m = det.min_effective_warmup
    if m is not None:
        del buffer[:earlier_regime(buffer, m, estimator=det.estimator,
                                   min_rel_scale=det.min_rel_scale, cap=det._cap)]


def trend_fit(values: np.ndarray, *, estimator: str, min_rel_scale: float,
              cap: float) -> tuple[float, float]:
    """(t, slope) of the least-squares slope of a warm-up's standardised values (capped at
    ``+/- cap``): its t statistic, the standard error from the residuals' scale and AR(1)
    long-run variance, and the slope in input units per valid sample."""
    med, scale = robust_baseline(values, estimator)
    level = float(med)
    scale = max(float(scale), min_rel_scale * abs(level))
    z = np.clip((values - level) / scale, -cap, cap)
    n = z.size
    if n < 4:
        return 0.0, 0.0
    t = np.arange(n) - (n - 1) / 2.0
    stt = float(t @ t)
    slope = float(t @ z) / stt
    resid = z - z.mean() - slope * t
    s2 = float(resid @ resid) / (n - 2)
    if s2 <= 0.0:
        return (0.0 if slope == 0.0 else math.copysign(math.inf, slope)), slope * float(scale)
    v = ar1_long_run_variance(resid, 0.0, math.sqrt(s2))
    return slope * math.sqrt(stt / (s2 * v)), slope * float(scale)


def trend_t(values: np.ndarray, *, estimator: str, min_rel_scale: float, cap: float) -> float:
    """t statistic of `trend_fit`'s slope.

    Trend gate: a slow trend under heavy noise (a daily cycle under count noise) barely moves
    the lag-1 autocorrelation, so `effective_samples` reads it as settled; its slope does not
    hide: |t| > ``max_trend_t`` marks the warm-up unsettled (it has no level to learn yet)."""
    return trend_fit(values, estimator=estimator, min_rel_scale=min_rel_scale, cap=cap)[0]


def keeps_growing(det, buffer: list[float]) -> bool:
    """Whether ``det``'s warm-up, at or past its full length, stays open and keeps learning:
    the one-regime rule is on, the warm-up is unsettled (fewer than ``min_effective_warmup``
    effective samples, or a trend with |t| > ``max_trend_t``) and shorter than
    ``warmup_growth`` x ``warmup`` (the memory bound)."""
    m = det.min_effective_warmup
    if m is None or len(buffer) >= det.warmup_growth * det.warmup:
        return False
    values = np.asarray(buffer, dtype=np.float64)
    kw = dict(estimator=det.estimator, min_rel_scale=det.min_rel_scale, cap=det._cap)
    if effective_samples(values, **kw) < m:
        return True
    t_max = det.max_trend_t
    return t_max is not None and abs(trend_t(values, **kw)) > t_max


def validate_trend_t(max_trend_t) -> float | None:
    """Check the trend gate's critical |t| (None: off)."""
    if max_trend_t is not None and not (isinstance(max_trend_t, (int, float))
                                        and not isinstance(max_trend_t, bool)
                                        and 0.0 < max_trend_t < math.inf):
        raise ValueError(f"max_trend_t must be None or a finite number > 0, got {max_trend_t!r}")
    return None if max_trend_t is None else float(max_trend_t)


def validate_growth(warmup_growth) -> int:
    """Check the bound on an unsettled warm-up's growth, in multiples of ``warmup``."""
    if not (isinstance(warmup_growth, int) and not isinstance(warmup_growth, bool)
            and warmup_growth >= 1):
        raise ValueError(f"warmup_growth must be an int >= 1, got {warmup_growth!r}")
    return warmup_growth


def validate_min_effective(min_effective_warmup) -> int | None:
    """Check the effective-sample count of a settled regime (None: the rule is off)."""
    if min_effective_warmup is not None and not (
            isinstance(min_effective_warmup, int) and not isinstance(min_effective_warmup, bool)
            and min_effective_warmup >= 2):
        raise ValueError(f"min_effective_warmup must be None or an int >= 2, "
                         f"got {min_effective_warmup!r}")
    return min_effective_warmup
