"""An incident (one regime change being tracked) and an alarm group waiting for confirmation,
the records the fusion stage keeps between windows."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .events import RegimeChange, TransientEnd

__all__ = ["Incident", "Alarms", "Pending", "new_group", "extend_group", "MAX_INCIDENTS_PER_JOB", "MAX_PENDING",
           "MAX_EVIDENCE_STREAMS", "MAX_SILENT", "RECHECK_LATENCY_SHARE"]

MAX_INCIDENTS_PER_JOB = 64
MAX_PENDING = 4096
MAX_EVIDENCE_STREAMS = 12
MAX_OFF_RUN = 64           # old-side windows of an incident remembered (the recovery judges the last few)
MAX_SILENT = 64            # windows a pending group may wait for its streams' next value


@dataclass
class Incident:
    id: str
    job: str
    kind: str
    direction: int
    streams: np.ndarray
    base_med: np.ndarray
    base_scale: np.ndarray
    level: np.ndarray
    onset_step: int
    detected_step: int
    change: RegimeChange
    off_count: int = 0
    deeper_run: int = 0                        # windows in a row beyond the level (`Tracking._deeper`)
    deeper_from: int = 0
    last_move: float = 0.0                     # last window's median move beyond the level
    softer_run: int = 0                        # windows in a row back from the level (`Tracking._softer`)
    softer_from: int = 0
    last_back: float = 0.0                     # last window's median move back from the level
    off_scores: deque = field(default_factory=lambda: deque(maxlen=MAX_OFF_RUN))   # run of old-side positions
    on: bool = True
    onsets: list[int] = field(default_factory=list)
    flapping_id: str | None = None
    closed_step: int | None = None
    rank_of: tuple[int, int] | None = None     # (comm_hash, rank): opened by rank evidence alone
    step_ids: list[str] = field(default_factory=list)   # deeper / softer steps (`dynamiccl.detector.steps`)
    level_step: int = -1                       # bank step its level was last set by a step (`steps`)
    transient: bool = False                    # closed as a transient excursion (`Tracking._transient`)

    @property
    def ids(self) -> list[str]:
        return [self.id] + ([self.flapping_id] if self.flapping_id else []) + self.step_ids

    def end(self, start_s: float, detected_s: float, magnitude: float) -> TransientEnd:
        """Its end without a ``recovery`` change (a transient, an adopted improvement, an incident
        whose streams all left it): the loop hands it to the retuner, the service ends its gauges."""
        c = self.change
        return TransientEnd(
            id=f"{c.id}.end", job_id=self.job, ends=tuple(self.ids), start_s=start_s, detected_s=detected_s,
            magnitude=magnitude, comms=tuple(c.comms), comm_names=tuple(c.comm_names), funcs=tuple(c.funcs),
            size_buckets=tuple(c.size_buckets), ranks=tuple(c.ranks), hosts=tuple(c.hosts))

    def add(self, idx, med, scale, level) -> None:
        new = ~np.isin(idx, self.streams)
        if new.any():
            self.streams = np.concatenate([self.streams, idx[new]])
            self.base_med = np.concatenate([self.base_med, med[new]])
            self.base_scale = np.concatenate([self.base_scale, scale[new]])
            self.level = np.concatenate([self.level, level[new]])

    def drop(self, idx) -> None:
        keep = ~np.isin(self.streams, idx)
        self.streams, self.base_med = self.streams[keep], self.base_med[keep]
        self.base_scale, self.level = self.base_scale[keep], self.level[keep]


# collectives whose baseline latency is at least this share of a window are long against it
# (the test bed's: 2-60 % of 0.5 s; the simulated jobs': <= 0.5 % of 1 s): many of the onset
# window's instances were in flight when the change began (`straggler_recheck`)
RECHECK_LATENCY_SHARE = 0.02


@dataclass
class Alarms:
    """Alarmed streams of one job and direction: their pre-alarm baselines and CUSUM starts."""
    job: str
    direction: int
    idx: np.ndarray
    med: np.ndarray
    scale: np.ndarray
    start: np.ndarray


@dataclass
class Pending(Alarms):
    """An alarm group waiting for confirmation (or for one more window)."""
    step: int
    tries: int = 0
    silent: int = 0        # windows without a value of its streams (not tries)
    peak: bool = False     # judged on its alarm window once confirmed (deferred for rank evidence)


def new_group() -> dict:
    return {"idx": [], "med": [], "scale": [], "start": [], "confirmed": False}


def extend_group(g: dict, idx, med, scale, start, *, confirmed: bool) -> None:
    g["idx"].append(np.asarray(idx, np.int64))
    g["med"].append(np.asarray(med, np.float64))
    g["scale"].append(np.asarray(scale, np.float64))
    g["start"].append(np.asarray(start, np.int64))
    g["confirmed"] = g["confirmed"] or confirmed
