"""`onset_wait`: a change whose alarms come from a window holding its onset part-way through (both
regimes mixed: the p90 at the new level, the p50 barely moved) is judged on the next window."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig, FusionConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.simfeed import SimFeed
from dynamiccl.harness.simulator import scenario, workload


def _first_change(at_s: float, onset_wait: bool):
    """The simulator's 2-node `small` job loses 60 % of every uplink's bandwidth at ``at_s``."""
    sc = scenario.from_dict({"name": "drop", "duration_s": 32, "noise_sigma": 0.02, "events": [
        {"at_s": at_s, "kind": "bw_drop", "magnitude": 0.6, "nodes": "all"}]})
    wl = dataclasses.replace(workload.load("small"), step_gap_us=20_000)     # fewer records: a quick test
    feed = SimFeed(wl, sc, seed=0, duration_s=32, job_id="j")
    det = Detector(DetectorConfig(baseline=BaselineConfig(warmup=15), autoencoder=AutoencoderConfig(enabled=False),
                                  fusion=FusionConfig(onset_wait=onset_wait)))
    changes = [c for wf in feed.windows() for c in det.process(wf)]
    first = next(c for c in changes if c.kind != "recovery")
    return first, first.detected_s - feed.epoch_s, det.fusion.counters["onset_waits"]


@pytest.fixture(scope="module")
def boundary():
    """The same loss starting on a window's start: its first window is wholly the new regime."""
    return _first_change(25.0, True)


def test_a_mid_window_onset_is_judged_on_the_next_window(boundary):
    whole, _, _ = boundary
    mixed, t_off, n_off = _first_change(25.5, False)
    judged, t_on, n_on = _first_change(25.5, True)
    # without the wait: decided on the mixed window, its p50 a fraction of the way there
    assert t_off == 26.0 and n_off == 0
    assert mixed.magnitude < 1.2 < whole.magnitude
    # with it: one window later, with the magnitude (and kind) of a window wholly in the new regime
    assert t_on == 27.0 and n_on == 1
    assert judged.kind == whole.kind == "bandwidth"
    assert judged.magnitude == pytest.approx(whole.magnitude, rel=0.03)


def test_a_window_wholly_in_the_new_regime_is_judged_at_once(boundary):
    whole, t, n = boundary
    _, t_off, _ = _first_change(25.0, False)
    assert n == 0 and t == t_off and whole.kind == "bandwidth" and whole.magnitude > 1.5


def test_windows_without_p90_are_processed_and_never_seen_as_mixed():
    """``lat_p90_s`` is optional in a keys frame: without it no window is judged mixed."""
    from dynamiccl.harness.detector_testing import SyntheticJob
    job = SyntheticJob(seed=1)
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    for t in range(70):
        wf = job.window(t, None)
        det.process(dataclasses.replace(wf, keys=wf.keys.drop("lat_p90_s")))
    assert det.table.n_active > 0
    assert np.isnan(det.table.spread).all()
