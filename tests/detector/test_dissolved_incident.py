"""An incident whose streams all leave it (re-baselined for a workload or rank-set change) ends:
its gauges go back to 0 and the retuner gets its end (`Tracking._track`); before, the change
stayed active in Prometheus (and its alert firing) for the rest of the job."""
from __future__ import annotations

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import Regime, SyntheticJob

WARM = 70


def _active_sum(det) -> float:
    return sum(s.value for m in det.metrics.registry.collect() if m.name == "dynamiccl_detector_regime_active"
               for s in m.samples)


def test_an_incident_whose_streams_are_all_rebaselined_ends():
    job = SyntheticJob(seed=4)
    mine = [i for i, s in enumerate(job.streams) if 5 in [r for r, _ in s.ranks]]
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    out, ended, active_before = [], [], None
    for t in range(WARM + 20):
        slow = {i: 2.0 for i in mine} if t >= WARM else {}
        # 8 windows after the slowdown, the slowed streams' message sizes change: a new workload
        resized = {i: 1.5 for i in mine} if t >= WARM + 8 else {}
        out += det.process(job.window(t, Regime(mult=slow, size_mult=resized)))
        ended += det.ended
        if t == WARM + 7:
            active_before = _active_sum(det)
    first = [c for c in out if c.kind != "recovery"]
    assert first, out
    assert active_before and active_before > 0
    assert det.fusion.counters["incidents_dissolved"] >= 1
    assert any(first[0].id in e.ends for e in ended), ended
    assert not det.fusion.active and _active_sum(det) == 0.0


def test_an_incident_dropped_over_the_per_job_bound_ends(monkeypatch):
    """Over `MAX_INCIDENTS_PER_JOB` open incidents the oldest is dropped: it ends as well."""
    import dynamiccl.detector.fusion as fusion
    monkeypatch.setattr(fusion, "MAX_INCIDENTS_PER_JOB", 1)
    job = SyntheticJob(seed=4)
    tp0 = [i for i, s in enumerate(job.streams) if s.comm == "tp0"]
    mine = [i for i, s in enumerate(job.streams) if 5 in [r for r, _ in s.ranks] and s.comm != "tp0"]
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    out, ended = [], []
    for t in range(WARM + 60):
        mult = {i: 2.0 for i in tp0} if t >= WARM else {}
        if t >= WARM + 40:
            mult.update({i: 3.0 for i in mine})
        out += det.process(job.window(t, Regime(mult=mult)))
        ended += det.ended
    first = [c for c in out if c.kind != "recovery"]
    assert len(first) >= 2, [(c.kind, c.comms) for c in out]
    assert det.fusion.counters["incidents_dropped"] >= 1
    assert any(first[0].id in e.ends for e in ended), ended


def test_a_job_that_stops_during_its_change_ends_it_when_its_streams_are_forgotten():
    """Job a slows down (reported), then stops sending while job b goes on. Once a's streams are
    forgotten (unseen for ``streams.idle_s``), the change ends: before, it stayed active (and its
    alert firing) for as long as the detector ran, and its freed slots, taken by new streams, were
    still counted in it."""
    import polars as pl

    from dynamiccl.collector.features import WindowFeatures

    a, b = SyntheticJob(seed=4, job_id="a"), SyntheticJob(seed=5, job_id="b")
    mine = [i for i, s in enumerate(a.streams) if 5 in [r for r, _ in s.ranks]]
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)).with_overrides({"streams.idle_s": 10.0})
    det = Detector(cfg)
    stop = WARM + 8
    out, ended, active_at_stop = [], [], None
    for t in range(stop + 100):
        wb = b.window(t)
        if t < stop:
            wa = a.window(t, Regime(mult={i: 2.0 for i in mine}) if t >= WARM else None)
            wb = WindowFeatures(wb.window_start, wb.window_s, pl.concat([wa.keys, wb.keys]),
                                pl.concat([wa.ranks, wb.ranks]))
        out += det.process(wb)
        ended += det.ended
        if t == stop:
            active_at_stop = _active_sum(det)
    first = [c for c in out if c.job_id == "a" and c.kind != "recovery"]
    assert first, out
    assert active_at_stop and active_at_stop > 0
    assert any(first[0].id in e.ends for e in ended), ended
    assert "a" not in det.fusion.active and _active_sum(det) == 0.0
