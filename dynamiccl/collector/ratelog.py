"""Rate-limited warnings: one line per key per ``interval_s``, with how many were suppressed.

A hostile peer can cause a refusal per connection attempt; the refusal is always counted in a
metric, the log gets at most one line per reason per interval (bounded key table).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, *, max_keys: int = 256,
                 clock: Callable[[], float] = time.monotonic):
        self._log, self.interval_s, self.max_keys, self._clock = logger, interval_s, max_keys, clock
        self._next: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, msg: str, *args) -> bool:
        """Log ``msg % args`` unless ``key`` was logged within the interval; True if logged."""
        now = self._clock()
        with self._lock:
            due = self._next.get(key)
            if due is not None and now < due:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            if due is None and len(self._next) >= self.max_keys:
                key = "(other)"  # bounded: unknown keys share one slot
                if now < self._next.get(key, 0.0):
                    self._suppressed[key] = self._suppressed.get(key, 0) + 1
                    return False
            self._next[key] = now + self.interval_s
            skipped = self._suppressed.pop(key, 0)
        suffix = f" ({skipped} more like this in the last {self.interval_s:.0f} s, counted)" if skipped else ""
        self._log.warning(msg + suffix, *args)
        return True
