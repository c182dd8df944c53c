"""A rank missing from a stream's windows while its latency moved is a slowed rank, not a
re-made stream (`dynamiccl.detector.stream_rebase.LOST_RANK_SHIFT`)."""
from __future__ import annotations

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

WARM = 70


def _run(mult, n=WARM + 12):
    job = SyntheticJob(seed=4)
    # the slowed rank's streams only: the others hold no evidence
    cross = {i: mult for i, s in enumerate(job.streams) if 5 in [r for r, _ in s.ranks]}
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    out = []
    for t in range(n):
        reg = Regime(mult=cross, missing_ranks=(5,)) if t >= WARM else None
        out += det.process(job.window(t, reg))
    return det, out


def test_slowdown_that_drops_a_rank_is_a_change():
    """A 2x slowdown whose slowed rank's records miss the windows (a throttled test-bed rank)
    is reported within 3 windows (only its own streams slowed); before, its streams were re-baselined as a rank-set change
    and nothing was reported."""
    det, out = _run(2.0)
    deg = [c for c in out if c.kind != "recovery"]
    assert deg, (out, det.table.n_rebased)
    assert deg[0].detected_s - (EPOCH + WARM) <= 3.0


def test_vanished_rank_alone_is_no_change():
    """The same rank vanishing with the latency unchanged is no regime change, and its streams
    keep their baselines (`stream_rebase.KEEP_SIGMAS`): monitored at once, no new warm-up."""
    det, out = _run(1.0)
    assert out == []
    tab = det.table
    assert tab.n_rank_set_kept > 0 and tab.n_rebased == 0
    assert not tab.banks[0].warming_up[:tab.n].any()


def test_vanished_rank_with_a_moved_level_is_rebaselined():
    """A rank-set change that moves the stream's latency by more than the small-shift chart's
    reference value (here 1.2x, 18 sigmas of the 1 % noise, under the 1.5x of a slowed rank) is a
    new make-up: re-baselined (by the table; were it kept, the fusion stage's workload gate would
    re-baseline it on its alarm), no regime change."""
    det, out = _run(1.2)
    assert [c for c in out if c.kind != "recovery"] == []
    assert det.table.n_rebased > 0


def test_kept_rank_set_still_reports_a_later_slowdown():
    """After a kept rank-set change the stream is monitored: a 2x slowdown 10 windows later is
    reported within 3 windows (a re-baselined stream would be warming up for 60)."""
    job = SyntheticJob(seed=4)
    cross = {i: 2.0 for i, s in enumerate(job.streams) if 5 in [r for r, _ in s.ranks]}
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    out = []
    for t in range(WARM + 25):
        if t < WARM:
            reg = None
        else:
            reg = Regime(mult=cross if t >= WARM + 10 else {}, missing_ranks=(4,))
        out += det.process(job.window(t, reg))
    deg = [c for c in out if c.kind != "recovery"]
    assert det.table.n_rank_set_kept > 0
    assert deg and deg[0].detected_s - (EPOCH + WARM + 10) <= 3.0, out


def test_a_rank_lost_during_an_incident_keeps_the_incident():
    """A 2x slowdown of the streams of rank 5 is reported; 4 windows later rank 5's records stop
    (the latency stays where it is). The streams are re-learning after the alarm (fewer than
    ``early_min`` samples): their level is the incident's, so the make-up change keeps them and
    the incident. When the slowdown ends, it is reported as the incident's recovery; before, the
    streams were re-baselined, the incident closed unreported, and the end of the slowdown came
    out as a fall in latency (or not at all)."""
    job = SyntheticJob(seed=4)
    slow = {i: 2.0 for i, s in enumerate(job.streams) if 5 in [r for r, _ in s.ranks]}
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    out, lost_at = [], None
    for t in range(WARM + 60):
        on = WARM <= t < WARM + 40
        if lost_at is None and any(c.kind != "recovery" for c in out):
            lost_at = t + 4
        gone = (5,) if lost_at is not None and t >= lost_at else ()
        reg = Regime(mult=slow if on else {}, missing_ranks=gone) if (on or gone) else None
        out += det.process(job.window(t, reg))
    assert lost_at is not None and lost_at < WARM + 10, out
    deg = [c for c in out if c.kind != "recovery"]
    rec = [c for c in out if c.kind == "recovery"]
    assert len(deg) == 1 and deg[0].magnitude > 1.5, out
    assert len(rec) == 1 and rec[0].recovers == deg[0].id, out
    assert rec[0].detected_s - (EPOCH + WARM + 40) <= 3.0
    assert det.table.n_rank_set_kept > 0
