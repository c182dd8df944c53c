"""Gate ``post_recovery_hold`` (`dynamiccl.detector.post_recovery`): a degradation within
``flap_window_s`` of the job's recovery needs one more confirming window."""
from __future__ import annotations

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig, IncidentConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, run_cross_levels

RELEASE = 130


def _run(level_at, hold=True):
    """Cross-node streams at latency x ``level_at(t)`` (1: baseline)."""
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False),
                                  incidents=IncidentConfig(post_recovery_hold=hold)))
    out = run_cross_levels(det, level_at, 175)
    return det, [(c.kind, round(c.detected_s - EPOCH, 1)) for c in out]


def _levels(after: float, start: int, end: int):
    """3x from window 100, released at 130; then ``after`` x over windows [start, end)."""
    def level(t):
        if 100 <= t < RELEASE:
            return 3.0
        return after if start <= t < end else 1.0
    return level


def _after_release(out):
    return [(k, t) for k, t in out if k != "recovery" and t > RELEASE]


def test_a_short_excursion_after_a_recovery_is_no_change():
    """2x (beyond the recovered band) for two windows, 6 windows after the release (the dev half's
    re-excursions are back 1-4 windows after their report): confirmed once, not twice."""
    det, out = _run(_levels(2.0, RELEASE + 6, RELEASE + 8))
    assert [k for k, _ in out] == ["bandwidth", "recovery"], out
    assert det.fusion.counters["post_recovery_holds"] >= 1


def test_the_short_excursion_is_a_change_without_the_hold():
    """The case above with the gate off: the excursion is reported (what the gate removes)."""
    _, out = _run(_levels(2.0, RELEASE + 6, RELEASE + 8), hold=False)
    assert len(_after_release(out)) == 1, out


def test_a_lasting_step_at_the_same_time_is_reported_one_window_later():
    """2x from 6 windows after the release, lasting: reported with the gate, one window after the
    gate-off report."""
    det, held = _run(_levels(2.0, RELEASE + 6, 170))
    _, plain = _run(_levels(2.0, RELEASE + 6, 170), hold=False)
    assert len(_after_release(held)) == 1 and len(_after_release(plain)) == 1, (held, plain)
    assert _after_release(held)[0][1] == _after_release(plain)[0][1] + 1.0
    assert det.fusion.counters["post_recovery_holds"] >= 1


def test_no_hold_past_the_span():
    """An excursion ``flap_window_s`` + 5 windows after the recovery is judged as before."""
    det, out = _run(_levels(2.0, RELEASE + 17, RELEASE + 19))
    assert det.fusion.counters["post_recovery_holds"] == 0
    _, plain = _run(_levels(2.0, RELEASE + 17, RELEASE + 19), hold=False)
    assert out == plain


def test_a_held_step_keeps_the_magnitude_it_would_have_had_at_once():
    """2x for two windows settling at 1.6x: judged on its farthest window since the alarm (2x),
    as without the gate; judged on the later window it took the lower level as its own."""
    def level(t):
        if 100 <= t < RELEASE:
            return 3.0
        if RELEASE + 6 <= t < RELEASE + 8:
            return 2.0
        return 1.6 if RELEASE + 8 <= t < 170 else 1.0

    def magnitudes(hold):
        det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False),
                                      incidents=IncidentConfig(post_recovery_hold=hold)))
        return [round(c.magnitude, 2) for c in run_cross_levels(det, level, 175)
                if c.kind != "recovery" and c.detected_s - EPOCH > RELEASE]

    held, plain = magnitudes(True), magnitudes(False)
    assert len(held) == 1 and held == plain, (held, plain)


PACED = 3   # a step-paced job: one window with data per 3 s step


def _paced(hold):
    """The job of `run_cross_levels` with data every ``PACED`` windows: 3x over steps 40-50, released,
    then 2x from step 53 on (6 s after the release), lasting."""
    import dataclasses

    from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
    from dynamiccl.harness.detector_testing import Regime, SyntheticJob
    job = SyntheticJob(seed=5, sigma=0.01)
    job.streams = [dataclasses.replace(s, per_window=2) for s in job.streams]
    cross = [i for i, s in enumerate(job.streams) if s.nnodes > 1]
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False),
                                  incidents=IncidentConfig(post_recovery_hold=hold)))
    out = []
    for t in range(70 * PACED):
        step = t // PACED
        m = 3.0 if 40 <= step < 50 else (2.0 if step >= 52 else 1.0)
        if t % PACED:
            wf = WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks())
        else:
            wf = job.window(t, Regime(mult={i: m for i in cross}) if m != 1.0 else None)
        out += det.process(wf)
    return det, [(c.kind, round(c.detected_s - EPOCH, 1)) for c in out]


def test_a_step_paced_job_is_not_held():
    """Its next window is its next step (3 s here, 2-10 s on the test bed): the step after a
    release is reported when it would be without the gate (before: one step later)."""
    det, held = _paced(True)
    _, plain = _paced(False)
    assert len([k for k, _ in plain if k != "recovery"]) == 2, plain
    assert held == plain and det.fusion.counters["post_recovery_holds"] == 0, (held, plain)
