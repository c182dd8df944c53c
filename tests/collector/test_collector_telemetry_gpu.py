"""GPU telemetry (dynamiccl/collector/telemetry/gpu.py) through a pynvml stand-in, and without a driver."""
from __future__ import annotations

import logging
import sys
import time
import urllib.request

import pytest

from dynamiccl.collector.config import TelemetryConfig, default_config
from dynamiccl.collector.metrics import BY_NAME
from dynamiccl.collector.telemetry import gpu as gpu_mod
from dynamiccl.collector.telemetry.fake_nvml import FakeNvml
from dynamiccl.collector.telemetry.gpu import GpuTelemetry


def _samples(t: GpuTelemetry) -> dict[str, list]:
    # prometheus-client drops "_total" from a counter family's name (its samples keep it)
    return {f.name + ("_total" if f.type == "counter" else ""): [(s.name, s.labels, s.value) for s in f.samples]
            for f in t.collect()}


def test_values_units_and_labels():
    nv = FakeNvml(gpus=2)
    t = GpuTelemetry(TelemetryConfig(interval_s=60), nvml=nv, host="node-a")
    t.start()
    try:
        s = _samples(t)
        assert set(s) == {n for n in BY_NAME if n.startswith("dynamiccl_gpu_")}
        assert s["dynamiccl_gpu_telemetry_up"] == [("dynamiccl_gpu_telemetry_up", {"host": "node-a"}, 1.0)]
        assert [v for *_, v in s["dynamiccl_gpu_sm_clock_hertz"]] == [1.98e9, 1.98e9]
        assert [v for *_, v in s["dynamiccl_gpu_power_watts"]] == [412.0, 412.0]
        assert [v for *_, v in s["dynamiccl_gpu_temperature_celsius"]] == [61.0, 61.0]
        pcie = s["dynamiccl_gpu_pcie_throughput_bytes_per_second"]
        assert {(lab["gpu"], lab["direction"]) for _, lab, _ in pcie} == {("0", "tx"), ("0", "rx"), ("1", "tx"),
                                                                          ("1", "rx")}
        assert all(v == 2_000_000 * 1024 for *_, v in pcie)
        info = s["dynamiccl_gpu_info"][0][1]
        assert info["name"] == "NVIDIA H100 80GB HBM3" and info["uuid"].startswith("GPU-")
        # counters: NVLink grows poll over poll; XID pre-initialised at 0
        before = s["dynamiccl_gpu_nvlink_bytes_total"][0][2]
        t.poll_once()
        assert _samples(t)["dynamiccl_gpu_nvlink_bytes_total"][0][2] - before == 50_000_000 * 1024
        assert [v for *_, v in s["dynamiccl_gpu_xid_errors_total"]] == [0, 0]
    finally:
        t.shutdown()


def test_xid_event_is_counted_with_its_code():
    nv = FakeNvml(gpus=2)
    t = GpuTelemetry(TelemetryConfig(interval_s=60), nvml=nv, host="h")
    t.start()
    try:
        nv.xids.put((1, 79))                       # XID 79: GPU fell off the bus
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
                v for _, lab, v in _samples(t)["dynamiccl_gpu_xid_errors_total"] if lab["gpu"] == "1"):
            time.sleep(0.05)
        s = _samples(t)
        assert [(lab["gpu"], v) for _, lab, v in s["dynamiccl_gpu_xid_errors_total"]] == [("0", 0), ("1", 1)]
        assert [(lab["gpu"], v) for _, lab, v in s["dynamiccl_gpu_last_xid"]] == [("0", 0.0), ("1", 79.0)]
    finally:
        t.shutdown()


def test_unsupported_metric_is_skipped_not_counted_and_errors_are_counted():
    nv = FakeNvml(gpus=1, unsupported=("power", "nvlink"))
    t = GpuTelemetry(TelemetryConfig(interval_s=60), nvml=nv, host="h")
    t.start()
    try:
        t.poll_once()
        s = _samples(t)
        assert s["dynamiccl_gpu_power_watts"] == [] and s["dynamiccl_gpu_nvlink_bytes_total"] == []
        assert s["dynamiccl_gpu_telemetry_errors_total"][0][2] == 0
        nv.initialised = False                     # every query now fails with NVML_ERROR_UNINITIALIZED
        t.poll_once()
        assert _samples(t)["dynamiccl_gpu_telemetry_errors_total"][0][2] == 4   # clock, temp, pcie tx, rx
    finally:
        nv.initialised = True
        t.shutdown()


def test_no_driver_says_so_once_and_exports_up_0(caplog, monkeypatch):
    monkeypatch.setattr(gpu_mod, "_warned", False)
    with caplog.at_level(logging.DEBUG, logger="dynamiccl.collector.telemetry.gpu"):
        for _ in range(3):
            t = GpuTelemetry(TelemetryConfig(), nvml=FakeNvml(driver=False), host="h")
            t.start()
            t.shutdown()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no NVIDIA driver" in warnings[0].getMessage()
    assert _samples(t)["dynamiccl_gpu_telemetry_up"][0][2] == 0.0
    assert _samples(t)["dynamiccl_gpu_info"] == []


def test_real_pynvml_without_driver_carries_on():
    import pynvml
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    t = GpuTelemetry(TelemetryConfig(), host="h")
    t.start()
    assert not t.available and t.reason
    t.shutdown()


def test_pipeline_serves_gpu_metrics_and_the_cli_switch(monkeypatch):
    from dynamiccl.collector.cli import config_from_args, register
    from dynamiccl.collector.pipeline import Pipeline
    import argparse
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus=1))
    cfg = default_config().replace(receiver={"listen": ()}, parquet={"directory": None},
                                   prometheus={"address": "127.0.0.1:0"}, features={"address": None})
    with Pipeline(cfg) as p:
        text = urllib.request.urlopen(f"http://{p.addresses['metrics']}/metrics", timeout=5).read().decode()
    assert 'dynamiccl_gpu_sm_clock_hertz{gpu="0",host=' in text
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert config_from_args(parser.parse_args(["collector", "--gpu-telemetry", "off"])).telemetry.gpu is False
    assert config_from_args(parser.parse_args(["collector"])).telemetry.gpu is True
    with pytest.raises(ValueError, match="interval_s"):
        TelemetryConfig(interval_s=0).validate()
