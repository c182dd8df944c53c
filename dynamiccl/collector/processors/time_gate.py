"""Event-time gate: each host's event time is held to a band around where its clock should be.

A record's event time comes from the sender's clock, so a forged or broken sender can put records
hours apart in one frame (each hour is a parquet partition and an aggregation window). Per host
the gate keeps a reference event time and the (collector) arrival time it was seen at; the host's
clock is expected to have advanced by the arrival time elapsed since. A batch is centred on its
median when that lies within ``spread_s`` of the expected time (a simulator running faster than the
wall clock moves less than ``spread_s`` per batch), else on the expected time; records more than
``spread_s`` from the centre are refused and counted (``reason="clock_range"``). A host silent for
``reanchor_s`` is re-anchored on its next batch (a restart, a clock step). The table of hosts is an
LRU of ``max_hosts``.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable

import numpy as np

__all__ = ["EventTimeGate"]

log = logging.getLogger(__name__)


class EventTimeGate:
    def __init__(self, spread_s: float, *, max_hosts: int = 65536, reanchor_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        if spread_s <= 0 or max_hosts <= 0:
            raise ValueError("spread_s and max_hosts must be > 0")
        self.spread_ns = int(spread_s * 1e9)
        self.max_hosts = max_hosts
        self.reanchor_s = reanchor_s
        self._clock = clock
        self._hosts: OrderedDict[str, tuple[int, float]] = OrderedDict()  # host → (ref_ns, arrival_s)
        self._logged: OrderedDict[str, None] = OrderedDict()

    def admit(self, host: str, t: np.ndarray) -> np.ndarray | None:
        """Keep-mask for event times ``t`` (int64 ns) of one batch from ``host``; None: keep all."""
        if len(t) == 0:
            return None
        now = self._clock()
        lo, hi = int(t.min()), int(t.max())
        mid = (lo + hi) // 2 if hi - lo <= self.spread_ns else int(np.median(t))
        prev = self._hosts.get(host)
        centre = mid
        if prev is not None and now - prev[1] <= self.reanchor_s:
            expected = prev[0] + int((now - prev[1]) * 1e9)
            if abs(mid - expected) > self.spread_ns:
                centre = expected
        self._hosts[host] = (centre, now)
        self._hosts.move_to_end(host)
        if len(self._hosts) > self.max_hosts:
            self._hosts.popitem(last=False)
        if lo >= centre - self.spread_ns and hi <= centre + self.spread_ns:
            return None
        keep = np.abs(t - centre) <= self.spread_ns
        self._log_once(host, len(t) - int(keep.sum()))
        return keep

    def _log_once(self, host: str, n: int) -> None:
        if host in self._logged or len(self._logged) >= 1024:  # a flood of forged hosts: 1024 lines
            return
        self._logged[host] = None
        log.warning("host %s: %d records with event times more than %.0f s from the host's clock refused "
                    "(counted in dynamiccl_collector_records_dropped_total{reason=\"clock_range\"}; "
                    "logged once per host)", host, n, self.spread_ns / 1e9)
