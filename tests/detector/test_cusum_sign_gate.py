"""`CUSUM`'s sign gate: in a positive series a value <= 0 is a failed measurement
(`dynamiccl.detector._cusum_sign`)."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.detector import CUSUM


def _alarms(xs, **kw):
    det, out = CUSUM(**kw), []
    for x in xs:
        det.update(float(x))
        if det.drift_detected:
            out.append(det.n_seen - 1)
    return out, det


def _pings_with_failures(seed=0, n=5000, every=500, run=6, sentinel=-3.0):
    """A 100 ms RTT trace (sd 1 ms) with a run of failed pings recorded as ``sentinel``."""
    xs = 100.0 + np.random.default_rng(seed).standard_normal(n)
    for start in range(every, n, every):
        xs[start:start + run] = sentinel
    return xs


@pytest.mark.parametrize("sentinel", [-3.0, -1.0, 0.0])
def test_runs_of_failed_measurements_raise_no_alarm(sentinel):
    """9 runs of 6 failed pings: no alarm, every failed ping counted invalid. Without the gate
    each run is winsorised and alarms (9 alarms, seed 0)."""
    xs = _pings_with_failures(sentinel=sentinel)
    alarms, det = _alarms(xs)
    assert alarms == []
    assert det.n_invalid == 9 * 6
    ungated, _ = _alarms(xs, sign_gate=False)
    assert len(ungated) >= 5


def test_failed_measurements_right_after_an_alarm_are_still_invalid():
    """The gate outlives the post-alarm warm-up: a step, then failed pings at once."""
    xs = 100.0 + np.random.default_rng(1).standard_normal(3000)
    xs[1000:] += 10.0
    xs[1003:1009] = -3.0
    alarms, det = _alarms(xs)
    assert len(alarms) == 1 and 1000 <= alarms[0] <= 1010
    assert det.n_invalid == 6


def test_signed_series_keeps_its_negative_values():
    """A residual series around 0 accepts negatives; its -5 sigma step is reported."""
    xs = np.random.default_rng(2).standard_normal(2000)
    xs[1000:] -= 5.0
    alarms, det = _alarms(xs)
    assert det.n_invalid == 0
    assert any(1000 <= a <= 1010 for a in alarms)


def test_positive_series_near_zero_is_not_gated():
    """Level 2 sigma: zero is within the extreme limit, so its values <= 0 are ordinary noise
    (the gate would truncate the lower tail and bias the chart upwards)."""
    xs = 2.0 + np.random.default_rng(3).standard_normal(5000)
    alarms, det = _alarms(xs)
    assert det.n_invalid == 0
    assert alarms == _alarms(xs, sign_gate=False)[0]


def test_a_series_that_reached_zero_before_the_gate_keeps_zeros():
    """Counts that start at 0 (a quiet warm-up) are not a positive series."""
    xs = np.concatenate([np.zeros(5), 100.0 + np.random.default_rng(4).standard_normal(2000)])
    xs[1000:1006] = 0.0
    _, det = _alarms(xs)
    assert det.n_invalid == 0


@pytest.mark.parametrize("bad", [1, None, "yes"])
def test_sign_gate_validated(bad):
    with pytest.raises(ValueError, match="sign_gate"):
        CUSUM(sign_gate=bad)
