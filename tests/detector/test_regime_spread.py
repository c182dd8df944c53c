"""Rule ``regime_spread`` (`dynamiccl.detector.regime_spread`): a deeper step is judged against
the noise of the degraded regime it leaves, not only the quiet old baseline's sigma."""
from __future__ import annotations

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig, IncidentConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, run_cross_levels


def _run(level_at, rule=True, windows=150):
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False),
                                  incidents=IncidentConfig(regime_spread=rule)))
    out = run_cross_levels(det, level_at, windows)
    return det, [(c.kind, (c.evidence or {}).get("step"), round(c.detected_s - EPOCH, 1)) for c in out]


def _noisy_throttle(t, deeper=None):
    """3x from window 100, swinging 2.6x / 3.4x window to window (a throttled link on a shared
    machine; the old baseline's sigma is 0.01); two windows at 3.6x / 3.7x at 124-125 (noise of
    that regime, 1.2x its median); ``deeper``: the level from window 130."""
    if t < 100:
        return 1.0
    if deeper is not None and t >= 130:
        return deeper * (0.87 if t % 2 else 1.13)
    if t in (124, 125):
        return 3.6 if t == 124 else 3.7
    return 2.6 if t % 2 else 3.4


def test_two_noisy_windows_in_a_noisy_regime_are_no_deeper_step():
    """Without the rule (old sigma only) the two windows were a deeper step at ~126."""
    det, out = _run(_noisy_throttle)
    assert [s for _, s, _ in out] == [None], out


def test_the_rule_off_reports_them_as_a_deeper_step():
    _, out = _run(_noisy_throttle, rule=False)
    assert "deeper" in [s for _, s, _ in out], out


def test_a_real_deeper_step_of_that_regime_is_still_reported():
    """6x (2x the regime's median, ~3.5 of its spreads) at 130: reported within 5 windows."""
    _, out = _run(lambda t: _noisy_throttle(t, deeper=6.0))
    assert [(s, 130 < t <= 135) for _, s, t in out] == [(None, False), ("deeper", True)], out
