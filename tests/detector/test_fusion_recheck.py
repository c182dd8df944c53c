"""`straggler_recheck`: a straggler named from the window holding its onset alone waits one window."""
from __future__ import annotations

from detector.config import DetectorConfig
from detector.service import Detector
from detector.testing import EPOCH, Regime, SyntheticJob

WARM = 70  # windows before any event (warm-up is 60)


def run(job, regimes, n, cfg):
    det = Detector(cfg)
    out = []
    for t in range(n):
        out += det.process(job.window(t, regimes(t)))
    return det, out


def _straggler(recheck: bool):
    job = SyntheticJob(seed=5)
    reg = Regime(straggler=6, straggler_delay_s=40e-6)        # global rank 6 = node-1, tp1 rank 2
    det, ch = run(job, lambda t: reg if WARM + 10 <= t < WARM + 30 else None, WARM + 50,
                  DetectorConfig(autoencoder=False, straggler_recheck=recheck))
    return det, ch[0]


def test_straggler_named_on_the_onset_window_waits_one_window():
    det_off, now = _straggler(False)
    det_on, later = _straggler(True)
    assert now.kind == later.kind == "straggler"
    assert now.hosts[0] == later.hosts[0] == "node-1"
    assert now.ranks == later.ranks and now.comms[0] == later.comms[0]
    assert now.start_s == later.start_s == EPOCH + WARM + 10
    # named from the onset's window alone without the recheck; one window later with it, on
    # both windows' instances
    assert now.detected_s == EPOCH + WARM + 11
    assert later.detected_s == now.detected_s + 1.0
    assert det_off.fusion.counters["rank_rechecks"] == 0
    assert det_on.fusion.counters["rank_rechecks"] == 1
    inst_now = now.evidence["stragglers"][0]["instances"]
    assert later.evidence["stragglers"][0]["instances"] > inst_now
