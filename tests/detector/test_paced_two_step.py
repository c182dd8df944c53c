"""`dynamiccl.detector.paced_two_step`: a step-paced job's change on two successive steps, each
backed by the job's step (>= ``fusion.corroborate`` judged streams beyond, or all of them).

The jobs are `test_paced_warmup`'s: one data window per 5 s step (5 windows), 2-40 instances
a stream, inside the streams' first warm-up (60 steps). Noise 0.25 in log (the test bed's
step-paced warm-ups that hold two levels: MAD-sigma 0.14-0.33 on corpus dev seed 2)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_sparse import STEP

from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
from dynamiccl.detector.early_cusum import SparseWarmupCusum
from dynamiccl.detector.paced_two_step import PacedTwoStep
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

PACED = 0.1
NOISY = 0.25


def _run(seed: int, *, sigma: float = NOISY, mult: float = 1.0, slow_from: int | None = None,
         stall: int | None = None, steps: int = 45, on: bool = True):
    """Every stream ``mult`` x slower from step ``slow_from`` on (or in step ``stall`` only)."""
    job = SyntheticJob(seed=seed, sigma=sigma)
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False))
    cfg = dataclasses.replace(cfg, baseline=dataclasses.replace(cfg.baseline, paced_two_step=on))
    det = Detector(cfg)
    out = []
    for t in range(steps * STEP):
        if t % STEP:
            out += det.process(WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks()))
            continue
        k = t // STEP
        slow = (slow_from is not None and k >= slow_from) or k == stall
        out += det.process(job.window(t, Regime(instances_frac=PACED,
                                                 mult={i: mult for i in range(len(job.streams))} if slow else {})))
    return det, out


def _steps_after(ch, onset: int) -> float:
    return (ch.detected_s - (EPOCH + onset * STEP)) / STEP


def test_change_reported_from_its_second_step():
    """A 2x slowdown 30 steps into a noisy warm-up (4-5 sigma a step): reported from the window of
    its second step (1.2 steps, 6 s). Before (and with the switch off) the warm-up charts waited
    for a third step (2.2 steps, 11 s)."""
    det, ch = _run(11, mult=2.0, slow_from=30)
    assert ch and ch[0].kind != "recovery", det.fusion.counters
    assert _steps_after(ch[0], 30) < 2, [(c.kind, _steps_after(c, 30)) for c in ch]
    assert det.table.early.sparse.two_step.n_fired >= 1
    off, ch_off = _run(11, mult=2.0, slow_from=30, on=False)
    assert ch_off and _steps_after(ch_off[0], 30) > 2   # the delay the rule removes


@pytest.mark.parametrize("seed", [3, 7])
def test_other_seeds_no_later_than_before(seed):
    det, ch = _run(seed, mult=2.0, slow_from=30)
    _, ch_off = _run(seed, mult=2.0, slow_from=30, on=False)
    assert ch and _steps_after(ch[0], 30) <= _steps_after(ch_off[0], 30)
    assert len(ch) <= len(ch_off)


@pytest.mark.parametrize("seed", [8, 9, 10, 12, 13, 14])
def test_stationary_noisy_paced_job_has_no_change(seed):
    """90 stationary steps at 0.25 noise. Without the backing (any two successive samples of a
    stream >= 3 sigma and 1.5x) seed 13 alarmed 14 steps in, on a 13-sample baseline."""
    det, ch = _run(seed, steps=90)
    assert ch == []
    assert det.table.paced_warmup.n_charted > 0


@pytest.mark.parametrize("seed", [10, 13, 14])
def test_one_slow_step_of_the_noisy_job_is_not_a_change(seed):
    """Every stream 2.5x slower in step 30 only. Without the backing of the first step (one
    stream's chance 3-sigma sample, then the stall) seed 10 reported it."""
    _, ch = _run(seed, mult=2.5, stall=30, steps=60)
    assert ch == []


def test_backed_by_corroborating_streams_or_all_judged():
    r = PacedTwoStep(4, enabled=True, corroborate=2)
    codes = np.array([1, 1, 1, 2])
    # job 1: two of three beyond upwards (backed); job 2: its only judged stream beyond (backed)
    assert r.backed(np.array([1, 1, 0, -1], np.int8), codes).tolist() == [True, True, False, True]
    # one of three beyond: not backed; an unjudged sample (-2) does not count against it
    assert r.backed(np.array([1, 0, 0, 0], np.int8), codes).tolist() == [False] * 4
    assert r.backed(np.array([1, -2, -2, 0], np.int8), codes).tolist() == [True, False, False, False]


def test_check_needs_two_backed_samples_on_one_side():
    r = PacedTwoStep(2, enabled=True)
    assert r.check(0, 1, True) == 0 and r.check(0, 1, True) == 1
    assert r.check(1, 1, False) == 0 and r.check(1, 1, True) == 0      # first not backed
    assert r.check(1, -1, True) == 0                                  # side changed
    r.forget(np.array([1]))
    assert r.last[1] == 0


def test_switch_off_leaves_the_charts_alone():
    c = SparseWarmupCusum(1, deltas=(2.0, 6.0), min_samples=10)
    rows = np.zeros((1, 60))
    rows[0, :20] = np.random.default_rng(0).normal(0, 0.25, 20)
    side = c.two_step.sides(c, np.array([0]), np.array([2.0]), rows, np.array([20]), 0.004)
    assert side.tolist() == [-2] and not c.two_step.enabled
    with pytest.raises(ValueError, match="paced_two_step"):
        BaselineConfig(paced_two_step="yes").validate()
