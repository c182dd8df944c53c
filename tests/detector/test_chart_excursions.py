"""Each warm-up CUSUM chart keeps its own excursion's reference (`dynamiccl.detector.chart_excursions`).

A stream's first 11 warm-up samples, then 14 samples 2 sigma higher (a slow drift: the
small-shift chart, k = 1, stays above 0 the whole time; the large-shift chart, k = 3, never
leaves 0), then a 5x slowdown. With one shared excursion the large-shift chart was judged
against the first 11 samples, threshold 13 sigma at 2 windows per sample: the slowdown waited
4 samples at the heavy-tail cap (7 sigma - k); with its own excursion it is judged on all 25
samples (threshold ~2.5) and alarms on the slowdown's first sample."""
from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.detector.early_cusum import SparseWarmupCusum

SIGMA = 0.05
FLOOR = 0.004


def _run(per_chart: bool):
    rng = np.random.default_rng(3)
    first = rng.normal(0.0, SIGMA, 11)
    drift = rng.normal(2.0 * SIGMA, SIGMA / 4, 14)
    c = SparseWarmupCusum(2, deltas=(2.0, 6.0), min_samples=10, per_chart=per_chart)
    row = np.full((1, 60), np.nan)
    row[0, :11] = first
    n = 11
    fired_at = []
    samples = list(drift) + [np.log(5.0)] * 4
    for k, x in enumerate(samples):
        f, d, start, keep = c.step(k, np.array([0]), np.array([x]), row, np.array([n]), FLOOR, 1e5,
                                   now_s=2.0 * k, window_s=1.0)
        if f[0]:
            fired_at.append((k - len(drift), int(d[0]), int(keep[0])))
            break
        row[0, n] = x          # in-control samples join the warm-up (the bank does this)
        n += 1
    return c, fired_at


def test_large_shift_chart_judged_on_its_own_reference():
    c, fired = _run(per_chart=True)
    assert fired and fired[0][0] == 0 and fired[0][1] == 1, fired   # the slowdown's first sample
    assert fired[0][2] == 25          # its reference: every warm-up sample before it
    assert c.charts.n_wider >= 1


def test_shared_excursion_waits_for_the_cap():
    """The rule off (the code before it): the shared excursion holds the 11-sample reference."""
    _, fired = _run(per_chart=False)
    assert fired and fired[0][0] >= 3, fired


@pytest.mark.parametrize("seed", range(5))
def test_stationary_warmup_no_alarm(seed):
    """In-control samples (no drift) through a whole warm-up: no chart alarms."""
    rng = np.random.default_rng(seed)
    c = SparseWarmupCusum(2, deltas=(2.0, 6.0), min_samples=10, per_chart=True)
    row = np.full((1, 60), np.nan)
    row[0, :10] = rng.normal(0, SIGMA, 10)
    for n in range(10, 59):
        x = rng.normal(0, SIGMA)
        f, *_ = c.step(n, np.array([0]), np.array([x]), row, np.array([n]), FLOOR, 1e5, now_s=2.0 * n, window_s=1.0)
        assert not f[0], n
        row[0, n] = x


def test_switch_reaches_the_warmup_cusums():
    import dataclasses

    from dynamiccl.detector.config import DetectorConfig
    from dynamiccl.detector.streams import StreamTable
    cfg = DetectorConfig()
    assert StreamTable(cfg).early.sparse.per_chart is False          # off by default (dev half, Session 21)
    on = dataclasses.replace(cfg, baseline=dataclasses.replace(cfg.baseline, chart_excursions=True))
    assert StreamTable(on).early.sparse.per_chart is True
