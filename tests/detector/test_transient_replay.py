"""A test-bed run's transient reaches the retuner in a replay exactly as in a live in-process loop over the
same windows, and never the change stream (dev half of the shipped corpus: seed 10, a 2 s excursion of every
stream at ~156 s that session 13b's rule closes as a transient)."""
from __future__ import annotations

import pytest

from dynamiccl.detector.config import DetectorConfig
from dynamiccl.detector.service import Detector

pytestmark = pytest.mark.slow


class _Recording:
    """The detector, keeping every window it is given (the live loop below gets the same ones)."""

    def __init__(self, det: Detector):
        self.det, self.windows = det, []

    def process(self, wf):
        self.windows.append(wf)
        return self.det.process(wf)

    @property
    def ended(self):
        return self.det.ended


def test_replay_and_live_hand_the_retuner_the_same_transient_ends(monkeypatch):
    """The replay's retuner and a live loop's (dry run) take each target out of the ended regime at the
    transient's end (a dry run reverts silently: nothing was applied), and decide alike."""
    from dynamiccl.harness import corpus
    from dynamiccl.loop import Loop
    from dynamiccl.report import replay as replay_mod
    from dynamiccl.retuner.agent import Retuner
    from dynamiccl.retuner.config import RetunerConfig

    kept = []
    monkeypatch.setattr(replay_mod, "make_retuner", lambda path: kept.append(Retuner(RetunerConfig(dry_run=True)))
                        or kept[-1])
    runs = dict(corpus.load_runs(half="dev"))
    cfg = DetectorConfig()
    rec = _Recording(Detector(cfg))
    rep = replay_mod.replay(str(runs[10] / "records"), cfg, retuner=True, detector=rec)

    live_rt, live, ended, in_regime = Retuner(RetunerConfig(dry_run=True)), [], [], []
    loop = Loop(Detector(cfg), live_rt, sinks=[live.append])
    for wf in rec.windows:
        before = {ts.regime for ts in live_rt.targets.values()}
        step = loop.step(wf)
        for te in step.ended:
            in_regime.append(bool(before & set(te.ends)))
        ended += step.ended

    assert ended and loop.transient_ends == len(ended) and any(in_regime)
    key = lambda c: (c.id, c.kind, c.start_s, c.detected_s)  # noqa: E731
    assert [key(c) for c in rep.changes] == [key(c) for c in live]
    gone = {i for te in ended for i in te.ends}
    assert not {te.id for te in ended} & {c.id for c in live} and not {c.recovers for c in live} & gone
    strip = lambda a: {k: v for k, v in a.items() if k != "ts"}  # noqa: E731
    assert [strip(a) for a in rep.decisions] == [strip(a) for a in live_rt.audit.recent]
    for rt in (kept[0], live_rt):
        assert {te.id for te in ended} <= set(rt.regimes)
        assert not {ts.regime for ts in rt.targets.values()} & gone
