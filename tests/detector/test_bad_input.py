"""Bad input is counted and skipped: never an exception, never a regime change by itself."""
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from dynamiccl.collector.features import WindowFeatures
from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig, IncidentConfig, StragglerConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import Regime, SyntheticJob

WARM = 70


def warm(seed=0, overrides=None):
    job = SyntheticJob(seed=seed)
    det = Detector(DetectorConfig().with_overrides({"autoencoder.enabled": False, **(overrides or {})}))
    for t in range(WARM):
        assert det.process(job.window(t)) == []
    return job, det


def with_lat(wf: WindowFeatures, values) -> WindowFeatures:
    keys = wf.keys.with_columns(pl.Series("lat_p50_s", values, dtype=pl.Float64))
    return dataclasses.replace(wf, keys=keys)


def test_garbage_values_are_counted_and_skipped():
    job, det = warm(1)
    m = det.metrics
    t = WARM
    for bad in (np.nan, -1e-3, 0.0, 1e300, None):
        wf = job.window(t)
        vals = wf.keys["lat_p50_s"].to_list()
        vals[::2] = [bad] * len(vals[::2])     # half the streams get garbage, every window
        assert det.process(with_lat(wf, vals)) == []
        t += 1
    assert m.value("dynamiccl_detector_values_invalid_total", reason="nan") == 16
    assert m.value("dynamiccl_detector_values_invalid_total", reason="nonpositive") == 16
    assert m.value("dynamiccl_detector_values_invalid_total", reason="absurd") == 8
    for k in range(30):                          # and the stream goes on normally
        assert det.process(job.window(t + k)) == []


def test_malformed_windows_are_dropped_not_raised():
    job, det = warm(2)
    wf = job.window(WARM)
    for bad in (None, "x", 42, dataclasses.replace(wf, keys=wf.keys.drop("lat_p50_s")),
                dataclasses.replace(wf, window_start=float("nan")),
                dataclasses.replace(wf, keys=pl.DataFrame({"job_id": [1]}))):
        assert det.process(bad) == []
    assert det.metrics.value("dynamiccl_detector_windows_dropped_total", reason="malformed") == 6
    assert det.process(job.window(WARM)) == []


def test_out_of_order_and_clock_jumps():
    job, det = warm(3)
    m = det.metrics
    assert det.process(job.window(WARM - 5)) == []          # an old window: dropped
    assert m.value("dynamiccl_detector_windows_dropped_total", reason="out_of_order") == 1
    # a forward jump of an hour (a gap) and on: nothing happens
    for t in range(WARM + 3600, WARM + 3640):
        assert det.process(job.window(t)) == []
    # the clock goes back for good: after a few dropped windows the new timeline is accepted
    out = []
    for t in range(100, 200):
        out += det.process(job.window(t))
    assert out == []
    assert 0 < m.value("dynamiccl_detector_windows_dropped_total", reason="out_of_order") <= 31


def test_vanishing_rank_is_not_a_change():
    job, det = warm(4)
    gone = Regime(missing_ranks=(5,))
    out = []
    for t in range(WARM, WARM + 120):
        out += det.process(job.window(t, gone))
    assert out == []
    assert det.metrics.value("dynamiccl_detector_rank_set_kept_total") > 0


def test_internal_error_is_contained(monkeypatch):
    job, det = warm(5)

    def boom(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(det.table, "update", boom)
    assert det.process(job.window(WARM)) == []
    assert det.metrics.value("dynamiccl_detector_windows_dropped_total", reason="error") == 1


def test_config_validation_names_the_field():
    import pytest
    with pytest.raises(ValueError, match="baseline.warmup"):
        DetectorConfig(baseline=BaselineConfig(warmup=0)).validate()
    with pytest.raises(ValueError, match="incidents.recovery_fraction"):
        DetectorConfig(incidents=IncidentConfig(recovery_fraction=1.5)).validate()
    # switches must be booleans ("yes" or 1 from a YAML/--set typo is not silently truthy)
    with pytest.raises(ValueError, match="straggler.recheck must be true or false"):
        DetectorConfig(straggler=StragglerConfig(recheck="yes")).validate()
    with pytest.raises(ValueError, match="autoencoder.enabled"):
        DetectorConfig(autoencoder=AutoencoderConfig(enabled=1)).validate()


def test_pending_alarm_on_a_stream_rebased_next_window():
    """A lone alarm waits for confirmation; if its stream is re-baselined meanwhile (a new size
    mix), nothing breaks (regression: a pending entry kept stale arrays)."""
    job, det = warm(6, {"fusion.quiet_z": 0.0})     # (quiet_z=0: the intra-node streams cannot vouch for it)
    small = Regime(mult={i: 1.12 for i in (2, 3, 4, 5)})   # +12 %: must persist one more window
    assert det.process(job.window(WARM, small)) == []
    assert det.fusion.pending and det.fusion.pending[0].idx.size >= 2
    # next window: all but stream 5 get a new size mix (re-baselined while pending)
    det.process(job.window(WARM + 1, Regime(mult={5: 1.12}, size_mult={2: 1.5, 3: 1.5, 4: 1.5})))
    for t in range(WARM + 2, WARM + 10):
        det.process(job.window(t, small))
    assert det.metrics.value("dynamiccl_detector_windows_dropped_total", reason="error") == 0
