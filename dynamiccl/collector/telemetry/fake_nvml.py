"""A stand-in for the part of ``pynvml`` that :mod:`dynamiccl.collector.telemetry.gpu` calls, for machines without a GPU.

It mirrors nvidia-ml-py's signatures, units and error behaviour (``NVMLError`` with ``.value``, the
``NVML_*`` constants taken from the real module) so tests exercise the real code path; values are
fixed and documented here. ``driver=False`` fails ``nvmlInit`` like a host without the driver
(``NVMLError_LibraryNotFound``); ``xids`` queues XID events for ``nvmlEventSetWait_v2``.
"""
from __future__ import annotations

import queue
from types import SimpleNamespace

import pynvml as _real

__all__ = ["FakeNvml"]


class FakeNvml:
    NVMLError = _real.NVMLError
    NVML_SUCCESS = _real.NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_TIMEOUT = _real.NVML_ERROR_TIMEOUT
    NVML_CLOCK_SM = _real.NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = _real.NVML_TEMPERATURE_GPU
    NVML_PCIE_UTIL_TX_BYTES = _real.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = _real.NVML_PCIE_UTIL_RX_BYTES
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    nvmlEventTypeXidCriticalError = _real.nvmlEventTypeXidCriticalError

    SM_MHZ = 1980           # H100 SXM boost clock
    POWER_MW = 412_000
    TEMP_C = 61
    PCIE_KBPS = 2_000_000   # per direction
    NVLINK_KIB_PER_POLL = 50_000_000

    def __init__(self, gpus: int = 8, *, driver: bool = True, unsupported: tuple[str, ...] = ()):
        self.gpus, self.driver, self.unsupported = gpus, driver, set(unsupported)
        self.xids: "queue.Queue[tuple[int, int]]" = queue.Queue()
        self.nvlink_kib = [0] * gpus
        self.calls = 0
        self.initialised = False

    def _err(self, code: int):
        return _real.NVMLError(code)

    def _check(self, name: str):
        self.calls += 1
        if not self.initialised:
            raise self._err(_real.NVML_ERROR_UNINITIALIZED)
        if name in self.unsupported:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self):
        if not self.driver:
            raise _real.NVMLError(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlDeviceGetCount(self):
        self._check("count")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check("handle")
        return SimpleNamespace(index=i)

    def nvmlDeviceGetIndex(self, h):
        return h.index

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-00000000-0000-0000-0000-{h.index:012d}"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetClockInfo(self, h, kind):
        self._check("sm_clock")
        return self.SM_MHZ

    def nvmlDeviceGetPowerUsage(self, h):
        self._check("power")
        return self.POWER_MW

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._check("temperature")
        return self.TEMP_C

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._check("pcie")
        return self.PCIE_KBPS

    def nvmlDeviceGetFieldValues(self, h, ids):
        self._check("nvlink")
        self.nvlink_kib[h.index] += self.NVLINK_KIB_PER_POLL
        v = self.nvlink_kib[h.index]
        return [SimpleNamespace(fieldId=i, nvmlReturn=_real.NVML_SUCCESS, value=SimpleNamespace(ullVal=v))
                for i in ids]

    def nvmlEventSetCreate(self):
        self._check("events")
        return object()

    def nvmlDeviceRegisterEvents(self, h, types, es):
        self._check("events")

    def nvmlEventSetFree(self, es):
        pass

    def nvmlEventSetWait_v2(self, es, timeout_ms):
        try:
            gpu, xid = self.xids.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise self._err(_real.NVML_ERROR_TIMEOUT) from None
        return SimpleNamespace(device=SimpleNamespace(index=gpu), eventType=self.nvmlEventTypeXidCriticalError,
                               eventData=xid)
