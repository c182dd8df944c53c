"""A step inside a pooled stream's first warm-up buffer (`dynamiccl.detector.warmup_step`).

A sparse job (one instance per 5-window step, pooled two per sample) slowed 1.6x at its 10th
instance: every warm-up chart judges a sample only with ``early_min`` (10) samples behind it, so
the throttled samples joined the baseline and the change was never reported (issue 17's blind
spot; the test bed's seeds 1 and 5). Before the gate the first test found no change at all."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_sparse import STEP, _feed

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.detector.warmup_step import best_split
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

SIGMA = 0.09   # per-sample noise of log latency, as the test bed's 5 s-step all-reduces measured
FLOOR, LOG_RATIO, Z = 0.004, np.log(1.5), 5.0


@pytest.mark.parametrize("seed", [7, 11, 5])
def test_step_after_nine_clean_instances_is_reported(seed):
    job = SyntheticJob(seed=seed, sigma=SIGMA)
    det, ch = _feed(job, 40, slow_from=9, mult=1.6)
    assert ch, det.fusion.counters
    first = ch[0]
    assert first.kind != "recovery"
    delay_steps = (first.detected_s - (EPOCH + 9 * STEP)) / STEP
    # one instance per step: the gate first judges the 10th pooled sample (instances 19-20) and the
    # fusion stage confirms on the next one: 12.2 steps (instances) after the onset, 22 in, at seed 7
    assert 0 < delay_steps <= 14, (delay_steps, [(c.kind, (c.detected_s - EPOCH) / STEP) for c in ch])
    assert det.table.early.step.n_steps >= 1


def test_without_the_gate_the_step_is_never_reported():
    """The blind spot the gate closes (``baseline.warmup_step`` off: the code before it)."""
    job = SyntheticJob(seed=7, sigma=SIGMA)
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False))
    cfg = dataclasses.replace(cfg, baseline=dataclasses.replace(cfg.baseline, warmup_step=False))
    det = Detector(cfg)
    out = []
    for t in range(40 * STEP):
        reg = Regime(instances_frac=1e-6, mult={i: 1.6 for i, s in enumerate(job.streams) if s.nnodes > 1}
                     if t >= 9 * STEP else {})
        if t % STEP == 0:
            out += det.process(job.window(t, reg))
    assert out == [] and det.table.early.step.n_steps == 0


@pytest.mark.parametrize("seed", range(6))
def test_stationary_samples_with_spikes_hold_no_step(seed):
    """In-control samples with spikes (a stalled step, two in a row, 2-4x): no split passes."""
    rng = np.random.default_rng(seed)
    for n in range(12, 60, 7):
        s = rng.normal(0.0, SIGMA, n)
        at = rng.choice(np.arange(0, n - 2, 4), size=3, replace=False)   # runs of at most two
        s[at] += np.log(rng.uniform(2, 4, 3))
        s[at[0] + 1] += np.log(3.0)            # one stall lasting two samples
        assert best_split(s, LOG_RATIO, Z, FLOOR) == (0, 0), (seed, n, s.round(2).tolist())


def test_spikes_at_the_buffer_end_are_not_a_regime():
    """Two 3x spikes among the last three samples move their median past both bars; the third
    sample is back, so the after side is not one regime."""
    s = np.r_[np.random.default_rng(1).normal(0.0, SIGMA, 12), np.log(3.0), 0.0, np.log(3.0)]
    assert best_split(s, LOG_RATIO, Z, FLOOR) == (0, 0)
    s[-2] = np.log(2.5)
    assert best_split(s, LOG_RATIO, Z, FLOOR) == (1, 12)


def _sparse_run(on: bool, spikes: set[int], steps: int = 120):
    job = SyntheticJob(seed=3, sigma=SIGMA)
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False))
    det = Detector(dataclasses.replace(cfg, baseline=dataclasses.replace(cfg.baseline, warmup_step=on)))
    out = []
    for step in range(steps):   # the whole first warm-up (60 pooled samples)
        mult = {i: 2.5 for i, s in enumerate(job.streams) if s.nnodes > 1} if step in spikes else {}
        out += det.process(job.window(step * STEP, Regime(instances_frac=1e-6, mult=mult)))
    return det, [(c.kind, c.detected_s) for c in out]


def test_stationary_sparse_job_with_spikes_adds_no_report():
    """2.5x stalls of single steps (two at 30-31) through the first warm-up: the gate raises
    nothing (the reports, if any, are the other charts', exactly as without it)."""
    spikes = {14, 30, 31, 47, 63, 85, 104}
    det, on = _sparse_run(True, spikes)
    assert det.table.early.step.n_steps == 0
    assert on == _sparse_run(False, spikes)[1]
    det, quiet = _sparse_run(True, set())
    assert quiet == [] and det.table.early.step.n_steps == 0


def test_dense_stream_is_untouched():
    """A dense job (whole windows) stepped inside its first warm-up: the gate judges nothing and
    the reports are those without it."""
    def run(on: bool):
        job = SyntheticJob(seed=4, sigma=0.03)
        cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False))
        det = Detector(dataclasses.replace(cfg, baseline=dataclasses.replace(cfg.baseline, warmup_step=on)))
        out = []
        for t in range(120):
            mult = {i: 1.6 for i, s in enumerate(job.streams) if s.nnodes > 1} if t >= 15 else {}
            out += det.process(job.window(t, Regime(mult=mult)))
        return det, [(c.kind, c.detected_s) for c in out]

    det, on = run(True)
    assert det.table.early.step.n_steps == 0
    assert on == run(False)[1]


def test_a_step_the_charts_judged_is_not_the_gates():
    """A step after the buffer's first ``early_min`` samples was judged by the early chart and
    the warm-up CUSUMs against a baseline without it: the gate leaves it to them."""
    s = np.r_[np.random.default_rng(2).normal(0.0, SIGMA, 12), np.full(5, np.log(1.8))]
    assert best_split(s, LOG_RATIO, Z, FLOOR) == (1, 12)
    assert best_split(s, LOG_RATIO, Z, FLOOR, last=9) == (0, 0)
    assert best_split(s[3:], LOG_RATIO, Z, FLOOR, last=9) == (1, 9)


def test_step_paced_stream_is_untouched():
    """A step-paced job (whole windows once per 3-window step) stepped inside its first warm-up:
    not the gate's (its corpus warm-ups hold several regimes; see the module)."""
    from test_sparse import PACED
    job = SyntheticJob(seed=4, sigma=SIGMA)
    det, _ = _feed(job, 40, slow_from=9, mult=1.6, period=PACED, instances_frac=1.0)
    assert det.table.paced_warmup.n_charted > 0
    assert det.table.early.step.n_steps == 0
