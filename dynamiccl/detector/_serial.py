"""Long-run variance of a warm-up, for CUSUM thresholds on serially correlated series.

Real latency and monitoring series are rarely independent from sample to sample: a
lag-1 autocorrelation rho makes the CUSUM's random walk wander sqrt((1 + rho) / (1 - rho))
times further than the per-sample scale says, so a threshold solved for independent data
raises false alarms far above its stated rate. The warm-up's AR(1) long-run variance feeds
`dynamiccl.detector.arl.cusum_threshold_correlated` instead.

"""

from __future__ import annotations

import math

import numpy as np

# Largest lag-1 autocorrelation used: a random walk (rho -> 1) has no finite long-run variance,
# and capping keeps the threshold finite (long-run variance at most 19).
RHO_MAX = 0.9
# An estimate within this many standard errors (1/sqrt(n)) of 0 is treated as 0, so that
# independent data keep the independent threshold (about 97.5 % of warm-ups, one-sided).
RHO_SIGNIFICANCE = 2.0


def ar1_long_run_variance(values: np.ndarray, location: float, scale: float,
                          clip: float = 3.0) -> float:
    """``(1 + rho) / (1 - rho)`` for the lag-1 autocorrelation rho of ``values``, winsorised to
    ``location +/- clip * scale`` (so one spike cannot fake or hide correlation); 1.0 when rho
    is not significantly above 0."""
    n = values.size
    if n < 3:
        return 1.0
    z = np.clip((values - location) / scale, -clip, clip)
    z = z - z.mean()
    denom = float(np.dot(z, z))
    if denom <= 0.0:
        return 1.0
    rho = float(np.dot(z[1:], z[:-1])) / denom
    if rho < RHO_SIGNIFICANCE / math.sqrt(n):
        return 1.0
    rho = min(rho, RHO_MAX)
    return (1.0 + rho) / (1.0 - rho)

def capped_variance_ratio(values: np.ndarray, location: float, scale: float, cap: float) -> float:
    """Second moment of the standardised ``values`` capped at ``+/- cap``, over its Gaussian value
    ``E[min(Z^2, cap^2)]``, floored at 1. The warm-up's own scale makes it about 1 on Gaussian
    data (mean 1.002 over 100-sample warm-ups); heavy tails push it above 1 (Student-t 3 and 2 df:
    means 1.09 and 1.18), and the capped increments of the CUSUM then wander further than the
    Gaussian calibration assumes, by this factor in variance."""
    n = values.size
    if n < 3 or not math.isfinite(cap):
        return 1.0
    z = np.clip((values - location) / scale, -cap, cap)
    return max(1.0, float(np.mean(z * z)) / gauss_capped_second_moment(cap))


def gauss_capped_second_moment(c: float) -> float:
    """E[min(Z^2, c^2)] for a standard normal Z."""
    tail = 0.5 * math.erfc(c / math.sqrt(2.0))
    dens = math.exp(-0.5 * c * c) / math.sqrt(2.0 * math.pi)
    return (1.0 - 2.0 * tail) - 2.0 * c * dens + 2.0 * c * c * tail
