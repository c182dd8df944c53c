"""Append-only audit log: one JSON object per line for every decision the retuner takes.

Each line: ``{"ts": wall-clock s, "t": event time s, "action": …, "dry_run": bool, …details}``. The file is
opened in append mode and each line is written with one ``write`` + ``flush``; a failed write is counted
(``dynamiccl_retuner_audit_errors_total``) and logged, never raised. The newest lines are also kept in
memory (bounded) for tests and the CLI summary.

>>> import tempfile, json, os
>>> p = os.path.join(tempfile.mkdtemp(), "audit.jsonl")
>>> log = AuditLog(p, clock=lambda: 100.0)
>>> rec = log.write("commit", t=12.5, target="0x1f/AllReduce/24", candidate="RING/LL128/0")
>>> json.loads(open(p).read())["action"], len(log.recent)
('commit', 1)
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import deque
from typing import Any, Callable

__all__ = ["AuditLog"]

log = logging.getLogger("dynamiccl.retuner.audit")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class AuditLog:
    def __init__(self, path: str | os.PathLike | None, *, clock: Callable[[], float] = time.time,
                 keep: int = 10_000, on_error: Callable[[], None] | None = None, dry_run: bool = True) -> None:
        self.path = None if path is None else os.fspath(path)
        self.clock = clock
        self.recent: deque[dict] = deque(maxlen=keep)
        self.on_error = on_error
        self.dry_run = dry_run
        self.errors = 0
        self._fh = None
        if self.path is not None:
            d = os.path.dirname(self.path)
            if d:
                os.makedirs(d, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")   # start-up error if not writable

    def write(self, action: str, *, t: float | None = None, **details: Any) -> dict:
        rec = {"ts": round(self.clock(), 6), "t": t, "action": action, "dry_run": self.dry_run, **details}
        rec = _clean(rec)
        self.recent.append(rec)
        if self._fh is not None:
            try:
                self._fh.write(json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n")
                self._fh.flush()
            except (OSError, ValueError, TypeError) as e:
                self.errors += 1
                if self.on_error is not None:
                    self.on_error()
                if self.errors <= 3 or self.errors % 1000 == 0:
                    log.error("audit log %s: %s (%d errors)", self.path, e, self.errors)
        return rec

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            finally:
                self._fh = None
