"""`CUSUM(seasonal_memory=2048)`: an alarm that repeats the same phase of a clear cycle one
period earlier is not raised (`dynamiccl.detector._cusum_season`;
docs/evaluation/2026-11-28-nab24.md)."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.detector import CUSUM
from dynamiccl.detector._cusum_season import period


def _alarms(xs, **kw):
    kw.setdefault("seasonal_memory", 2048)   # the rule on (opt-in: off by default)
    det, out = CUSUM(**kw), []
    for i, x in enumerate(xs):
        det.update(float(x))
        if det.drift_detected:
            out.append((i, det.change_start, det.direction))
    return out


def _cycle(seed, n=4000, step_at=None, step=6.0):
    """A 10 ms latency with a 3 sigma cycle of period 100 samples (sigma 0.2 ms); optionally a
    +``step`` sigma level shift from ``step_at`` on."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    level = 3.0 * np.sin(2 * np.pi * t / 100)
    if step_at is not None:
        level[step_at:] += step
    return 10e-3 + 2e-4 * (level + rng.standard_normal(n))


def test_period_of_a_clear_cycle_and_none_otherwise():
    rng = np.random.default_rng(0)
    assert abs(period(_cycle(0, 2048), 20) - 100) <= 2
    assert period(rng.standard_normal(2048), 20) is None
    assert period(np.r_[np.zeros(1024), np.ones(1024)] + 0.1 * rng.standard_normal(2048), 20) is None
    assert period(np.linspace(0, 10, 2048) + rng.standard_normal(2048), 20) is None


@pytest.mark.parametrize("seed", range(3))
def test_a_cycle_is_not_reported_over_and_over(seed):
    """Without the veto the chart reports the cycle's rises and falls (until a warm-up on the
    cycle freezes a wide threshold); with it, once the memory holds three periods, none."""
    xs = _cycle(seed)
    off = [a for a in _alarms(xs, seasonal_memory=None) if a[0] >= 300]
    on = [a for a in _alarms(xs) if a[0] >= 300]
    assert len(off) >= 3
    assert on == []


@pytest.mark.parametrize("seed", range(3))
def test_a_step_on_the_cycle_is_reported(seed):
    """A +6 sigma step on the cycle departs from the previous period: reported at its start, no
    later than without the veto (21-25 samples: the cycle's 3 sigma swing slows both)."""
    xs = _cycle(seed, step_at=3000)
    on = [a for a in _alarms(xs) if a[0] >= 3000]
    off = [a for a in _alarms(xs, seasonal_memory=None) if a[0] >= 3000]
    assert on and on[0][2] == "up" and on[0][1] == 3000 and on[0][0] < 3030
    if off and off[0][1] == 3000:
        assert on[0][0] <= off[0][0] + 5


@pytest.mark.parametrize("seed", range(3))
def test_no_cycle_no_change(seed):
    """Stationary noise with steps both ways: the same alarms with and without the veto."""
    rng = np.random.default_rng(seed)
    level = np.r_[np.zeros(2500), 3.0 * np.ones(800), -3.0 * np.ones(700)]
    xs = 1e-3 * (5.0 + 0.1 * (level + rng.standard_normal(level.size)))
    assert _alarms(xs) == _alarms(xs, seasonal_memory=None)


@pytest.mark.parametrize("bad", [0, 7, -1, 2.5, True, "2048"])
def test_seasonal_memory_validated(bad):
    with pytest.raises(ValueError, match="seasonal_memory"):
        CUSUM(seasonal_memory=bad)
