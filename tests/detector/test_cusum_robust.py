"""CUSUM at its defaults on the series its doc promises to handle: serially correlated noise,
heavy tails with absurd one-point spikes, level shifts both ways, any scale."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.detector import CUSUM
from dynamiccl.detector._serial import ar1_long_run_variance


def _alarms(det, xs):
    out = []
    for i, x in enumerate(xs):
        det.update(float(x))
        if det.drift_detected:
            out.append((i, det.direction))
    return out


def _ar1(rng, n, rho, mean=5e-3, sd=2e-4):
    e = rng.standard_normal(n) * np.sqrt(1 - rho**2)
    z = np.empty(n)
    z[0] = rng.standard_normal()
    for t in range(1, n):
        z[t] = rho * z[t - 1] + e[t]
    return mean + sd * z


def test_serially_correlated_noise_keeps_the_false_alarm_rate():
    """AR(1) rho = 0.6 noise, 20 streams x 5000 samples: at ARL0 1e4 about 10 false alarms
    are expected; without the serial correction there are hundreds."""
    rng = np.random.default_rng(3)
    streams = [_ar1(rng, 5000, 0.6) for _ in range(20)]
    fixed = sum(len(_alarms(CUSUM(), s)) for s in streams)
    plain = sum(len(_alarms(CUSUM(serial=False), s)) for s in streams)
    assert fixed <= 25
    assert plain > 4 * max(fixed, 10)


def test_long_run_variance_estimate():
    rng = np.random.default_rng(0)
    iid = rng.standard_normal(100)
    assert ar1_long_run_variance(iid, 0.0, 1.0) == 1.0
    v = ar1_long_run_variance(_ar1(rng, 2000, 0.5, 0.0, 1.0), 0.0, 1.0)
    assert v == pytest.approx(3.0, rel=0.2)
    spike = iid.copy()
    spike[50] = 1e12  # winsorised: one absurd value cannot fake correlation
    assert ar1_long_run_variance(spike, 0.0, 1.0) == 1.0


@pytest.mark.parametrize("scale", [1e-9, 1.0, 1e9])
def test_heavy_tails_spikes_and_shifts_both_ways_at_any_scale(scale):
    """Lognormal (heavy right tail) latencies with failed measurements recorded as 1e6 x the
    level every 97 samples: no alarm in 3000 in-control samples; a +50 % step and the release
    back are each reported within 20 samples."""
    rng = np.random.default_rng(11)
    level = scale * np.r_[np.ones(3000), 1.5 * np.ones(300), np.ones(300)]
    xs = level * rng.lognormal(0.0, 0.1, level.size)
    xs[100::97] = 1e6 * scale
    alarms = _alarms(CUSUM(), xs)
    assert [d for i, d in alarms] == ["up", "down"]
    assert 3000 <= alarms[0][0] < 3020
    assert 3300 <= alarms[1][0] < 3320
