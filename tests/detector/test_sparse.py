"""A sparse job: one instance of each collective per 5 s training step (1 s windows), so four
windows in five hold nothing and the fifth one instance. Streams pool windows until they hold
``min_instances`` instances (`dynamiccl.detector.sparse`); before, no stream ever got a baseline."""
from __future__ import annotations

from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

STEP = 5          # windows per training step


def _feed(job, steps, slow_from=None, mult=1.5, *, period=STEP, instances_frac=1e-6):
    """``steps`` training steps of ``period`` windows; only a step's first window holds data
    (``instances_frac`` of the job's usual instances); nodes' streams ``mult`` slower from ``slow_from``."""
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    out = []
    for t in range(steps * period):
        if t % period == 0:
            on = slow_from is not None and t >= slow_from * period
            reg = Regime(instances_frac=instances_frac,
                         mult={i: mult for i, s in enumerate(job.streams) if s.nnodes > 1} if on else {})
            wf = job.window(t, reg)
        else:
            wf = WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks())
        out += det.process(wf)
    return det, out


def test_sparse_job_slowdown_found_within_ten_steps():
    job = SyntheticJob(seed=7, sigma=0.05)
    det, ch = _feed(job, 200, slow_from=180)
    assert ch, det.fusion.counters
    first = ch[0]
    assert first.kind in ("bandwidth", "latency")
    delay_steps = (first.detected_s - (EPOCH + 180 * STEP)) / STEP
    assert 0 < delay_steps <= 10, (delay_steps, [(c.kind, (c.detected_s - EPOCH) / STEP) for c in ch])
    assert det.table.pool.n_pooled > 0
    # the delay in instances: one instance per step, so about the delay in steps
    assert 1 <= first.evidence["delay_instances"] <= delay_steps + 1, first.evidence["delay_instances"]


def test_sparse_job_stationary_hour_has_no_change():
    job = SyntheticJob(seed=8, sigma=0.05)
    det, ch = _feed(job, 720)            # one hour
    assert ch == [], [(c.kind, (c.detected_s - EPOCH) / STEP) for c in ch]
    assert det.table.n_active > 0 and not det.table.banks[0].warming_up[:det.table.n].all()


PACED = 3         # windows per step of a step-paced job whose windows with data are whole


def test_step_paced_job_slowdown_found():
    """Every collective comes once per 3 s step, with enough instances in its window (no pooling):
    each value follows two empty windows. Judged against 1.5 windows, every value came after a
    gap and no alarm could open a change; judged against the job's cadence it is found."""
    job = SyntheticJob(seed=7, sigma=0.05)
    det, ch = _feed(job, 120, slow_from=100, period=PACED, instances_frac=1.0)
    assert ch, det.fusion.counters
    delay_steps = (ch[0].detected_s - (EPOCH + 100 * PACED)) / PACED
    assert ch[0].kind in ("bandwidth", "latency") and 0 <= delay_steps <= 3, (delay_steps, ch)


def test_step_paced_job_without_cadence_is_found_by_confirmation(monkeypatch):
    """The same job with the job cadence switched off (each stream judged against 1.5 windows,
    every value after a gap): the slowdown is still found, by a confirmed alarm (a gap window
    waits for the next one, which confirms it). Before, a confirmed alarm's gap windows were no
    evidence either, and the job was blind."""
    import numpy as np
    from dynamiccl.detector.sparse import JobCadence
    monkeypatch.setattr(JobCadence, "usual", lambda self, codes: np.full(len(codes), np.nan))
    job = SyntheticJob(seed=7, sigma=0.05)
    det, ch = _feed(job, 120, slow_from=100, period=PACED, instances_frac=1.0)
    assert ch, det.fusion.counters
    delay_steps = (ch[0].detected_s - (EPOCH + 100 * PACED)) / PACED
    assert ch[0].kind in ("bandwidth", "latency") and 0 <= delay_steps <= 3, (delay_steps, ch)


def test_step_paced_job_that_a_throttle_slows_is_found():
    """A job of one step per 2 windows whose step a throttle stretches to 4 windows (its
    collectives 2x slower): every window with data now follows a silence longer than 1.5x the
    usual interval (a gap), so before, even its confirmed alarms were no evidence and the
    throttle was never reported (test-bed dev seed 0). Found within 3 slow steps now."""
    job = SyntheticJob(seed=7, sigma=0.05)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    cross = {i: 2.0 for i, s in enumerate(job.streams) if s.nnodes > 1}
    out, t, onset = [], 0, 200
    while t < 320:
        slow = t >= onset
        period = 4 if slow else 2
        for k in range(period):
            if k == 0:
                wf = job.window(t, Regime(instances_frac=1.0, mult=cross if slow else {}))
            else:
                wf = WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks())
            out += det.process(wf)
            t += 1
    assert out, det.fusion.counters
    assert 0 < out[0].detected_s - (EPOCH + onset) <= 3 * 4, [(c.kind, c.detected_s - EPOCH) for c in out]


def test_step_paced_job_recovery_within_one_step():
    """A step-paced job's window with data holds a whole step: one such window back at the old
    level is the recovery (dense jobs: ``recovery_windows`` = 2 in a row). Before, a recovery came
    two steps after the release (4 s here; 2-10 s on the test bed, beyond its 5 s match)."""
    job = SyntheticJob(seed=7, sigma=0.05)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    slow = {i: 1.5 for i, s in enumerate(job.streams) if s.nnodes > 1}
    out = []
    for t in range(130 * PACED):
        step, first = divmod(t, PACED)
        if first == 0:
            wf = job.window(t, Regime(mult=slow if 100 <= step < 115 else {}))
        else:
            wf = WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks())
        out += det.process(wf)
    rec = [c for c in out if c.kind == "recovery"]
    assert [c.kind for c in out if c.kind != "recovery"] and rec, out
    delay_steps = (rec[0].detected_s - (EPOCH + 115 * PACED)) / PACED
    assert 0 < delay_steps <= 1.0, (delay_steps, [(c.kind, (c.detected_s - EPOCH) / PACED) for c in out])
