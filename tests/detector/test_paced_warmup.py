"""A step-paced job (every collective once per 5 s training step, several instances each, 1 s
windows) inside its streams' first warm-up: 60 samples are 60 steps (5 minutes).

Before `dynamiccl.detector.paced_warmup`, only the early chart (a 1.5x bar, 5 MAD-sigma) judged
these streams until then, so a 1.35x slowdown 30 steps in was not reported in the whole warm-up.
Now their samples also feed the warm-up CUSUMs with the short-baseline threshold, and an alarm
that rests on one sample waits for the next (a single slow step is no change)."""
from __future__ import annotations

import numpy as np
import pytest
from test_sparse import STEP, _feed

from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
from dynamiccl.detector.early_cusum import SparseWarmupCusum
from dynamiccl.detector.paced_warmup import PacedWarmup
from dynamiccl.detector.sparse import JobCadence
from dynamiccl.harness.detector_testing import EPOCH, SyntheticJob

PACED = 0.1       # instances per step window: 2-40 per stream, never pooled
SIGMA = 0.09      # per-window noise of log p50, as the test bed's step-paced all-reduces measured


def _late(ch):
    return [(c.kind, round((c.detected_s - EPOCH) / STEP, 1)) for c in ch]


@pytest.mark.parametrize("seed,slow_from", [(7, 30), (11, 40), (5, 25)])
def test_paced_slowdown_inside_the_first_warmup_found_within_ten_steps(seed, slow_from):
    job = SyntheticJob(seed=seed, sigma=SIGMA)
    det, ch = _feed(job, slow_from + 20, slow_from=slow_from, mult=1.35, instances_frac=PACED)
    assert det.table.pool.n_pooled == 0          # dense steps: not the sparse (pooled) path
    assert det.table.paced_warmup.n_charted > 0
    assert ch, det.fusion.counters
    delay_steps = (ch[0].detected_s - (EPOCH + slow_from * STEP)) / STEP
    assert ch[0].kind != "recovery"
    assert 0 < delay_steps <= 10, (delay_steps, _late(ch))


@pytest.mark.parametrize("seed", [8, 9, 10, 12])
def test_stationary_paced_first_warmup_has_no_change(seed):
    """The whole first warm-up (60 steps) and beyond of a stationary step-paced job."""
    det, ch = _feed(SyntheticJob(seed=seed, sigma=SIGMA), 90, instances_frac=PACED)
    assert ch == [], _late(ch)
    assert det.table.paced_warmup.n_charted > 0


def test_one_slow_step_is_not_a_change():
    """One step 2.5x slower on every stream 30 steps into the warm-up (a stall of the shared
    machine), then normal steps: the large-shift chart's one-sample alarm is held for the
    next sample and dropped. Without the hold every stream alarmed in one window and the
    fusion stage's big-shift rule reported it."""
    from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.detector_testing import Regime
    job = SyntheticJob(seed=8, sigma=SIGMA)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    out = []
    for t in range(60 * STEP):
        if t % STEP == 0:
            stall = {i: 2.5 for i in range(len(job.streams))} if t // STEP == 30 else {}
            out += det.process(job.window(t, Regime(instances_frac=PACED, mult=stall)))
        else:
            out += det.process(WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks()))
    assert out == [], _late(out)
    assert det.table.early.sparse.n_unconfirmed > 0


def test_dense_job_is_not_charted():
    """A job with data in every window is not step-paced: its streams stay with the early chart."""
    gate = PacedWarmup()
    cad = JobCadence()
    for k in range(10):
        cad.observe(np.array([1]), float(k), 1.0)
    charted, confirm = gate.charted(cad, np.array([1, 1]), np.array([False, True]), 1.0)
    assert charted.tolist() == [False, True] and not confirm.any() and gate.n_charted == 0


def test_paced_job_is_charted_and_confirmed():
    gate = PacedWarmup()
    cad = JobCadence()
    for k in range(10):
        cad.observe(np.array([1]), 3.0 * k, 1.0)
    charted, confirm = gate.charted(cad, np.array([1, 1]), np.array([False, True]), 1.0)
    assert charted.tolist() == [True, True] and confirm.tolist() == [True, False] and gate.n_charted == 1
    off = PacedWarmup(enabled=False)
    assert off.charted(cad, np.array([1]), np.array([False]), 1.0)[0].tolist() == [False]


def test_held_alarm_confirmed_by_the_next_sample():
    """A one-sample crossing is held; a next sample still k beyond confirms it (onset kept)."""
    c = SparseWarmupCusum(2, deltas=(2.0, 6.0), min_samples=10)
    rows = np.zeros((1, 60))
    rows[0, :20] = np.random.default_rng(0).normal(0, 0.1, 20)
    args = (np.array([20]), 0.004, 1e5)
    f, *_ = c.step(5, np.array([0]), np.array([2.0]), rows, *args, confirm=np.array([True]))
    assert not f[0] and c.pending[0] == 1 and c.n_held == 1
    f, d, start, keep = c.step(6, np.array([0]), np.array([1.5]), rows, *args, confirm=np.array([True]))
    assert f[0] and d[0] == 1 and start[0] == 5 and keep[0] == 20


def test_held_alarm_dropped_when_the_next_sample_is_back():
    c = SparseWarmupCusum(2, deltas=(2.0, 6.0), min_samples=10)
    rows = np.zeros((1, 60))
    rows[0, :20] = np.random.default_rng(0).normal(0, 0.1, 20)
    args = (np.array([20]), 0.004, 1e5)
    c.step(5, np.array([0]), np.array([2.0]), rows, *args, confirm=np.array([True]))
    f, *_ = c.step(6, np.array([0]), np.array([0.01]), rows, *args, confirm=np.array([True]))
    assert not f.any() and c.pending[0] == 0 and c.n_unconfirmed == 1 and c.up[0].max() == 0.0


