"""A warm-up holding two regimes restarts from the later one (`dynamiccl.detector.warmup_split`)."""
import math

import numpy as np

from dynamiccl.detector.warmup_split import later_regime

MOVE = math.log(1.1)


def test_a_step_inside_the_warm_up_is_split_at_the_step():
    rng = np.random.default_rng(0)
    row = np.concatenate([np.log(18e-3) + 0.05 * rng.standard_normal(30),
                          np.log(40e-3) + 0.05 * rng.standard_normal(30)])
    assert later_regime(row[None, :], MOVE)[0] == 30


def test_one_regime_is_not_split_at_the_stated_rate():
    # Pettitt's test at p < 1e-3: independent heavy-tailed warm-ups split at most at that rate
    rng = np.random.default_rng(1)
    rows = rng.standard_t(3, size=(2000, 60)) * 0.3
    assert np.count_nonzero(later_regime(rows, MOVE)) <= 6


def test_a_significant_but_small_move_is_not_a_regime():
    rng = np.random.default_rng(2)
    row = np.concatenate([0.001 * rng.standard_normal(30), 0.05 + 0.001 * rng.standard_normal(30)])
    assert later_regime(row[None, :], MOVE)[0] == 0


def test_a_later_regime_shorter_than_twenty_samples_is_not_split():
    rng = np.random.default_rng(3)
    row = np.concatenate([0.05 * rng.standard_normal(50), 1.0 + 0.05 * rng.standard_normal(10)])
    assert later_regime(row[None, :], MOVE)[0] == 0


def _stepped_warmup(split: bool):
    """Cross-node streams 1.3x from window 30 (half the 60-window warm-up, below the early
    chart's 1.5x), then 1.15x more from window 110."""
    from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.detector_testing import EPOCH, run_cross_levels

    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False),
                                  baseline=BaselineConfig(split_warmup=split)))
    out = run_cross_levels(det, lambda t: 1.0 if t < 30 else (1.3 if t < 110 else 1.3 * 1.15), 140)
    return det, [(c.kind, round(c.detected_s - EPOCH, 1)) for c in out]


def test_a_change_after_a_stepped_warm_up_is_found_against_the_later_regime():
    """Before the rule the baseline sat between 1.0 and 1.3x with a scale inflated by the step,
    and the 1.15x change at window 110 was reported 23 windows late (at 133)."""
    det, out = _stepped_warmup(True)
    assert det.table.n_warmup_splits > 0
    assert [c for c in out if c[0] != "recovery" and 110 < c[1] <= 115], out
    assert not [c for c in out if c[1] <= 110], out
