"""Issue 22: a retuner's config switch is a known intervention, not a regime change. Streams are
re-baselined when their records' ``tuner_config_version`` changes, and a version seen before
gets its own baseline back at once (a revert leaves no warm-up blind spot)."""
from __future__ import annotations

from dynamiccl.detector.config import DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.detector.testing import Regime, SyntheticJob, bandwidth_regime


def _run(det, job, ts, regime=None):
    out = []
    for t in ts:
        out += det.process(job.window(t, regime))
    return out


def test_config_switch_and_revert_are_not_changes_and_leave_no_blind_spot():
    job = SyntheticJob(seed=3)
    det = Detector(DetectorConfig(autoencoder=False))
    n = len(job.streams)
    assert _run(det, job, range(80)) == []
    # the retuner's new config is 30 % slower on the large cross-node streams
    switched = Regime(mult={i: 1.3 for i in job.large()}, version={i: 1 for i in range(n)})
    assert _run(det, job, range(80, 100), switched) == [], "a config switch reported as a regime change"
    reverted = _run(det, job, range(100, 105))
    assert reverted == [], "the revert reported as a regime change"
    # version 0's baseline came back at once: a real bandwidth loss right after is detected
    late = _run(det, job, range(105, 112), bandwidth_regime(job, 2.0))
    assert [c.kind for c in late if c.kind != "recovery"], "blind after the revert"


def test_same_version_slowdown_is_still_a_change():
    job = SyntheticJob(seed=4)
    det = Detector(DetectorConfig(autoencoder=False))
    assert _run(det, job, range(80)) == []
    slow = Regime(mult={i: 1.3 for i in job.large()})
    assert _run(det, job, range(80, 90), slow), "a slowdown without a config switch went unreported"
