"""A warm-up that itself contains a level change: at the defaults it freezes a threshold hundreds
of sigma high and the chart reports nothing for the rest of the stream (a known limitation, see
docs/evaluation/2026-11-27-cusum-public.md, Session 13); with the opt-in
``min_effective_warmup=20`` such a warm-up slides instead, and the false-alarm promises hold."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.detector import CUSUM
from dynamiccl.detector._cusum_settle import effective_samples


def _stream():
    """+10 sigma at 300 back at 330 (inside the warm-up after the first alarm), +5 sigma for
    200 samples at 1000."""
    rng = np.random.default_rng(3)
    level = np.zeros(2000)
    level[300:330] = 10.0
    level[1000:1200] = 5.0
    return 100.0 + level + rng.standard_normal(level.size)


def _alarm_starts(xs, **kw):
    det, out = CUSUM(**kw), []
    for x in xs:
        det.update(float(x))
        if det.drift_detected:
            out.append(det.change_start)
    return out, det


def test_first_step_reported_then_threshold_frozen_high():
    """What holds today: the first step is found at its start; the contaminated warm-up's
    threshold is far above the clean one (4.72 at the defaults)."""
    starts, det = _alarm_starts(_stream())
    assert starts[0] == 300
    assert det.threshold > 100.0


@pytest.mark.xfail(strict=True, reason="contaminated warm-up: threshold frozen ~650 sigma high")
def test_steps_after_a_contaminated_warmup_reported():
    starts, _ = _alarm_starts(_stream())
    assert any(abs(s - 1000) <= 5 for s in starts) and any(abs(s - 1200) <= 5 for s in starts)


def test_opt_in_slides_the_contaminated_warmup_and_reports_every_step():
    starts, det = _alarm_starts(_stream(), min_effective_warmup=20)
    for change in (300, 330, 1000, 1200):
        assert any(abs(s - change) <= 5 for s in starts), (change, starts)
    assert len(starts) == 4
    assert det.threshold < 10.0


def test_effective_samples_tell_one_regime_from_two():
    rng = np.random.default_rng(0)
    clean = list(100.0 + rng.standard_normal(100))
    stepped = list(100.0 + np.r_[np.zeros(30), 10.0 * np.ones(70)] + rng.standard_normal(100))
    kw = dict(estimator="winsorized", min_rel_scale=0.0, cap=3.0)
    assert effective_samples(clean, **kw) > 60.0
    assert effective_samples(stepped, **kw) < 20.0


def _ar1(rng, n, rho):
    z = np.empty(n)
    z[0] = rng.standard_normal()
    e = rng.standard_normal(n) * np.sqrt(1.0 - rho * rho)
    for t in range(1, n):
        z[t] = rho * z[t - 1] + e[t]
    return z


NOISES = {"iid": lambda rng, n: rng.standard_normal(n),
          "student_t2": lambda rng, n: rng.standard_t(2, n),
          "ar1_0.6": lambda rng, n: _ar1(rng, n, 0.6)}


@pytest.mark.parametrize("noise", sorted(NOISES))
def test_opt_in_keeps_false_alarms_near_arl0(noise):
    """20 x 5000 stationary samples at arl0 1e4 (about 10 expected): 5 / 13 / 5 measured, the
    same as the defaults (a stationary warm-up is never slid)."""
    rng = np.random.default_rng(1)
    n = 0
    for _ in range(20):
        xs = 5e-3 + 2e-4 * NOISES[noise](rng, 5000)
        n += len(_alarm_starts(xs, min_effective_warmup=20)[0])
    assert n <= 25


@pytest.mark.parametrize("bad", [1, 51, 2.5, True, "20"])
def test_min_effective_warmup_validated(bad):
    with pytest.raises(ValueError, match="min_effective_warmup"):
        CUSUM(min_effective_warmup=bad)
