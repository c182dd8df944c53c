"""The window aggregator's building blocks (processors/window_agg.py): a bounded interner of codes and the
growable column buffers of one open window."""
from __future__ import annotations

import numpy as np

__all__ = ["Interner", "COLUMNS"]


class Interner:
    """str/tuple → dense int code (bounded: ``get`` returns -1 when full)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.codes: dict = {}
        self.values: list = []

    def get(self, value) -> int:
        code = self.codes.get(value)
        if code is None:
            if len(self.values) >= self.limit:
                return -1
            code = len(self.values)
            self.codes[value] = code
            self.values.append(value)
        return code


#: the per-record columns a window keeps (name, dtype)
COLUMNS = (("kc", np.int64), ("seq", np.int64), ("dur", np.float64), ("bytes", np.float64),
           ("rel", np.float64), ("rank", np.int32), ("nranks", np.int32), ("nnodes", np.int32),
           ("tcv", np.uint32), ("host", np.uint16), ("bucket", np.uint8))


class _Window:
    """Growable column buffers of one open window (capacity doubles; no per-window concatenation)."""
    __slots__ = ("cols", "n", "cap")

    def __init__(self, cap: int):
        self.cap = max(16, int(cap))
        self.cols = {name: np.empty(self.cap, dt) for name, dt in COLUMNS}
        self.n = 0

    def append(self, cols: dict[str, np.ndarray], idx: np.ndarray | None = None, *,
               limit: int = 1 << 62) -> None:
        """Append a batch's columns (rows ``idx``, or all); capacity never grows past ``limit``
        (the caller keeps ``n + m <= limit``)."""
        m = len(cols["kc"]) if idx is None else len(idx)
        if self.n + m > self.cap:
            cap = max(min(self.cap * 2, limit), self.n + m)
            for name, a in self.cols.items():
                b = np.empty(cap, a.dtype)
                b[:self.n] = a[:self.n]
                self.cols[name] = b
            self.cap = cap
        lo, hi = self.n, self.n + m
        for name, a in self.cols.items():
            v = cols[name]
            if idx is None or np.ndim(v) == 0:       # whole batch, or a per-batch scalar (host)
                a[lo:hi] = v
            else:
                np.take(v, idx, out=a[lo:hi])
        self.n = hi

    def view(self) -> dict[str, np.ndarray]:
        return {name: a[:self.n] for name, a in self.cols.items()}
