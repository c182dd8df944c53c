"""The early chart (`dynamiccl.detector.early`): a large shift inside a stream's first warm-up is
reported, and the changed regime does not become the fixed baseline."""
from __future__ import annotations

import numpy as np

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

PLAIN = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False))


def _run(cfg, n, schedule, seed=3, sigma=0.05):
    """``schedule``: {window: Regime-or-None}, held until the next entry."""
    job = SyntheticJob(seed=seed, sigma=sigma)
    det = Detector(cfg)
    out, reg = [], None
    for t in range(n):
        reg = schedule.get(t, reg)
        out += det.process(job.window(t, reg))
    return job, det, out


def _net(job, m):
    return Regime(mult={i: m for i, s in enumerate(job.streams) if s.nnodes > 1})


def _slow_at(onset, end, m=2.0):
    job = SyntheticJob(seed=3)
    return {onset: _net(job, m), end: None}


def test_a_change_inside_the_warm_up_is_reported():
    """A 2x slowdown 35 s into the job (the fixed baseline needs 60 windows) is reported within
    3 s and its end as a recovery; without the chart nothing is reported before window 60."""
    _, _, ch = _run(PLAIN, 70, _slow_at(35, 50))
    deg = [c for c in ch if c.kind != "recovery"]
    assert deg and 0 < deg[0].detected_s - (EPOCH + 35) <= 3.0, [(c.kind, c.detected_s - EPOCH) for c in ch]
    assert abs(deg[0].start_s - (EPOCH + 35)) <= 1.0
    rec = [c for c in ch if c.kind == "recovery"]
    assert rec and rec[0].recovers == deg[0].id and 0 < rec[0].detected_s - (EPOCH + 50) <= 5.0
    _, _, off = _run(PLAIN.replace(**{"baseline.early_ratio": 0}), 70, _slow_at(35, 50))
    assert [c for c in off if c.detected_s < EPOCH + 60] == []


def test_the_changed_regime_does_not_become_the_baseline():
    """After the recovery the warm-up goes on from the pre-onset samples: the fixed baseline is
    the normal level, and a second 2x slowdown later on is reported by the CUSUMs."""
    sched = {35: _net(SyntheticJob(seed=3), 2.0), 50: None, 120: _net(SyntheticJob(seed=3), 2.0)}
    job, det, _ = _run(PLAIN, 120, sched)
    tab = det.table
    fired = [i for i in range(tab.n) if tab.nnodes[i] > 1]
    assert not tab.banks[0].warming_up[fired].any()
    med, _ = tab.baseline(np.array(fired))
    base = np.array([np.log(job.streams[k].base_s) for k in range(len(job.streams)) if job.streams[k].nnodes > 1])
    assert np.allclose(np.sort(med), np.sort(base), atol=0.05), (med, base)
    _, _, ch = _run(PLAIN, 140, sched)
    late = [c for c in ch if c.kind != "recovery" and c.detected_s > EPOCH + 120]
    assert late and late[0].detected_s - (EPOCH + 120) <= 3.0


def test_a_one_window_spike_in_the_warm_up_is_not_a_change():
    _, det, ch = _run(PLAIN, 60, _slow_at(30, 31, 3.0))
    assert ch == []
    assert det.table.early.n_alarms == 0


def test_a_stream_that_appears_in_a_running_job_is_not_charted():
    """A new message size 70 s into the job is a new stream in its first warm-up; the job's other
    streams watch it, the early chart does not (it would report one event twice)."""
    job = SyntheticJob(seed=3)
    i = job.large()[0]
    resized = Regime(size_mult={i: 4.0})
    slow = Regime(size_mult={i: 4.0}, mult={i: 3.0})
    _, det, _ = _run(PLAIN, 110, {70: resized, 90: slow})
    assert det.table.early.n_alarms == 0
    new = [k for k in range(det.table.n) if det.table.early.seen[k] and not det.table.early.starter[k]]
    assert new
