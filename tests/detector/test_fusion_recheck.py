"""`straggler_recheck`: a straggler named on few instances from the window holding its onset alone
waits one window and is named on both."""
from __future__ import annotations

import dataclasses

import pytest

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig, StragglerConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

WARM = 70  # windows before any event (warm-up is 60)


def _straggler(recheck: bool, per_window: int | None, window_s: float = 1.0):
    job = SyntheticJob(seed=5, window_s=window_s)
    if per_window is not None:   # few instances per window, as on the test bed (4 per communicator)
        job.streams = [dataclasses.replace(s, per_window=per_window) for s in job.streams]
    reg = Regime(straggler=6, straggler_delay_s=40e-6)        # global rank 6 = node-1, tp1 rank 2
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False),
                                  straggler=StragglerConfig(recheck=recheck)))
    ch = []
    for t in range(WARM + 40):
        ch += det.process(job.window(t, reg if WARM + 10 <= t < WARM + 30 else None))
    st = ch[0]
    assert st.kind == "straggler" and st.hosts[0] == "node-1"
    assert st.start_s == pytest.approx(EPOCH + (WARM + 10) * window_s)
    # the first communicator listed, and the rank in it, are global rank 6's
    assert st.ranks[0] == {"0x101": 2, "0x202": 1, "0x300": 6}[st.comms[0]]
    return det.fusion.counters["rank_rechecks"], st


def test_straggler_named_on_few_instances_of_the_onset_window_waits_one_window():
    n_off, now = _straggler(False, 2)
    n_on, later = _straggler(True, 2)
    # without the recheck: named from the onset's window alone, on its few instances
    assert now.detected_s == EPOCH + WARM + 11 and n_off == 0
    assert now.evidence["stragglers"][0]["instances"] < 6
    # with it: one window later, on both windows' instances
    assert later.detected_s == now.detected_s + 1.0 and n_on == 1
    assert later.evidence["stragglers"][0]["instances"] > now.evidence["stragglers"][0]["instances"]


@pytest.mark.parametrize("recheck", [False, True])
def test_no_recheck_when_the_onset_window_has_enough_instances(recheck):
    n, st = _straggler(recheck, None)      # hundreds of instances per window
    assert st.detected_s == EPOCH + WARM + 11 and n == 0


def test_recheck_when_collectives_are_long_against_the_window():
    """2 ms windows: the alarmed DP all-reduces take 23-90 µs, up to 4.5 % of one (>= 2 %), so
    even hundreds of instances in the onset's window do not name the rank alone."""
    n_off, now = _straggler(False, None, 0.002)
    n_on, later = _straggler(True, None, 0.002)
    assert (n_off, n_on) == (0, 1)
    assert later.detected_s == pytest.approx(now.detected_s + 0.002)


PACED = 3          # a step-paced job: one window with data per 3 s step


def _paced_straggler():
    job = SyntheticJob(seed=5)
    job.streams = [dataclasses.replace(s, per_window=2) for s in job.streams]
    reg = Regime(straggler=6, straggler_delay_s=40e-6)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
    ch, onset = [], (WARM + 10) * PACED
    for t in range((WARM + 30) * PACED):
        if t % PACED:
            wf = WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks())
        else:
            wf = job.window(t, reg if onset <= t < (WARM + 25) * PACED else None)
        ch += det.process(wf)
    return det, ch, onset


def test_step_paced_job_is_not_held_a_step_for_its_kind():
    """The recheck judges the kind again on the next window; in a step-paced job that is the next
    step (3 s here, 2-10 s on the test bed), past a 5 s report. The change that passed the
    evidence gate is reported from the onset's window (before: one step later, `rank_rechecks`)."""
    det, ch, onset = _paced_straggler()
    assert ch, det.fusion.counters
    first = ch[0]
    assert first.detected_s == EPOCH + onset + 1, ((first.detected_s - EPOCH - onset), det.fusion.counters)
    assert det.fusion.counters["paced_kind_now"] == 1 and det.fusion.counters["rank_rechecks"] == 0
