"""`CUSUM(outlier_gap=2)`: an extreme value is isolated (dropped) only if no extreme value in
the same direction follows within ``outlier_gap`` valid samples
(`dynamiccl.detector._cusum_outlier`; docs/evaluation/2026-11-28-nab24.md)."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.detector import CUSUM


def _alarms(xs, **kw):
    kw.setdefault("outlier_gap", 2)   # the rule on (opt-in: off by default)
    det, out = CUSUM(**kw), []
    for i, x in enumerate(xs):
        det.update(float(x))
        if det.drift_detected:
            out.append((i, det.change_start, det.direction))
    return out, det


def _interleaved(seed=0):
    """A 2 ms latency (sigma 0.1 ms); from sample 500 every other value is 50 ms (a failing
    host answering every other request)."""
    rng = np.random.default_rng(seed)
    xs = 2e-3 + 1e-4 * rng.standard_normal(800)
    xs[500::2] = 5e-2
    return xs


def test_extremes_one_sample_apart_are_a_change():
    alarms, _ = _alarms(_interleaved())
    assert [d for _, _, d in alarms[:1]] == ["up"]
    i, start, _ = alarms[0]
    assert 500 <= i < 510 and abs(start - 500) <= 5


def test_in_a_row_rule_never_sees_them():
    """The earlier rule (``outlier_gap=1``) drops every one of them as isolated."""
    alarms, det = _alarms(_interleaved(), outlier_gap=1)
    assert alarms == []
    assert det.n_outliers >= 140


@pytest.mark.parametrize("gap", [1, 2])
def test_isolated_spikes_still_dropped(gap):
    """Spikes 3 or more valid samples apart stay isolated: no alarm, each one counted."""
    rng = np.random.default_rng(1)
    xs = 2e-3 + 1e-4 * rng.standard_normal(2000)
    xs[300::3] = 1e6
    alarms, det = _alarms(xs, outlier_gap=gap)
    assert alarms == []
    # every spike is counted (with gap 2 the last one, at 1998, is still held at the end)
    assert len(range(300, 2000, 3)) - 1 <= det.n_outliers <= len(range(300, 2000, 3))


def test_opposite_extremes_do_not_pair():
    rng = np.random.default_rng(2)
    xs = 2e-3 + 1e-4 * rng.standard_normal(1500)
    xs[400::4] = 5e-2
    xs[402::4] = 1e-3 - 5e-4  # far below, between the high ones
    alarms, _ = _alarms(xs)
    assert alarms == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_outlier_gap_validated(bad):
    with pytest.raises(ValueError, match="outlier_gap"):
        CUSUM(outlier_gap=bad)
