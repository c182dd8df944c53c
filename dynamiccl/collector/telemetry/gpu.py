"""GPU telemetry from NVML (nvidia-ml-py's ``pynvml``), exported on the collector's ``/metrics``.

Per GPU of this host: SM clock, power, temperature, PCIe throughput (gauges), NVLink data bytes
(counters from ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``), XID critical errors (event set). A poll
thread samples every ``interval_s`` into a snapshot; ``/metrics`` reads the snapshot and never calls
NVML. Without an NVIDIA driver ``start()`` logs it once per process at WARNING, exports
``dynamiccl_gpu_telemetry_up 0`` and the collector carries on. A metric a GPU does not support is
skipped from then on; other NVML errors are counted in ``dynamiccl_gpu_telemetry_errors_total``.

>>> from dynamiccl.collector.config import TelemetryConfig
>>> from dynamiccl.collector.telemetry.fake_nvml import FakeNvml
>>> t = GpuTelemetry(TelemetryConfig(interval_s=0.05), nvml=FakeNvml(gpus=2), host="n0")
>>> t.start(); t.poll_once()
>>> fams = {f.name: f for f in t.collect()}
>>> [s.value for s in fams["dynamiccl_gpu_sm_clock_hertz"].samples]
[1980000000.0, 1980000000.0]
>>> t.shutdown()
>>> nodriver = GpuTelemetry(TelemetryConfig(), nvml=FakeNvml(driver=False), host="n0"); nodriver.start()
>>> [s.value for s in next(f for f in nodriver.collect() if f.name == "dynamiccl_gpu_telemetry_up").samples]
[0.0]
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dynamiccl.collector.metrics import BY_NAME

__all__ = ["GpuTelemetry", "GPU_METRIC_NAMES"]

log = logging.getLogger(__name__)

GPU_METRIC_NAMES = tuple(n for n in BY_NAME if n.startswith("dynamiccl_gpu_"))
_warned_lock = threading.Lock()
_warned = False


def _warn_once(msg: str, *args) -> None:
    global _warned
    with _warned_lock:
        first, _warned = not _warned, True
    (log.warning if first else log.debug)(msg, *args)


def _fam(name: str):
    spec = BY_NAME[name]
    cls = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
    return cls(name, spec.help, labels=list(spec.labels))


class GpuTelemetry:
    """Component (``start``/``shutdown``) and prometheus-client collector (``collect``)."""

    def __init__(self, config, *, nvml: Any = None, host: str | None = None, registry=None,
                 clock=time.monotonic):
        config.validate()
        self.config = config
        self._nvml = nvml
        self.host = host or os.environ.get("DYNAMICCL_HOST") or socket.gethostname()
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.available = False
        self.reason = "not started"
        self._handles: list[Any] = []
        self._info: list[tuple[str, str, str]] = []          # (gpu index, uuid, name)
        self._gauges: dict[str, dict[tuple, float]] = {}
        self._nvlink: dict[tuple, float] = {}               # (gpu, direction) → bytes
        self._xid_count: dict[str, int] = {}
        self._xid_last: dict[str, float] = {}
        self._errors = 0
        self._unsupported: set[tuple[str, str]] = set()
        self._event_set = None
        self._started = False
        if registry is not None:
            registry.register(self)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        nv = self._nvml
        try:
            if nv is None:
                import pynvml as nv
                self._nvml = nv
            nv.nvmlInit()
            n = nv.nvmlDeviceGetCount()
            for i in range(n):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                self._handles.append(h)
                self._info.append((str(i), _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h))))
        except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded / ImportError / OSError
            self.reason = str(exc) or type(exc).__name__
            _warn_once("GPU telemetry off: no NVIDIA driver / NVML on this host (%s); the collector carries on "
                       "without GPU metrics", self.reason)
            return
        self.available = True
        self.reason = ""
        log.info("GPU telemetry: %d GPU(s) on %s, every %.3g s", len(self._handles), self.host,
                 self.config.interval_s)
        self._register_xid()
        self.poll_once()
        self._spawn(self._poll_loop, "gpu-telemetry")
        if self._event_set is not None:
            self._spawn(self._xid_loop, "gpu-xid")

    def _spawn(self, target, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def shutdown(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5.0)
        self._threads = []
        if self.available:
            nv = self._nvml
            try:
                if self._event_set is not None:
                    nv.nvmlEventSetFree(self._event_set)
                nv.nvmlShutdown()
            except Exception:  # pragma: no cover - best effort at exit
                log.debug("NVML shutdown failed", exc_info=True)
            self.available = False

    # -- sampling ----------------------------------------------------------------------------------
    def _call(self, gpu: str, what: str, fn, *args):
        """One NVML query; None when unsupported (remembered) or failed (counted)."""
        if (gpu, what) in self._unsupported:
            return None
        nv = self._nvml
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == nv.NVML_ERROR_NOT_SUPPORTED:
                self._unsupported.add((gpu, what))
                log.info("GPU %s on %s: %s not supported; not sampled", gpu, self.host, what)
            else:
                with self._lock:
                    self._errors += 1
                log.debug("GPU %s: %s failed: %s", gpu, what, exc)
            return None

    def poll_once(self) -> None:
        nv = self._nvml
        gauges: dict[str, dict[tuple, float]] = {k: {} for k in (
            "dynamiccl_gpu_sm_clock_hertz", "dynamiccl_gpu_power_watts", "dynamiccl_gpu_temperature_celsius",
            "dynamiccl_gpu_pcie_throughput_bytes_per_second")}
        nvlink: dict[tuple, float] = {}
        for (gpu, _uuid, _name), h in zip(self._info, self._handles):
            v = self._call(gpu, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            if v is not None:
                gauges["dynamiccl_gpu_sm_clock_hertz"][(gpu,)] = float(v) * 1e6          # MHz → Hz
            v = self._call(gpu, "power", nv.nvmlDeviceGetPowerUsage, h)
            if v is not None:
                gauges["dynamiccl_gpu_power_watts"][(gpu,)] = float(v) / 1e3              # mW → W
            v = self._call(gpu, "temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            if v is not None:
                gauges["dynamiccl_gpu_temperature_celsius"][(gpu,)] = float(v)
            for direction, counter in (("tx", nv.NVML_PCIE_UTIL_TX_BYTES), ("rx", nv.NVML_PCIE_UTIL_RX_BYTES)):
                v = self._call(gpu, f"pcie_{direction}", nv.nvmlDeviceGetPcieThroughput, h, counter)
                if v is not None:
                    gauges["dynamiccl_gpu_pcie_throughput_bytes_per_second"][(gpu, direction)] = float(v) * 1024
            fields = [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
            vals = self._call(gpu, "nvlink", nv.nvmlDeviceGetFieldValues, h, fields)
            if vals is not None:
                for direction, fv in zip(("tx", "rx"), vals):
                    if fv.nvmlReturn == nv.NVML_SUCCESS:
                        nvlink[(gpu, direction)] = float(fv.value.ullVal) * 1024          # KiB → bytes
        with self._lock:
            self._gauges = gauges
            self._nvlink = nvlink

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.config.interval_s):
            try:
                self.poll_once()
            except Exception:  # never take the collector down
                with self._lock:
                    self._errors += 1
                log.exception("GPU telemetry poll failed")

    def _register_xid(self) -> None:
        nv = self._nvml
        try:
            es = nv.nvmlEventSetCreate()
        except Exception as exc:
            log.info("GPU telemetry: no XID events (%s)", exc)
            return
        ok = 0
        for (gpu, _u, _n), h in zip(self._info, self._handles):
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
                ok += 1
            except Exception as exc:
                log.info("GPU %s: XID events not available (%s)", gpu, exc)
        if ok:
            self._event_set = es
        else:
            nv.nvmlEventSetFree(es)

    def _xid_loop(self) -> None:
        nv = self._nvml
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 500)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != nv.NVML_ERROR_TIMEOUT:
                    with self._lock:
                        self._errors += 1
                    self._stop.wait(1.0)
                continue
            except Exception:
                log.exception("GPU XID wait failed")
                self._stop.wait(1.0)
                continue
            try:
                gpu = str(nv.nvmlDeviceGetIndex(data.device))
            except Exception:
                gpu = "unknown"
            with self._lock:
                self._xid_count[gpu] = self._xid_count.get(gpu, 0) + 1
                self._xid_last[gpu] = float(data.eventData)
            log.warning("GPU %s on %s: XID %d", gpu, self.host, int(data.eventData))

    # -- export -----------------------------------------------------------------------------------
    def collect(self):
        h = self.host
        with self._lock:
            gauges = {k: dict(v) for k, v in self._gauges.items()}
            nvlink = dict(self._nvlink)
            xid_count, xid_last, errors = dict(self._xid_count), dict(self._xid_last), self._errors
        f = _fam("dynamiccl_gpu_telemetry_up")
        f.add_metric([h], 1.0 if self.available else 0.0)
        yield f
        f = _fam("dynamiccl_gpu_telemetry_errors_total")
        f.add_metric([h], errors)
        yield f
        f = _fam("dynamiccl_gpu_info")
        for gpu, uuid, name in self._info:
            f.add_metric([h, gpu, uuid, name], 1.0)
        yield f
        for name in ("dynamiccl_gpu_sm_clock_hertz", "dynamiccl_gpu_power_watts",
                     "dynamiccl_gpu_temperature_celsius", "dynamiccl_gpu_pcie_throughput_bytes_per_second"):
            f = _fam(name)
            for labels, value in sorted(gauges.get(name, {}).items()):
                f.add_metric([h, *labels], value)
            yield f
        f = _fam("dynamiccl_gpu_nvlink_bytes_total")
        for (gpu, direction), value in sorted(nvlink.items()):
            f.add_metric([h, gpu, direction], value)
        yield f
        f = _fam("dynamiccl_gpu_xid_errors_total")
        last = _fam("dynamiccl_gpu_last_xid")
        for gpu, _u, _n in self._info:             # pre-initialised at 0 per GPU
            f.add_metric([h, gpu], xid_count.get(gpu, 0))
            last.add_metric([h, gpu], xid_last.get(gpu, 0.0))
        yield f
        yield last


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)