def test_switch_is_validated():
    with pytest.raises(ValueError, match="paced_warmup"):
        BaselineConfig(paced_warmup="yes").validate()


def test_accumulated_alarm_is_not_held():
    """The small-shift chart crossing after successive samples of one excursion needs no
    confirmation: it already rests on more than one sample (`PacedConfirm.lone` is false)."""
    c = SparseWarmupCusum(2, deltas=(2.0, 6.0), min_samples=10)
    rows = np.zeros((1, 60))
    rows[0, :20] = np.random.default_rng(0).normal(0, 0.1, 20)
    args = (np.array([20]), 0.004, 1e5)
    fired_at = None
    for k in range(40):
        f, *_ = c.step(k, np.array([0]), np.array([0.25]), rows, *args, confirm=np.array([True]))
        if f[0]:
            fired_at = k
            break
    assert fired_at is not None and fired_at > 1 and c.n_held == 0


def _one_stream_slow(seed: int, stream: int, mult: float, slow_from: int, steps: int):
    from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.detector_testing import Regime
    job = SyntheticJob(seed=seed, sigma=SIGMA)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    out = []
    for t in range(steps * STEP):
        if t % STEP == 0:
            slow = {stream: mult} if t // STEP >= slow_from else {}
            out += det.process(job.window(t, Regime(instances_frac=PACED, mult=slow)))
        else:
            out += det.process(WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks()))
    return det, out


@pytest.mark.parametrize("seed", [3, 7])
def test_lone_stream_alarm_on_two_successive_samples_is_not_held_a_step(seed):
    """One stream of a step-paced job 2x slower 30 steps into the warm-up: its alarm rests on
    two successive samples beyond the confirmation bar (the fusion stage's own confirmation), so
    it is reported from the window that alarmed. Before, the lone alarm waited for the next
    window with data (one step, 5 s here) for its confirmation: 2 steps after the onset."""
    job = SyntheticJob(seed=seed, sigma=SIGMA)
    stream = job.large()[0]
    det, ch = _one_stream_slow(seed, stream, 2.0, 30, 40)
    assert ch, det.fusion.counters
    delay_steps = (ch[0].detected_s - (EPOCH + 30 * STEP)) / STEP
    assert delay_steps < 2, (delay_steps, _late(ch))
    assert det.fusion.counters["paced_preconfirmed"] >= 1


def test_confirmed_at_needs_two_successive_samples_beyond():
    """`PacedConfirm.count_beyond` / `mark_confirmed`: an alarm after two samples >= confirm_z
    away is marked confirmed at its step; a held one-sample alarm confirmed by a next sample
    >= confirm_z away too."""
    c = SparseWarmupCusum(2, deltas=(2.0, 6.0), min_samples=10, confirm_z=3.0)
    rows = np.zeros((1, 60))
    rows[0, :20] = np.random.default_rng(0).normal(0, 0.1, 20)
    args = (np.array([20]), 0.004, 1e5)
    yes = np.array([True])
    c.step(5, np.array([0]), np.array([2.0]), rows, *args, confirm=yes)       # held (lone)
    assert c.confirmed_at[0] == -1 and c.beyond_run[0] == 1
    f, *_ = c.step(6, np.array([0]), np.array([1.5]), rows, *args, confirm=yes)
    assert f[0] and c.confirmed_at[0] == 6
    c2 = SparseWarmupCusum(2, deltas=(2.0, 6.0), min_samples=10, confirm_z=3.0)
    c2.step(5, np.array([0]), np.array([2.0]), rows, *args, confirm=yes)
    f, *_ = c2.step(6, np.array([0]), np.array([0.15]), rows, *args, confirm=yes)   # 1-2 sigma: not 3
    assert not f[0] and c2.confirmed_at[0] == -1


class _Bank:
    """The warm-up buffer `EarlyChart.check` reads (one stream)."""
    warmup = 60

    def __init__(self, samples):
        self.rows = np.full((1, 60), np.nan)
        self.rows[0, : len(samples)] = samples
        self.n = len(samples)
        self.warming_up = np.array([True])

    def warm_samples(self, j):
        return self.rows[: j.size].copy(), np.array([self.n] * j.size)


def test_early_chart_alarm_clears_the_warmup_cusums():
    """The early chart reports an excursion first (two values >= 1.5x): the warm-up CUSUMs'
    statistics, built on that excursion, are cleared with it. Before, they stayed and carried
    into the stream's next warm-up (seen on the test bed: a statistic of 8 from an alarm at
    +39 s still there at +80 s, when the restarted warm-up reached 10 samples)."""
    from dynamiccl.detector.early import EarlyChart
    chart = EarlyChart(1, warmup=60, ratio=1.5, z=5.0, min_samples=10, scale_floor=0.004)
    bank = _Bank(np.random.default_rng(1).normal(0.0, 0.02, 10))
    idx, codes, yes = np.array([0]), np.array([1]), np.array([True])
    for t, x in enumerate([0.0, 0.8, 0.8]):
        al = chart.check(t, idx, codes, np.array([x]), bank, yes, float(t), 1.0, yes)
        bank.rows[0, bank.n] = x
        bank.n += 1
    assert al.idx.tolist() == [0] and chart.sparse.n_alarms == 0   # the chart's alarm, not the CUSUMs'
    assert chart.sparse.up[0].max() == 0.0 and chart.sparse.keep[0] == -1
