"""Rule ``baseline.trim_warmup`` (`dynamiccl.detector.warmup_trim`): at a recovery, the
communicator's streams still in their warm-up forget the samples they took during the incident."""
from __future__ import annotations

import math

from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import Regime, SyntheticJob

NOISY = 2      # dp0 64 KiB: a noisy stream (1x / 2.5x alternating) the early chart cannot judge
QUIET = (3, 4)  # dp0 1 MiB and 16 MiB: quiet streams of the same communicator


def _run(trim: bool):
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False),
                                  baseline=BaselineConfig(trim_warmup=trim)))
    job = SyntheticJob(seed=3, sigma=0.01)
    assert job.streams[NOISY].comm == job.streams[QUIET[0]].comm == "dp0"
    out = []
    for t in range(110):
        mult = {NOISY: 2.5 if t % 2 else 1.0}
        if 20 <= t < 40:     # a 4x throttle of dp0 during the first warm-up
            mult = {NOISY: 4.0 * mult[NOISY], QUIET[0]: 4.0, QUIET[1]: 4.0}
        out += det.process(job.window(t, Regime(mult=mult)))
    tab = det.table
    slot = next(i for i in range(tab.n) if tab.comm_hash[i] == 0x200 and tab.size_bucket[i] == 16)
    med, scale = (float(a[slot]) for a in tab.banks[0].baseline)
    return det, [c.kind for c in out], math.exp(med) / job.streams[NOISY].base_s, scale


def test_a_warming_stream_forgets_the_incident_windows_at_the_recovery():
    """Before the rule the noisy stream's baseline held the throttle's 20 windows (level 2.5x,
    scale 0.81); now it is learnt from its clean windows: level sqrt(2.5) = 1.58x, scale
    log(2.5) / 2 = 0.46."""
    det, kinds, ratio, scale = _run(trim=True)
    assert kinds == ["bandwidth", "recovery"], kinds
    assert det.fusion.counters["warmups_trimmed"] == 1
    assert ratio < 1.8 and scale < 0.55, (ratio, scale)


def test_with_the_rule_off_the_baseline_holds_the_throttle():
    det, _, ratio, scale = _run(trim=False)
    assert det.fusion.counters["warmups_trimmed"] == 0
    assert ratio > 2.2 and scale > 0.7, (ratio, scale)
