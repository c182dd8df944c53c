"""An improvement no open degradation explains becomes the baseline
(`dynamiccl.detector.adopt_improvement`): the job slowing again is a degradation, not a recovery."""
from __future__ import annotations

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

WARM = 70
FAST_AT, SLOW_AT = WARM + 10, WARM + 30


def _run(adopt: bool = True):
    """Rank 5's streams run 2x slow from the start (their baseline is learnt slow), are released
    at FAST_AT and throttled again at SLOW_AT."""
    job = SyntheticJob(seed=4)
    slow = {i: 2.0 for i, s in enumerate(job.streams) if 5 in [r for r, _ in s.ranks]}
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)).with_overrides(
        {"incidents.adopt_improvement": adopt})
    det = Detector(cfg)
    out, ended = [], []
    for t in range(SLOW_AT + 12):
        fast = FAST_AT <= t < SLOW_AT
        out += det.process(job.window(t, None if fast else Regime(mult=slow)))
        ended += det.ended           # (handed out per window)
    return det, out, ended


def test_the_slowdown_after_an_adopted_improvement_is_a_degradation():
    det, out, ended = _run()
    first = [c for c in out if c.detected_s > EPOCH + FAST_AT]
    assert first and first[0].kind != "recovery" and first[0].magnitude < 0.7, out
    assert first[0].detected_s - (EPOCH + FAST_AT) <= 3.0
    again = [c for c in first[1:] if c.detected_s > EPOCH + SLOW_AT]
    assert again, out
    assert again[0].kind != "recovery" and again[0].magnitude > 1.5, again
    assert again[0].detected_s - (EPOCH + SLOW_AT) <= 3.0
    assert det.fusion.counters["improvements_adopted"] == 1
    # the improvement is over for the gauges and the retuner (a TransientEnd), not left open
    assert [e.ends for e in ended] == [(first[0].id,)]


def test_kept_open_the_slowdown_reads_as_a_recovery():
    """The defect the rule removes: with it off, the slowdown is the improvement's `recovery`."""
    _, out, _ = _run(adopt=False)
    again = [c for c in out if c.detected_s > EPOCH + SLOW_AT]
    assert again and again[0].kind == "recovery", out
