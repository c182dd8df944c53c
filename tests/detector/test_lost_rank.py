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
    """The same rank vanishing with the latency unchanged re-baselines its streams (a
    workload change), no regime change."""
    det, out = _run(1.0)
    assert out == []
    assert det.table.n_rebased > 0
