"""Gate ``recovery_drain`` (`dynamiccl.detector.fusion_drain`): a recovered incident's streams
still draining at a level its recovery rule calls recovered are no new degradation."""
from __future__ import annotations

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig, IncidentConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, run_cross_levels


def _run(level_at, drain=True):
    """Cross-node streams at latency x ``level_at(t)`` (1: baseline)."""
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False),
                                  incidents=IncidentConfig(recovery_drain=drain)))
    out = run_cross_levels(det, level_at, 170)
    return det, [(c.kind, round(c.detected_s - EPOCH, 1)) for c in out]


def _drain(t):
    """3x from window 100, released at 130; 1.25x (0.2 of the shift) at 134-136: the tail."""
    if 100 <= t < 130:
        return 3.0
    return 1.25 if 134 <= t < 137 else 1.0


def test_a_release_that_drains_after_its_recovery_is_one_recovery():
    """Before the gate the restored baseline alarmed on the tail: a second degradation at 135."""
    det, out = _run(_drain)
    assert [k for k, _ in out] == ["bandwidth", "recovery"], out
    assert det.fusion.counters["recovery_drains"] >= 1


def test_the_tail_is_a_degradation_with_the_gate_off():
    _, out = _run(_drain, drain=False)
    assert len([k for k, _ in out if k != "recovery"]) == 2, out


def test_a_re_onset_beyond_the_recovered_band_is_still_reported():
    """2x (0.63 of the old shift) 4 windows after the release is a change of its own."""
    det, out = _run(lambda t: 3.0 if 100 <= t < 130 else (2.0 if 134 <= t < 150 else 1.0))
    assert len([k for k, t in out if k != "recovery" and 134 < t <= 138]) == 1, out
    assert det.fusion.counters["recovery_drains"] == 0
