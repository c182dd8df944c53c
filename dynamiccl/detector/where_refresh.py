"""A change's `where` verdict refreshed on the windows after its report (the report itself is never held).

A change is reported on the window whose alarms confirm it; on the test bed that window often holds
few post-onset instances with rank offsets (none at all when a throttled collective outlasts the
window, or in a step-paced job), or its onset estimate is a window off, so the verdict taken then
is None or names a neighbour while the same rules, one or two windows later, name the changed rank
(dev half: 6 of the 8 misnamed changes, docs/evaluation/2026-11-28-detection-dense.md). Rule: each
reported degradation stays *pending* for ``refresh_windows`` windows after its report; on each,
`dynamiccl.detector.where.locate` is run again from the same onset to the newest window, and a
verdict that names another rank or link than the last one published (or the first one, after None)
is handed out as a `WhereUpdate` (the service's ``where_updates``, the loop's ``Step``, replay's
``where_updates``). Later verdicts rest on more instances than earlier ones, so the newest wins.
A refresh that finds no verdict keeps the last one (no update withdraws a verdict).

Bounded: at most ``MAX_PENDING`` changes pending (the oldest dropped first, counted).

On the change stream and in the changes file an update is its own line,
``{"where_update": ID, "job_id": ..., "detected_s": ..., "where": {...}}`` (`WhereUpdate.to_json`):
never a `RegimeChange` line, so no consumer takes it for a new change. `is_where_update` tells the
two apart; `dynamiccl.detector.server.subscribe_changes` skips updates unless asked for them and
the retuner counts and ignores them (its rules do not depend on ``where``).
"""
from __future__ import annotations

import dataclasses
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .localise import Where
from .straggler import RankHistory
from .where import locate

__all__ = ["WhereUpdate", "WhereRefresh", "MAX_PENDING", "same_place", "as_evidence", "is_where_update", "with_where",
           "LINE_KEY"]

MAX_PENDING = 256
LINE_KEY = "where_update"       # the key that marks an update's line (it holds the change's id)


@dataclass(frozen=True)
class WhereUpdate:
    """A newer `where` verdict on the change ``id`` (its ``evidence["where"]`` as it would be now)."""
    id: str
    job_id: str
    detected_s: float                  # event time of the end of the window that refreshed it
    where: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({LINE_KEY: self.id, "job_id": self.job_id, "detected_s": self.detected_s,
                           "where": self.where}, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str | bytes | dict) -> "WhereUpdate":
        """Parse an update line; ``ValueError`` names what is wrong."""
        d = json.loads(line) if isinstance(line, (str, bytes)) else line
        if not isinstance(d, dict) or not isinstance(d.get(LINE_KEY), str):
            raise ValueError(f"not a where update: no string {LINE_KEY!r}")
        where = d.get("where")
        if not isinstance(where, dict):
            raise ValueError("where update: 'where' is not an object")
        try:
            t = float(d["detected_s"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("where update: 'detected_s' is missing or not a number") from None
        return cls(id=d[LINE_KEY], job_id=str(d.get("job_id", "")), detected_s=t, where=where)


def with_where(change, where: dict):
    """``change`` (a `RegimeChange`) with ``where`` as its ``evidence["where"]``."""
    return dataclasses.replace(change, evidence={**change.evidence, "where": where})


def is_where_update(line: str | bytes | dict) -> bool:
    """Whether a change-stream line (or its parsed object) is a `WhereUpdate` (cheap: no full parse of a
    change line; a line that is not JSON is no update)."""
    if isinstance(line, dict):
        return LINE_KEY in line
    head = line[:40] if isinstance(line, str) else line[:40].decode("utf-8", "replace")
    return head.lstrip().startswith('{"' + LINE_KEY + '"')


def same_place(a: dict | None, b: dict | None) -> bool:
    """Whether two verdicts name the same rank or link (confidence aside)."""
    if a is None or b is None:
        return a is b
    return (a.get("kind"), a.get("rank"), tuple(a.get("link") or ())) == \
           (b.get("kind"), b.get("rank"), tuple(b.get("link") or ()))


@dataclass
class _Pending:
    id: str
    job: str
    comms: list[int]
    onset_step: int
    left: int
    where: dict | None


class WhereRefresh:
    """Pending changes whose verdict is looked at again on each of the next ``windows`` windows."""

    def __init__(self, windows: int):
        self.windows = int(windows)
        self.pending: deque[_Pending] = deque()
        # where_onset_slack: verdicts (at a report or a refresh) judged with the onset a window
        # earlier (`dynamiccl.detector.where._onset_slack`)
        self.counters = {"where_refreshed": 0, "where_updated": 0, "where_refresh_dropped": 0,
                         "where_onset_slack": 0}

    def watch(self, change_id: str, job: str, comms: list[int], onset_step: int, where: dict | None) -> None:
        """Keep the change pending (nothing when refreshing is off)."""
        if self.windows <= 0 or not comms:
            return
        if len(self.pending) >= MAX_PENDING:
            self.pending.popleft()
            self.counters["where_refresh_dropped"] += 1
        self.pending.append(_Pending(change_id, job, comms, onset_step, self.windows, where))

    def step(self, ranks: RankHistory, now_step: int, window_s: float, detected_s: float) -> list[WhereUpdate]:
        """One window on: the pending changes' refreshed verdicts that name another place."""
        out: list[WhereUpdate] = []
        keep: deque[_Pending] = deque()
        for p in self.pending:
            p.left -= 1
            self.counters["where_refreshed"] += 1
            w = self._verdict(ranks, p, now_step, window_s)
            if w is not None and not same_place(w, p.where):
                p.where = w
                self.counters["where_updated"] += 1
                out.append(WhereUpdate(p.id, p.job, detected_s, w))
            if p.left > 0:
                keep.append(p)
        self.pending = keep
        return out

    def _verdict(self, ranks: RankHistory, p: _Pending, now_step: int, window_s: float) -> dict | None:
        try:
            hit = locate(ranks, p.job, p.comms, onset_step=p.onset_step, now_step=now_step, window_s=window_s,
                         counters=self.counters)
        except ValueError:
            return None
        if hit is None:
            return None
        comm, w = hit
        return as_evidence(comm, w)


def as_evidence(comm: int, w: Where) -> dict:
    """The verdict as ``evidence["where"]`` carries it."""
    return {**w.as_dict(), "comm": f"0x{comm:016x}"}
