"""A warm-up that itself contains a level change (a second change right after the one that
alarmed). Without the one-regime rule (``min_effective_warmup=None``) it freezes a threshold
hundreds of sigma high and the chart reports nothing for the rest of the stream; at the defaults
the warm-up drops its earlier regime, every step is reported, and the false-alarm promises hold
(docs/evaluation/2026-11-27-cusum-public.md, Session 13)."""

from __future__ import annotations

import numpy as np
import pytest

from cusum_noise import ar1 as _ar1

from dynamiccl.detector import CUSUM
from dynamiccl.detector._cusum_settle import best_split, earlier_regime, effective_samples

KW = dict(estimator="winsorized", min_rel_scale=0.0, cap=3.0)


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


def test_without_the_rule_the_threshold_freezes_and_later_steps_are_missed():
    starts, det = _alarm_starts(_stream(), min_effective_warmup=None)
    assert starts == [300]
    assert det.threshold > 100.0


def test_steps_after_a_contaminated_warmup_reported():
    starts, det = _alarm_starts(_stream())
    for change in (300, 330, 1000, 1200):
        assert any(abs(s - change) <= 5 for s in starts), (change, starts)
    assert len(starts) == 4
    assert det.threshold < 10.0


def test_effective_samples_tell_one_regime_from_two():
    rng = np.random.default_rng(0)
    clean = 100.0 + rng.standard_normal(100)
    stepped = 100.0 + np.r_[np.zeros(30), 10.0 * np.ones(70)] + rng.standard_normal(100)
    assert effective_samples(clean, **KW) > 60.0
    assert effective_samples(stepped, **KW) < 20.0
    assert best_split(stepped, 20) == 30
    assert earlier_regime(list(stepped), 20, **KW) == 30
    assert earlier_regime(list(clean), 20, **KW) == 0


def test_a_trend_is_not_split():
    """A trend is unsettled on both sides of any split: the warm-up keeps all its samples."""
    rng = np.random.default_rng(2)
    trend = 100.0 + 0.2 * np.arange(100) + rng.standard_normal(100)
    assert effective_samples(trend, **KW) < 20.0
    assert earlier_regime(list(trend), 20, **KW) == 0


NOISES = {"iid": lambda rng, n: rng.standard_normal(n),
          "student_t2": lambda rng, n: rng.standard_t(2, n),
          "ar1_0.6": lambda rng, n: _ar1(rng, n, 0.6),
          "ar1_0.9": lambda rng, n: _ar1(rng, n, 0.9)}


@pytest.mark.parametrize("noise", sorted(NOISES))
def test_false_alarms_near_arl0_with_and_without_the_rule(noise):
    """20 x 5000 stationary samples at arl0 1e4 (about 10 expected); measured with / without
    the rule: iid 5 / 5, t2 13 / 13, AR(1) 0.6 7 / 5, AR(1) 0.9 23 / 25."""
    rng = np.random.default_rng(1)
    streams = [5e-3 + 2e-4 * NOISES[noise](rng, 5000) for _ in range(20)]
    on = sum(len(_alarm_starts(xs)[0]) for xs in streams)
    off = sum(len(_alarm_starts(xs, min_effective_warmup=None)[0]) for xs in streams)
    assert on <= 25
    assert on <= off + 5


@pytest.mark.parametrize("bad", [1, 0, 2.5, True, "20"])
def test_min_effective_warmup_validated(bad):
    with pytest.raises(ValueError, match="min_effective_warmup"):
        CUSUM(min_effective_warmup=bad)
