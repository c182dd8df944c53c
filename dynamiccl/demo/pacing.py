"""Pace the simulated job to the demo's pipeline, so a config lands at the step boundary it was meant for.

A window ``[s, s + window_s)`` closes once every source has reported past ``s + window_s + lateness_s``; only
then do the detector and the retuner see it, and a config the retuner writes in answer reaches the job at its
next step boundary. In real time that is about ``window_s + lateness_s`` after the window; in ``--fast`` mode
the simulation would run far ahead, so the config would take effect many simulated seconds late (and, measured
against the job's new regime, look like a change of its own). :class:`WindowPacer` is the driver's ``gate``
(called before every step with the span of the step last handed to the workers): it holds the job until the
pipeline has handled every window that can have closed by then, so the job never runs more than ``lag_s``
ahead of what the retuner has seen, and a config lands at most ``lag_s`` + one step after its window
(:attr:`WindowPacer.promise_s`). Windows without records (a checkpoint pause) are never emitted, so a gap
between two steps counts as handled once the window before it is.

The job waits for the pipeline however slow it is (a loaded machine): only a pipeline that makes no progress
at all for ``max_stall_s`` of wall time is given up on (counted in ``timeouts``), so nothing wedges the job.

>>> p = WindowPacer(lag_s=3.5, window_s=1.0, max_stall_s=0.01)
>>> p(0.0, 3.0); p.handled(10.0); p(10.0, 13.0); p(13.0, 20.0)
>>> (p.waits, p.timeouts, p.max_step_s)
(1, 1, 7.0)
>>> q = WindowPacer(lag_s=3.5, window_s=1.0, max_stall_s=0.01)
>>> q(11.6, 12.0); q.handled(13.0); q(15.0, 16.7); q(16.7, 18.5)    # a pause from 12 s to 15 s
>>> (q.waits, q.covered_s)
(0, 15.0)
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable

__all__ = ["WindowPacer", "pacing_lag_s"]

log = logging.getLogger(__name__)
_MAX_GAPS = 64


def pacing_lag_s(window_s: float, lateness_s: float, step_s: float = 0.5) -> float:
    """How far the job may run ahead of the handled windows: a window closes ``window_s + lateness_s`` after its
    start at the earliest, and the newest record handed to the workers may start up to one step before the
    step's end (``step_s`` bounds that gap in the demo's workloads). Less than this can hold the job
    waiting for a window that only its next step would close."""
    return window_s + lateness_s + step_s


class WindowPacer:
    """``pacer(start_s, end_s)`` blocks until windows up to ``end_s - lag_s`` have been handled (``handled``).

    Never wedges the job: a wait gives up once the pipeline has handled no window for ``max_stall_s`` of wall
    time (counted in ``timeouts``, logged), and :meth:`close` releases every waiter for good (shutdown, Ctrl-C).
    A slow pipeline that keeps handling windows is waited for, however long that takes.
    ``epoch_s`` places the window grid (windows are aligned to the epoch's clock, not to the job's start)."""

    def __init__(self, lag_s: float, window_s: float, max_stall_s: float = 60.0, *, epoch_s: float = 0.0,
                 start_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        if lag_s < 0 or window_s <= 0 or max_stall_s <= 0:
            raise ValueError(f"lag_s must be >= 0, window_s and max_stall_s > 0, got {lag_s!r}, {window_s!r}, "
                             f"{max_stall_s!r}")
        self.lag_s = lag_s
        self.window_s = window_s
        self.max_stall_s = max_stall_s
        self.epoch_s = epoch_s
        self._clock = clock
        self._cond = threading.Condition()
        self._handled_s = start_s      # the job's first lag_s need no window (there is none before its start)
        self._last_end_s = start_s
        self._progress = 0             # handled() calls: the pipeline is alive while this moves
        self._gaps: list[tuple[float, float]] = []    # (end of a step, start of the next one) with no records
        self.waits = 0          # steps that had to wait for the pipeline
        self.timeouts = 0       # waits given up after max_stall_s without progress
        self.waited_s = 0.0     # wall time spent waiting
        self.longest_wait_s = 0.0
        self.max_step_s = 0.0   # the longest step seen (simulated s): a config lands within lag_s + this

    @property
    def promise_s(self) -> float:
        """A config written in answer to a window reaches the job at most this long (simulated) after the window's
        start, unless a wait was given up (``timeouts``): the job is at most ``lag_s`` past the window when the
        retuner answers, and the config takes effect at the next step boundary."""
        return self.lag_s + self.max_step_s

    def set_epoch(self, epoch_s: float) -> None:
        self.epoch_s = epoch_s

    @property
    def covered_s(self) -> float:
        """Simulated time up to which every window with records has been handled."""
        h = self._handled_s
        for g0, g1 in self._gaps:
            if h >= g0:        # the window holding the last records before the gap is done; the empty ones too
                h = max(h, self._window_start(g1))
        return h

    def _window_start(self, t: float) -> float:
        w = self.window_s
        return math.floor((t + self.epoch_s) / w + 1e-9) * w - self.epoch_s

    def handled(self, until_s: float) -> None:
        """Every window ending at or before ``until_s`` (simulated s) has been through detector and retuner."""
        with self._cond:
            self._progress += 1
            if until_s > self._handled_s:
                self._handled_s = until_s
                self._gaps = [g for g in self._gaps if g[1] > until_s]
            self._cond.notify_all()

    def close(self) -> None:
        self.handled(math.inf)

    def __call__(self, start_s: float, end_s: float) -> None:
        with self._cond:
            if start_s > self._last_end_s + 1e-6 and len(self._gaps) < _MAX_GAPS:
                self._gaps.append((self._last_end_s, start_s))
            self.max_step_s = max(self.max_step_s, end_s - start_s)
            self._last_end_s = max(self._last_end_s, end_s)
            target = end_s - self.lag_s
            if self.covered_s >= target:
                return
            self.waits += 1
            t0 = self._clock()
            self._wait_for(target, end_s)
            waited = self._clock() - t0
            self.waited_s += waited
            self.longest_wait_s = max(self.longest_wait_s, waited)

    def _wait_for(self, target: float, end_s: float) -> None:
        """Wait (holding ``_cond``) until ``covered_s >= target``; give up after ``max_stall_s`` without progress."""
        seen, since = self._progress, self._clock()
        while self.covered_s < target:
            if self._progress != seen:         # the pipeline handled a window since the last look: not stalled
                seen, since = self._progress, self._clock()
            left = self.max_stall_s - (self._clock() - since)
            if left <= 0:
                self.timeouts += 1
                log.warning("pacing: the job is at %.1f s but the pipeline has handled windows up to %.1f s only "
                            "and nothing for %.1f s; going on without it", end_s, self.covered_s, self.max_stall_s)
                return
            self._cond.wait(timeout=left)
