"""Rule ``fusion.preconfirm`` (`dynamiccl.detector.preconfirm`): an alarm whose window and the
adjacent window before it are both >= confirm_z is evidence at once, not one window later."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from dynamiccl.detector.config import DetectorConfig, FusionConfig
from dynamiccl.detector.fusion_gates import AlarmGroup, FusionGates
from dynamiccl.detector.preconfirm import preconfirmed

H = 32          # the stream table's history (windows)
SIGMA = 0.1     # baseline scale (log)
T = 100         # the alarm window's bank step


def _cfg(rule=True) -> DetectorConfig:
    return DetectorConfig(fusion=FusionConfig(preconfirm=rule)).validate()


def _table(before_z: float, now_z: float = 9.0, *, gap: bool = False, n: int = 1) -> SimpleNamespace:
    hist = np.full((H, n), np.nan)
    hist[(T - 1) % H] = before_z * SIGMA
    hist[T % H] = now_z * SIGMA
    starts = np.full(H, np.nan)
    starts[(T - 1) % H] = 1000.0 - (2.0 if gap else 1.0)
    starts[T % H] = 1000.0
    return SimpleNamespace(hist=hist, window_starts=starts, instances=np.full(n, 4.0), instances_ref=np.full(n, 4.0),
                           gap_step=np.full(n, -10))


def _lone(start: int = T - 1) -> AlarmGroup:
    """One stream (a job's only one), 2.5x (big), not confirmed: the evidence gate held it a window."""
    return AlarmGroup("job", 1, np.array([0]), np.zeros(1), np.full(1, SIGMA), np.full(1, start),
                      np.full(1, np.log(2.5)), start, False, False)


def _call(tab, a, rule=True):
    return preconfirmed(_cfg(rule), tab, a.idx, a.med, a.scale, a.start, a.direction, T, 1.0)


def test_two_windows_beyond_the_bar_confirm_at_once():
    assert _call(_table(before_z=4.0), _lone())


def test_a_window_before_below_the_bar_or_outside_the_excursion_does_not():
    assert not _call(_table(before_z=2.0), _lone())               # the onset window barely moved
    assert not _call(_table(before_z=4.0), _lone(start=T))         # before the CUSUM's change start
    assert not _call(_table(before_z=4.0, now_z=2.0), _lone())     # the alarm window itself below
    assert not _call(_table(before_z=4.0, gap=True), _lone())      # not the adjacent window (a gap)
    assert not _call(_table(before_z=4.0), _lone(), rule=False)    # the rule off


def test_a_falling_alarm_is_judged_in_its_direction():
    a = _lone()
    a.direction = -1
    assert _call(_table(before_z=-4.0, now_z=-9.0), a)
    assert not _call(_table(before_z=4.0, now_z=-9.0), a)


def _fusion(rule: bool, before_z: float) -> SimpleNamespace:
    return SimpleNamespace(config=_cfg(rule), table=_table(before_z), pending=[], _window_s=1.0,
                           counters={"network_only": 0, "pending_dropped": 0, "preconfirmed": 0},
                           _network_only=lambda *a: False, _stragglers=lambda *a, **k: [], active={},
                           _recovering=lambda a: False)


def test_the_evidence_gate_passes_a_preconfirmed_lone_alarm():
    """Before the rule (off) a lone stream's big alarm waited for its next window (pending)."""
    off = _fusion(False, before_z=4.0)
    ok, _, big = FusionGates._gate_evidence(off, SimpleNamespace(t=T), _lone())
    assert big and not ok and len(off.pending) == 1
    on = _fusion(True, before_z=4.0)
    ok, _, _ = FusionGates._gate_evidence(on, SimpleNamespace(t=T), _lone())
    assert ok and not on.pending and on.counters["preconfirmed"] == 1
    held = _fusion(True, before_z=1.0)                              # no evidence yet: waits as before
    ok, _, _ = FusionGates._gate_evidence(held, SimpleNamespace(t=T), _lone())
    assert not ok and len(held.pending) == 1


def _one_stream_job(rule: bool, mults: dict[int, float], seed: int = 3) -> list:
    """A job with one stream (dp0, 16 MiB, 5 % noise): corroboration by a second stream is impossible."""
    from dynamiccl.detector.config import AutoencoderConfig
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob
    job = SyntheticJob(seed=seed, sigma=0.05)
    job.streams = [s for s in job.streams if s.comm == "dp0" and s.nbytes == 16 << 20]
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False), fusion=FusionConfig(preconfirm=rule)))
    out = []
    for t in range(130):
        m = mults.get(t, 1.0)
        out += [(c.kind, round(c.detected_s - EPOCH, 1)) for c in det.process(job.window(t, Regime(mult={0: m}) if m != 1 else None))]
    return out


def test_a_lone_stream_step_is_reported_one_window_earlier():
    """1.25x in the onset's window (z 4.5, the CUSUM does not fire), 1.4x from the next: before (rule
    off) the alarm at window 101 waited for window 102 (reported at 103); with it, at 102."""
    step = {t: 1.25 if t == 100 else 1.4 for t in range(100, 130)}
    assert _one_stream_job(False, step) == [("bandwidth", 103.0)]
    assert _one_stream_job(True, step) == [("bandwidth", 102.0)]


def test_a_one_window_spike_is_still_not_reported():
    for seed in (3, 4, 5):
        assert _one_stream_job(True, {100: 1.4}, seed) == []
        assert _one_stream_job(True, {}, seed) == []


def test_a_two_window_excursion_is_a_change_whichever_window_fires():
    """What the rule changes: two successive windows beyond the bar are reported whether the CUSUM
    fired on the first (as before) or only on the second (before: its confirmation window was back
    at the baseline and the alarm was suppressed)."""
    assert _one_stream_job(False, {100: 1.4, 101: 1.4}) == [("bandwidth", 102.0)]
    assert _one_stream_job(False, {100: 1.25, 101: 1.4}) == []
    assert _one_stream_job(True, {100: 1.25, 101: 1.4}) == [("bandwidth", 102.0)]
