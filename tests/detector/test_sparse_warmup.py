"""A sparse job (one all-reduce per 5 s step, 1 s windows) slowed inside its streams' first warm-up.

Its streams pool two instances per sample, so their first fixed baseline takes 60 samples (10
minutes); before, only the early chart (1.5x bar) judged them then, and a 1.35x slowdown (the
test bed's pilot throttles measured 1.36x and 1.39x) was never reported in those 10 minutes
(0 of 5 seeds here; 1.45x: 3-6 steps, the synthetic job's streams all slowed together). Now the
sparse streams' warm-up CUSUMs (`dynamiccl.detector.early_cusum`, threshold for the short
baseline) report it in 3-5 steps."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_sparse import STEP, _feed

from dynamiccl.detector.arl import cusum_threshold_estimated
from dynamiccl.detector.early_cusum import SparseWarmupCusum
from dynamiccl.harness.detector_testing import EPOCH, SyntheticJob

SECOND_HALF = {0x200 + i: 1 for i in range(4)} | {0x300: 4}   # dp comms (i, i + 4); the world comm
SIGMA = 0.09      # per-window noise of log p50, as the test bed's 5 s-step all-reduces measured


@pytest.mark.parametrize("seed,slow_from", [(7, 40), (11, 50), (5, 60)])
def test_slowdown_inside_the_first_warmup_found_within_ten_steps(seed, slow_from):
    job = SyntheticJob(seed=seed, sigma=SIGMA)
    det, ch = _feed(job, slow_from + 20, slow_from=slow_from, mult=1.35)
    assert ch, det.fusion.counters
    first = ch[0]
    assert first.kind != "recovery"
    delay_steps = (first.detected_s - (EPOCH + slow_from * STEP)) / STEP
    assert 0 < delay_steps <= 10, (delay_steps, [(c.kind, (c.detected_s - EPOCH) / STEP) for c in ch])
    assert det.table.early.sparse.n_alarms >= 1


@pytest.mark.parametrize("seed", [8, 9, 10, 12])
def test_stationary_first_warmup_has_no_change(seed):
    """The first 10 minutes (the whole first warm-up) and beyond of a stationary sparse job."""
    job = SyntheticJob(seed=seed, sigma=SIGMA)
    det, ch = _feed(job, 200)
    assert ch == [], [(c.kind, (c.detected_s - EPOCH) / STEP) for c in ch]


def test_threshold_counts_the_samples_spacing():
    """The rate is per window: a stream sampled every 8+ windows holds it with arl0 / 8 samples."""
    c = SparseWarmupCusum(4, deltas=(2.0,), min_samples=10)
    rows = np.zeros((1, 60))
    rows[0, :20] = np.random.default_rng(0).normal(0, 0.1, 20)
    for k in range(5):   # one sample every 10 windows
        c.step(k, np.array([0]), np.array([0.0]), rows, np.array([20]), 0.004, 1e5, now_s=10.0 * k, window_s=1.0)
    assert c.spacing[0] == pytest.approx(10.0)
    assert c.threshold(20, 2.0, 1e5 / 8) == pytest.approx(cusum_threshold_estimated(1.25e4, 1.0, 20, True, "winsorized"))


def test_a_pause_is_not_the_streams_spacing():
    """A 30-window gap (a checkpoint) between samples every 2 windows leaves the spacing at 2:
    a longer spacing would lower the threshold (arl0 / spacing) for the samples after it."""
    c = SparseWarmupCusum(4, deltas=(2.0,), min_samples=10)
    rows = np.zeros((1, 60))
    rows[0, :20] = np.random.default_rng(0).normal(0, 0.1, 20)
    for now in (0.0, 2.0, 4.0, 6.0, 36.0, 38.0):
        c.step(0, np.array([0]), np.array([0.0]), rows, np.array([20]), 0.004, 1e5, now_s=now, window_s=1.0)
    assert c.spacing[0] == pytest.approx(2.0)


def test_one_stalled_sample_is_not_a_change():
    """One 2.5x sample inside the first warm-up (a stall of the shared machine): the large-shift
    chart may alarm on it, the fusion stage's confirmation (the next sample) drops it."""
    from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
    from dynamiccl.detector.service import Detector
    from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
    from dynamiccl.harness.detector_testing import Regime
    job = SyntheticJob(seed=8, sigma=SIGMA)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    out = []
    for t in range(120 * STEP):
        if t % STEP == 0:
            stall = {i: 2.5 for i in range(len(job.streams))} if t // STEP in (40, 41) else {}
            out += det.process(job.window(t, Regime(instances_frac=1e-6, mult=stall)))
        else:
            out += det.process(WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks()))
    assert out == [], [(c.kind, (c.detected_s - EPOCH) / STEP) for c in out]


def test_straddling_instances_rebase_nothing():
    """Instances of a sparse job straddling a window's edge: each instance's records split, half
    of its ranks in one window and the rest in the next, for several steps in a row (a 5.006 s
    step drifts 6 ms a step against 1 s windows: a straddle lasts several steps). That is no
    rank leaving: nothing is re-baselined. Before, each pooled sample's completing window
    showed half the ranks, two of them in a row re-baselined the stream (a test-bed run's
    warm-up restarted 40 s before its throttle, which was then missed)."""
    from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
    from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.detector_testing import Regime
    job = SyntheticJob(seed=8, sigma=SIGMA)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    straddle = range(30, 36)
    for t in range(60 * STEP):
        step, phase = divmod(t, STEP)
        if step in straddle and phase in (0, 1):   # node-0 ranks' records, then node-1's
            wf = job.window(t, Regime(instances_frac=1e-6, missing_ranks=(4, 5, 6, 7) if phase == 0 else (0, 1, 2, 3)))
            if phase == 1:   # node-1's ranks by their rank in the communicator (the synthetic job
                # numbers the present members of a partial communicator from 0)
                shift = pl.col("comm_hash").replace_strict(SECOND_HALF, default=0, return_dtype=pl.Int64)
                wf = WindowFeatures(wf.window_start, wf.window_s, wf.keys,
                                    wf.ranks.with_columns((pl.col("rank") + shift).cast(wf.ranks.schema["rank"])))
        elif phase == 0:
            wf = job.window(t, Regime(instances_frac=1e-6))
        else:
            wf = WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks())
        assert det.process(wf) == []
    assert det.table.n_rebased == 0


def test_rank_that_left_a_sparse_job_still_rebases():
    """A rank that stopped reporting (every window from then on) is still a rank-set change."""
    from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
    from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.detector_testing import Regime
    job = SyntheticJob(seed=8, sigma=SIGMA)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    for t in range(60 * STEP):
        if t % STEP == 0:
            det.process(job.window(t, Regime(instances_frac=1e-6, missing_ranks=(7,) if t >= 30 * STEP else ())))
        else:
            det.process(WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks()))
    assert det.table.n_rebased > 0
