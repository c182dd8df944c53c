"""A window's records as the node partial reads them: one preallocated buffer per kept column.

Each arriving batch is copied field by field into the window's buffers while it is still in cache
(the 128-byte records are not kept), so closing a window needs no concatenation; closed windows'
buffers are reused (no page faults for a fresh allocation per window). Capacity doubles when a window
outgrows it and a fresh window starts at the size of the last one closed.
"""
from __future__ import annotations

import numpy as np

from dynamiccl.collector.wire_format import EVENT_DTYPE
from dynamiccl.scaleout.node_agg import KEPT_FIELDS, timing

__all__ = ["WindowColumns", "ColumnPool"]

_DTYPES = {**{f: EVENT_DTYPE[f] for f in KEPT_FIELDS}, "timed": np.dtype(bool), "dur": np.dtype(np.int64),
           "t": np.dtype(np.int64)}
MIN_CAPACITY = 1 << 12


class WindowColumns:
    def __init__(self, capacity: int):
        self.n = 0
        self._cols = {f: np.empty(max(capacity, MIN_CAPACITY), dt) for f, dt in _DTYPES.items()}

    @property
    def capacity(self) -> int:
        return len(self._cols["rank"])

    def append(self, ev: np.ndarray, t: np.ndarray) -> None:
        """Copy the kept fields of ``ev`` (``EVENT_DTYPE``; ``t`` its event times) into the buffers."""
        m = len(ev)
        self._reserve(self.n + m)
        s = slice(self.n, self.n + m)
        cols = self._cols
        for f in KEPT_FIELDS:
            cols[f][s] = ev[f]
        cols["timed"][s], cols["dur"][s] = timing(ev, t)
        cols["t"][s] = t                           # event time: an untimed record's enqueue (scaleout/waits.py)
        self.n += m

    def columns(self) -> dict[str, np.ndarray]:
        """The filled part of each column (views: valid until the store is reused)."""
        return {f: a[:self.n] for f, a in self._cols.items()}

    def _reserve(self, need: int) -> None:
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity)
        for f, a in self._cols.items():
            b = np.empty(cap, a.dtype)
            b[:self.n] = a[:self.n]
            self._cols[f] = b


class ColumnPool:
    """At most ``keep`` emptied stores for the next windows (memory stays bounded by the largest
    windows seen, never by their number)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._free: list[WindowColumns] = []
        self._last_n = MIN_CAPACITY

    def take(self) -> WindowColumns:
        return self._free.pop() if self._free else WindowColumns(self._last_n)

    def give(self, store: WindowColumns) -> None:
        self._last_n = max(store.n, MIN_CAPACITY)
        store.n = 0
        if len(self._free) < self.keep:
            self._free.append(store)
