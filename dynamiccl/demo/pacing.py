"""Pace the simulated job to the demo's pipeline, so a config lands at the step boundary it was meant for.

A window ``[s, s + window_s)`` closes once every source has reported past ``s + window_s + lateness_s``; only
then do the detector and the retuner see it, and a config the retuner writes in answer reaches the job at its
next step boundary. In real time that is about ``window_s + lateness_s`` after the window; in ``--fast`` mode
the simulation used to run far ahead, so the config took effect many simulated seconds late (and, measured
against the job's new regime, looked like a change of its own). :class:`WindowPacer` holds the job (the
driver's ``gate``, called before every step) until the pipeline has handled every window that can have closed
by then: the job never runs more than ``lag_s`` ahead of what the retuner has seen.

>>> p = WindowPacer(lag_s=3.5, max_wait_s=0.01)
>>> p(3.0); p.handled(10.0); p(13.0); p(20.0)
>>> (p.waits, p.timeouts)
(1, 1)
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable

__all__ = ["WindowPacer", "pacing_lag_s"]

log = logging.getLogger(__name__)


def pacing_lag_s(window_s: float, lateness_s: float, step_s: float = 0.5) -> float:
    """How far the job may run ahead of the handled windows: a window closes ``window_s + lateness_s`` after its
    start at the earliest, and the newest record handed to the workers may start up to one step before the
    step boundary (``step_s`` bounds a training step of the demo's workloads). Less than this can hold the job
    waiting for a window that only its next step would close."""
    return window_s + lateness_s + step_s


class WindowPacer:
    """``pacer(emitted_s)`` blocks until windows up to ``emitted_s - lag_s`` have been handled (``handled``).

    Never wedges the job: each wait gives up after ``max_wait_s`` of wall time (counted in ``timeouts``), and
    :meth:`close` releases every waiter for good (shutdown, Ctrl-C)."""

    def __init__(self, lag_s: float, max_wait_s: float = 5.0, *, start_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if lag_s < 0 or max_wait_s <= 0:
            raise ValueError(f"lag_s must be >= 0 and max_wait_s > 0, got {lag_s!r}, {max_wait_s!r}")
        self.lag_s = lag_s
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._cond = threading.Condition()
        self._handled_s = start_s      # the job's first lag_s need no window (there is none before its start)
        self.waits = 0          # steps that had to wait for the pipeline
        self.timeouts = 0       # waits given up after max_wait_s
        self.waited_s = 0.0     # wall time spent waiting

    @property
    def handled_s(self) -> float:
        return self._handled_s

    def handled(self, until_s: float) -> None:
        """Every window ending at or before ``until_s`` (simulated s) has been through detector and retuner."""
        with self._cond:
            if until_s > self._handled_s:
                self._handled_s = until_s
                self._cond.notify_all()

    def close(self) -> None:
        self.handled(math.inf)

    def __call__(self, emitted_s: float) -> None:
        target = emitted_s - self.lag_s
        with self._cond:
            if self._handled_s >= target:
                return
            self.waits += 1
            t0 = self._clock()
            if not self._cond.wait_for(lambda: self._handled_s >= target, timeout=self.max_wait_s):
                self.timeouts += 1
                log.warning("pacing: the job is at %.1f s but the pipeline has handled windows up to %.1f s only; "
                            "going on without it after %.1f s", emitted_s, self._handled_s, self.max_wait_s)
            self.waited_s += self._clock() - t0
