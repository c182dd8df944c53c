"""Deeper steps seen by an incident's own tracking (`Tracking._deeper`)."""
from __future__ import annotations

import math

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, run_cross_levels

ON, OFF = 100, 140


def _run(level_at):
    """Cross-node streams at latency x ``level_at(t)`` (1: baseline)."""
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    return det, run_cross_levels(det, level_at, OFF + 10)


def test_throttle_that_deepens_is_a_step():
    """1.5x at window 100, 2.5x at 115: the deeper step is a change of its own within 3 windows;
    before, the incident's streams were re-learning (a 60-window warm-up) and it was absorbed."""
    det, out = _run(lambda t: 1.0 if t < ON or t >= OFF else (1.5 if t < 115 else 2.5))
    steps = [c for c in out if c.evidence.get("step") == "deeper"]
    assert steps, [(c.kind, c.detected_s - EPOCH, c.evidence.get("step")) for c in out]
    assert 0 < steps[0].detected_s - (EPOCH + 115) <= 3.0
    assert steps[0].evidence["follows"] == [c for c in out if c.kind != "recovery"][0].id
    assert det.fusion.counters["level_steps"] >= 1


def test_ramp_is_no_step():
    """A slowdown ramping to 2.5x over 4 windows (a degrading NIC) is one change: what follows
    within ``merge_s`` of its detection, or keeps moving every window, is no step."""
    def ramp(t):
        if t < ON or t >= OFF:
            return 1.0
        return math.exp(min((t - ON + 1) / 4.0, 1.0) * math.log(2.5))
    _, out = _run(ramp)
    assert not [c for c in out if c.evidence.get("step")], [(c.kind, c.detected_s - EPOCH) for c in out]
    assert [c.kind for c in out if c.kind == "recovery"]


def test_throttle_that_eases_is_a_softer_step():
    """2.5x at window 100, eased to 1.5x at 115 (a softer throttle, still degraded): a softer
    step within 3 windows, and the release at 140 still a recovery. Before, the windows between
    the two levels were neither on nor recovered and the easing went unreported."""
    det, out = _run(lambda t: 1.0 if t < ON or t >= OFF else (2.5 if t < 115 else 1.5))
    softer = [c for c in out if c.evidence.get("step") == "softer"]
    assert softer, [(c.kind, c.detected_s - EPOCH, c.evidence.get("step")) for c in out]
    assert 0 < softer[0].detected_s - (EPOCH + 115) <= 3.0
    assert softer[0].magnitude < 1.0
    rec = [c for c in out if c.kind == "recovery"]
    assert rec and 0 < rec[0].detected_s - (EPOCH + OFF) <= 3.0


def test_noisy_degraded_level_is_no_softer_step():
    """A steady 2.5x throttle with the job's noise: no step either way until its release."""
    det, out = _run(lambda t: 1.0 if t < ON or t >= OFF else 2.5)
    assert not [c for c in out if c.evidence.get("step")], [(c.kind, c.detected_s - EPOCH) for c in out]


def test_change_after_a_short_excursion_is_a_step():
    """A 1.6x excursion at 100-101 opens an incident, the windows are back at 102, a 3x throttle
    starts at 103: the throttle is a deeper step within 3 windows. Before, the `merge_s` guard
    (the onset unfolding) held for 5 s after the report while the tracked level chased the
    throttle, and it was never reported (test-bed dev seeds 20 and 28)."""
    def level(t):
        if t < ON or t >= OFF:
            return 1.0
        return 1.6 if t < ON + 2 else (1.0 if t == ON + 2 else 3.0)
    _, out = _run(level)
    first = [c for c in out if c.kind != "recovery"]
    assert first and first[0].detected_s - EPOCH <= ON + 2, [(c.kind, c.detected_s - EPOCH) for c in out]
    steps = [c for c in out if c.evidence.get("step") == "deeper"]
    assert steps, [(c.kind, c.detected_s - EPOCH, c.evidence.get("step")) for c in out]
    assert 0 < steps[0].detected_s - (EPOCH + ON + 3) <= 3.0


def test_release_that_drains_is_one_recovery():
    """A 2.5x throttle released at window 140, the latency draining back over four windows (2.0,
    1.6, 1.3, 1.1x): one recovery and no softer step. A softer step is a plateau: while the
    streams still move back by a step a window it is a descent, and the recovery rule judges it
    (test-bed dev seed 34's release at 142.5 s: a softer step at 144.8 s, then its recovery)."""
    drain = {OFF + i: m for i, m in enumerate((2.0, 1.6, 1.3, 1.1))}
    _, out = _run(lambda t: 1.0 if t < ON else (2.5 if t < OFF else drain.get(t, 1.0)))
    seen = [(c.kind, c.detected_s - EPOCH, c.evidence.get("step")) for c in out]
    assert not [c for c in out if c.evidence.get("step")], seen
    rec = [c for c in out if c.kind == "recovery"]
    assert len(rec) == 1 and 0 < rec[0].detected_s - (EPOCH + OFF) <= 6.0, seen
