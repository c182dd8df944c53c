"""What worked, per regime fingerprint: reused at once when a regime recurs.

A fingerprint is the regime's kind, the set of affected communicators and its magnitude (new/old latency
ratio). Two regimes are "the same" when kind and communicators are equal and the magnitudes are within a
factor ``tolerance`` of each other; the nearest magnitude wins. Entries are bounded (oldest evicted).

>>> from dynamiccl.retuner.types import Candidate
>>> m = Memory(tolerance=1.5, max_entries=8)
>>> m.store("latency", ["0x1f"], 2.0, {(0x1f, "AllReduce", 24): (Candidate("RING", "LL128"), 1e-3, 1.3e-3, True)})
>>> m.lookup("latency", ["0x1f"], 2.4)[(0x1f, "AllReduce", 24)][0].name
'RING/LL128/0'
>>> m.lookup("latency", ["0x1f"], 4.0) is None, m.lookup("bandwidth", ["0x1f"], 2.0) is None
(True, True)
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Iterable

from dynamiccl.retuner.types import Candidate

__all__ = ["Memory", "Remembered"]

#: per target key: (candidate or None = NCCL default, its measured mean s, the incumbent's mean s, complete) —
#: ``complete`` False = from an exploration that was interrupted (a start point, not a final answer)
Remembered = dict[tuple[int, str, int], tuple[Candidate | None, float, float, bool]]


class Memory:
    def __init__(self, *, tolerance: float = 1.5, max_entries: int = 256) -> None:
        self.tolerance = tolerance
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, tuple[str, ...], float], Remembered] = OrderedDict()

    @staticmethod
    def _comms(comms: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted({c.lower() for c in comms}))

    def store(self, kind: str, comms: Iterable[str], magnitude: float, what: Remembered) -> None:
        key = (kind, self._comms(comms), float(magnitude))
        near = self._nearest(kind, key[1], magnitude)
        if near is not None:                      # same regime: merge, newest wins
            merged = {**self._entries.pop(near), **what}
            self._entries[near] = merged
            return
        self._entries[key] = dict(what)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def _nearest(self, kind: str, comms: tuple[str, ...], magnitude: float):
        if not (magnitude > 0 and math.isfinite(magnitude)):
            return None
        best, dist = None, math.log(self.tolerance) + 1e-12
        for k in self._entries:
            if k[0] == kind and k[1] == comms and k[2] > 0:
                d = abs(math.log(magnitude / k[2]))
                if d <= dist:
                    best, dist = k, d
        return best

    def lookup(self, kind: str, comms: Iterable[str], magnitude: float) -> Remembered | None:
        k = self._nearest(kind, self._comms(comms), magnitude)
        if k is None:
            return None
        self._entries.move_to_end(k)
        return dict(self._entries[k])

    def key_for(self, kind: str, comms: Iterable[str], magnitude: float) -> tuple[str, tuple[str, ...], float]:
        """The fingerprint a regime is remembered under: the nearest stored one, else its own (what ``store``
        would create)."""
        c = self._comms(comms)
        return self._nearest(kind, c, magnitude) or (kind, c, float(magnitude))

    def get(self, key) -> Remembered | None:
        """What is remembered under exactly ``key`` (from :meth:`key_for`), without a magnitude match."""
        e = self._entries.get(key)
        return None if e is None else dict(e)

    def __len__(self) -> int:
        return len(self._entries)
