"""The detector's and retuner's Prometheus exporters: the collector's label names, regime_active as 0/1 per
communicator with the magnitude in its own gauge, process metrics, no ``_created`` series."""
from __future__ import annotations

import urllib.request

from prometheus_client import CollectorRegistry, Gauge

from dynamiccl.collector.metrics import METRICS as COLLECTOR_METRICS
from dynamiccl.detector.events import RegimeChange
from dynamiccl.detector.metrics import METRICS as DETECTOR_METRICS, ActiveRegimes
from dynamiccl.detector.runner import DetectorService, ServiceConfig
from dynamiccl.detector.service import Detector
from dynamiccl.retuner.metrics import METRICS as RETUNER_METRICS

#: the collector's names; what other services must not call differently
OLD_NAMES = {"comm_name", "func"}


def test_one_set_of_label_names_across_services():
    collector_labels = {lab for m in COLLECTOR_METRICS for lab in m.labels}
    assert {"job_id", "comm", "collective", "size_bucket"} <= collector_labels
    for m in (*DETECTOR_METRICS, *RETUNER_METRICS):
        assert not set(m.labels) & OLD_NAMES, f"{m.name} uses {sorted(set(m.labels) & OLD_NAMES)}"
    by_name = {m.name: m.labels for m in (*DETECTOR_METRICS, *RETUNER_METRICS)}
    assert by_name["dynamiccl_detector_cusum_statistic"] == ("job_id", "comm", "collective", "size_bucket")
    assert by_name["dynamiccl_retuner_measured_gain_ratio"] == ("comm", "collective", "size_bucket")


def _gauges(reg):
    return (Gauge("a", "active", ("job_id", "kind", "comm", "where"), registry=reg),
            Gauge("m", "magnitude", ("job_id", "kind", "comm", "where"), registry=reg))


def test_active_regimes_are_0_1_per_label_set_and_bounded():
    reg = CollectorRegistry()
    act, mag = _gauges(reg)
    r = ActiveRegimes(act, mag, keep_recovered=2)
    dp0, tp0 = ("j", "bandwidth", "dp0", "h1"), ("j", "bandwidth", "tp0", "h1")
    lab = lambda t: dict(zip(("job_id", "kind", "comm", "where"), t))  # noqa: E731
    r.start("c1", [dp0, tp0], 2.5)
    r.start("c2", [dp0], 3.0)                  # a second change on dp0: newest magnitude
    assert reg.get_sample_value("a", lab(dp0)) == 1 and reg.get_sample_value("a", lab(tp0)) == 1
    assert reg.get_sample_value("m", lab(dp0)) == 3.0 and reg.get_sample_value("m", lab(tp0)) == 2.5
    r.end("c1")                                # dp0 still held by c2
    assert reg.get_sample_value("a", lab(dp0)) == 1 and reg.get_sample_value("a", lab(tp0)) == 0
    assert reg.get_sample_value("m", lab(tp0)) is None
    r.end("c2")
    assert reg.get_sample_value("a", lab(dp0)) == 0 and reg.get_sample_value("m", lab(dp0)) is None
    r.end("unknown")                           # a recovery of a change never seen: no error
    for i in range(5):                         # recovered series are bounded (keep_recovered=2)
        r.start(f"x{i}", [("j", "latency", f"c{i}", "all")], 1.5)
        r.end(f"x{i}")
    kept = [s for s in reg.collect() if s.name == "a"][0].samples
    assert len(kept) == 2 and {s.labels["comm"] for s in kept} == {"c3", "c4"}


def test_detector_exports_one_series_per_communicator():
    det = Detector()
    c = RegimeChange(id="rc-j-1", kind="bandwidth", job_id="j", start_s=1.0, detected_s=3.0, magnitude=2.0,
                     comm_names=["dp0", "tp0"], hosts=["n1"])
    det._publish(c)
    v = det.metrics.value
    for comm in ("dp0", "tp0"):
        labels = dict(job_id="j", kind="bandwidth", comm=comm, where="n1")
        assert v("dynamiccl_detector_regime_active", **labels) == 1
        assert v("dynamiccl_detector_regime_magnitude", **labels) == 2.0
    det._publish(RegimeChange(id="rc-j-2", kind="recovery", job_id="j", start_s=5.0, detected_s=6.0,
                              magnitude=1.0, recovers="rc-j-1"))
    assert det.metrics.registry.get_sample_value(
        "dynamiccl_detector_regime_active", dict(job_id="j", kind="bandwidth", comm="dp0", where="n1")) == 0
    assert det.metrics.registry.get_sample_value(
        "dynamiccl_detector_regime_magnitude", dict(job_id="j", kind="bandwidth", comm="dp0", where="n1")) is None


def _scrape(address: str) -> str:
    return urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()


def test_detector_endpoint_has_process_metrics_and_no_created_series():
    svc = DetectorService(ServiceConfig(features=None, serve=None, metrics="127.0.0.1:0")).start()
    try:
        body = _scrape(svc.addresses["metrics"])
    finally:
        svc.shutdown()
    assert "dynamiccl_detector_windows_received_total" in body
    assert "process_resident_memory_bytes" in body and "process_cpu_seconds_total" in body
    assert "_created" not in body


def test_retuner_endpoint_has_process_metrics_and_no_created_series(tmp_path):
    from dynamiccl.retuner.config import RetunerConfig
    from dynamiccl.retuner.service import RetunerService
    cfg = RetunerConfig(tuner_config_path=str(tmp_path / "tuner.conf"), audit_path=str(tmp_path / "audit.jsonl"),
                        changes=None, features=None, metrics="127.0.0.1:0")
    svc = RetunerService(cfg).start()
    try:
        body = _scrape(svc.metrics_address)
    finally:
        svc.stop()
    assert "dynamiccl_retuner_decisions_total" in body and "process_cpu_seconds_total" in body
    assert "_created" not in body


def test_process_metrics_on_a_registry_that_has_them_already():
    from prometheus_client import ProcessCollector

    from dynamiccl.detector.metrics import export_process_metrics
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    export_process_metrics(reg)                # no "Duplicated timeseries" error
    assert reg.get_sample_value("process_cpu_seconds_total") is not None
