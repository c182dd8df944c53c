"""The recovery rule judges a run of windows on the old side by its mean position."""
from __future__ import annotations

import math

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

SLOW, ON, OFF = 2.0, 100, 130
# the shift's position per window after the release (0 old level, 1 degraded): a queue drain
# leaves the first window 0.4 of the way, then a one-window 0.45 hiccup
AFTER = [0.4, 0.0, 0.45, 0.0, 0.0, 0.0, 0.0, 0.0]


def _run(after):
    job = SyntheticJob(seed=3, sigma=0.01)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    cross = [i for i, s in enumerate(job.streams) if s.nnodes > 1]
    out = []
    for t in range(OFF + len(after) + 10):
        if ON <= t < OFF:
            pos = 1.0
        elif OFF <= t < OFF + len(after):
            pos = after[t - OFF]
        else:
            pos = 0.0
        mult = math.exp(pos * math.log(SLOW))
        out += det.process(job.window(t, Regime(mult={i: mult for i in cross} if pos else {})))
    return out


def test_recovery_after_a_noisy_release_window():
    """A first window 0.4 of the way back and a second at the old level are a recovery (their
    mean 0.2 <= recovery_fraction 0.3). Judging each window alone restarted the count at the
    0.4 window and again at the 0.45 one: recovery 5 windows after the release."""
    out = _run(AFTER)
    deg = [c for c in out if c.kind != "recovery"]
    rec = [c for c in out if c.kind == "recovery"]
    assert deg and rec, out
    delay = rec[0].detected_s - (EPOCH + OFF)
    assert delay <= 2.0, [(c.kind, c.detected_s - EPOCH) for c in out]


def test_no_recovery_while_windows_stay_midway():
    """Windows 0.45 of the way back, on the old side but not within the fraction on average,
    are no recovery."""
    out = _run([0.45] * 8)
    rec = [c for c in out if c.kind == "recovery"]
    assert rec and rec[0].detected_s - (EPOCH + OFF) >= 8.0, [(c.kind, c.detected_s - EPOCH) for c in out]
