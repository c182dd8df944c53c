"""Rule ``softer_release`` (`dynamiccl.detector.softer_release`): a recovery within ``merge_s``
of the incident's softer step is that step's release, not a second improvement."""
from __future__ import annotations

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig, IncidentConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, run_cross_levels


def _run(level_at, rule=True, windows=170):
    """Cross-node streams at latency x ``level_at(t)`` (1: baseline)."""
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False),
                                  incidents=IncidentConfig(softer_release=rule)))
    out = run_cross_levels(det, level_at, windows)
    return det, [(c.kind, (c.evidence or {}).get("step"), round(c.detected_s - EPOCH, 1)) for c in out]


def _draining_release(t):
    """3x from window 100; released at 130, the queue draining at 1.5x (0.37 of the log shift,
    above ``recovery_fraction``) for 5 windows, then back at 1x."""
    if 100 <= t < 130:
        return 3.0
    return 1.5 if 130 <= t < 135 else 1.0


def _eased_then_released(t):
    """3x from window 100, eased to 1.5x at 130, released 15 windows later (two labelled changes)."""
    if 100 <= t < 130:
        return 3.0
    return 1.5 if 130 <= t < 145 else 1.0


def test_a_release_reported_as_a_softer_step_is_not_reported_again():
    """Before the rule the descent's end was a recovery of its own, 1-5 s after the softer step."""
    det, out = _run(_draining_release)
    assert [k for k, _, _ in out] == ["bandwidth", "bandwidth"], out
    assert out[1][1] == "softer"
    assert det.fusion.counters["softer_releases"] == 1
    assert not det.fusion.active                     # the incident is closed all the same


def test_the_rule_off_reports_the_recovery_as_well():
    _, out = _run(_draining_release, rule=False)
    assert [k for k, _, _ in out] == ["bandwidth", "bandwidth", "recovery"], out


def test_a_release_well_after_a_softer_step_is_a_change_of_its_own():
    det, out = _run(_eased_then_released)
    assert [k for k, _, _ in out] == ["bandwidth", "bandwidth", "recovery"], out
    assert det.fusion.counters["softer_releases"] == 0
