"""Known limitation of `CUSUM` (documented in docs/evaluation/2026-11-27-cusum-public.md, Session
13): a warm-up that itself contains a level change freezes a threshold hundreds of sigma high,
and the chart reports nothing for the rest of the stream."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.detector import CUSUM


def _stream():
    """+10 sigma at 300 back at 330 (inside the warm-up after the first alarm), +5 sigma for
    200 samples at 1000."""
    rng = np.random.default_rng(3)
    level = np.zeros(2000)
    level[300:330] = 10.0
    level[1000:1200] = 5.0
    return 100.0 + level + rng.standard_normal(level.size)


def _alarm_starts(xs):
    det, out = CUSUM(), []
    for x in xs:
        det.update(float(x))
        if det.drift_detected:
            out.append(det.change_start)
    return out, det


def test_first_step_reported_then_threshold_frozen_high():
    """What holds today: the first step is found at its start; the contaminated warm-up's
    threshold is far above the clean one (4.72 at the defaults)."""
    starts, det = _alarm_starts(_stream())
    assert starts[0] == 300
    assert det.threshold > 100.0


@pytest.mark.xfail(strict=True, reason="contaminated warm-up: threshold frozen ~650 sigma high")
def test_steps_after_a_contaminated_warmup_reported():
    starts, _ = _alarm_starts(_stream())
    assert any(abs(s - 1000) <= 5 for s in starts) and any(abs(s - 1200) <= 5 for s in starts)
