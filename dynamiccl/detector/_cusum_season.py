"""`CUSUM`'s seasonal veto (``seasonal_memory``): an alarm that only repeats the same phase of a
clear cycle one period earlier is not raised.

A chart for level changes sees every rise and fall of a daily cycle as a change (NAB's Twitter
volumes: alarms alternate up in the day, down at night; 222 of its 288 development false alarms
outside windows). Rule: the chart keeps its last ``seasonal_memory`` valid values (lifetime, not
reset by an alarm). At an alarm it finds the period P (at least ``min_warmup`` samples, at most
half the memory) where the memory's autocorrelation peaks; the memory is cyclic if that peak is
at least 0.5 and the autocorrelation went through 0 or below between lag 1 and P (a cycle,
not the slow decay of a level step or a trend). On a cyclic memory the excursion's seasonal
differences x_t - x_{t-P} are standardised by their robust scale over the memory; if their mean
in the alarm's direction is under k = delta / 2 (the CUSUM's own reference value) the excursion is
what the same phase did one period earlier: the alarm is vetoed and that side restarts from 0.
A real change on top of the cycle departs from the previous period and is raised.
"""

from __future__ import annotations

from array import array

import numpy as np

MIN_PEAK = 0.5  # autocorrelation of a clear cycle at its period


def period(values: np.ndarray, min_lag: int) -> int | None:
    """The period of a clear cycle in ``values`` (see the module doc), or None."""
    n = values.size
    if n < 2 * min_lag + 2:
        return None
    med = float(np.median(values))
    spread = 3.0 * 1.4826 * float(np.median(np.abs(values - med)))
    z = np.clip(values, med - spread, med + spread)  # spikes must not make or break a cycle
    z = z - z.mean()
    denom = float(np.dot(z, z))
    if denom <= 0.0:
        return None
    spec = np.fft.rfft(z, 2 * n)
    acf = np.fft.irfft(spec * np.conj(spec))[: n // 2 + 1] / denom
    crossed = np.flatnonzero(acf[1:] <= 0.0)
    if crossed.size == 0:
        return None
    lo = max(min_lag, int(crossed[0]) + 1)
    if lo > n // 2:
        return None
    best = lo + int(np.argmax(acf[lo:]))
    return best if acf[best] >= MIN_PEAK else None


class SeasonMemory:
    """The last ``size`` valid (value, input index) pairs in two fixed rings (16 bytes each;
    `array.array`, whose item assignment is a fraction of a numpy scalar store's cost); kept
    for the chart's lifetime (an alarm's reset does not clear them)."""

    def __init__(self, size: int):
        self.values = array("d", bytes(8 * size))
        self.index = array("q", bytes(8 * size))
        self.size = size
        self.pos = 0
        self.count = 0

    def push(self, x: float, i: int) -> None:
        pos = self.pos
        self.values[pos] = x
        self.index[pos] = i
        self.pos = pos + 1 if pos + 1 < self.size else 0
        if self.count < self.size:
            self.count += 1

    def ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """(values, input indices), oldest first."""
        values = np.frombuffer(self.values, dtype=np.float64)
        index = np.frombuffer(self.index, dtype=np.int64)
        if self.count < self.size:
            return values[: self.count].copy(), index[: self.count].copy()
        return np.roll(values, -self.pos), np.roll(index, -self.pos)


def veto_season(det, fired_up: bool, fired_down: bool) -> tuple[bool, bool]:
    """Clear ``det``'s alarm side(s) whose excursion repeats the previous period."""
    values, index = det._season.ordered()
    p = period(values, det._first_learn)
    if p is None:
        return fired_up, fired_down
    diffs = values[p:] - values[:-p]
    med = float(np.median(diffs))
    scale = 1.4826 * float(np.median(np.abs(diffs - med)))
    if scale <= 0.0:
        return fired_up, fired_down
    for up, start in ((True, det._start_up), (False, det._start_down)):
        if not (fired_up if up else fired_down):
            continue
        count = int(np.count_nonzero(index >= start))  # the excursion's samples, newest last
        exc = diffs[max(0, values.size - count - p):]
        if exc.size and (1.0 if up else -1.0) * float(exc.mean()) / scale < det._k:
            if up:
                det._s_up, det._run_up, fired_up = 0.0, 0, False
            else:
                det._s_down, det._run_down, fired_down = 0.0, 0, False
    return fired_up, fired_down


def validate_seasonal_memory(seasonal_memory) -> int | None:
    """Check the seasonal veto's memory (valid samples, at least 8), None: off."""
    if seasonal_memory is None:
        return None
    if isinstance(seasonal_memory, bool) or not isinstance(seasonal_memory, int) or seasonal_memory < 8:
        raise ValueError(f"seasonal_memory must be an int >= 8 or None, got {seasonal_memory!r}")
    return seasonal_memory
