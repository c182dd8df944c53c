"""Records lost outside the window aggregator's late / too-early gates, for the waits' lossy-window rule.

A lost record could be an instance's last enqueue, so a window whose communicator lost records gives no
waits for it (processors/wait.py, ``lossy_records``). The aggregator sees its own late, too-early and
``window_full`` drops; the others happen elsewhere, on other threads, and are told to it here as
**notes** (``LossLedger``, thread-safe, bounded), applied when the next window closes. What each cause
knows, and the rule it takes (``apply_note``):

============  =================================  ==========================================================
cause         known at the drop                  withheld
============  =================================  ==========================================================
window_full   job, communicator, window          that communicator in that window (in the aggregator)
queue_full    job, communicator, event time      that communicator in the window(s) of the records' times
flood         job, communicator, event time      the same (the receiver decoded the batch it refused)
clock_range   job, communicator; time untrusted  that communicator in every window open at the drop
delivery_gap  job (and host) only; no times      the whole job in every window open at the gap, up to the
                                                 window of the first record after the jump
ledger_full   nothing kept                       every job in every window open when the note was refused
============  =================================  ==========================================================

A record whose window is already closed, or further ahead than ``max_open_windows`` past the open ones,
counts against the next window to close, as a late or too-early drop does. Bytes lost before decoding (a
malformed frame, a refused connection) are not notes: the plugin's next records on a new connection show
them as a ``record_seq`` jump, a delivery gap.

Bounds: at most ``MAX_NOTES`` notes and ``MAX_NOTE_RECORDS`` records held between two window closes (past
either a note is refused, counted as ``ledger_full``, and the conservative rule above applies); per window
the communicators tracked are bounded by ``LostRecords`` (MAX_LOSSY_COMMS, past it the job).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from dynamiccl.collector.metrics import LOSS_CAUSES
from dynamiccl.collector.records import event_time_ns

__all__ = ["LOSS_CAUSES", "LossNote", "LossLedger", "MAX_NOTES", "MAX_NOTE_RECORDS"]

#: notes held between two window closes (a note is one dropped batch or one gap, never one record)
MAX_NOTES = 4096
#: records held by those notes (their communicator and event time columns)
MAX_NOTE_RECORDS = 1 << 20


@dataclass(slots=True)
class LossNote:
    """Records of job ``job_id`` lost by ``cause``: ``events`` the decoded records (None: not decoded, a
    delivery gap of ``n`` records); ``timed``: whether their event times say their windows (False for a
    clock-range refusal: every open window); ``t_hi_ns``: for a gap, the event time of the latest record
    after it (the lost ones are older), or None."""
    cause: str
    job_id: str
    n: int
    events: np.ndarray | None = None
    timed: bool = True
    t_hi_ns: int | None = None


class LossLedger:
    """Notes from any thread (``note``: O(1), one short lock), taken by the aggregator's thread at a close."""

    def __init__(self, max_notes: int = MAX_NOTES, max_records: int = MAX_NOTE_RECORDS) -> None:
        self.max_notes, self.max_records = max_notes, max_records
        self._lock = threading.Lock()
        self._notes: list[LossNote] = []
        self._records = 0
        self._refused = 0           # records of notes refused past the bounds since the last take

    def note(self, note: LossNote) -> None:
        if note.n <= 0:
            return
        held = len(note.events) if note.events is not None else 0
        with self._lock:
            if len(self._notes) >= self.max_notes or self._records + held > self.max_records:
                self._refused += note.n
                return
            self._notes.append(note)
            self._records += held

    def take(self) -> tuple[list[LossNote], int]:
        """(the notes, records of refused notes) since the last call; start afresh."""
        with self._lock:
            out = self._notes, self._refused
            self._notes, self._records, self._refused = [], 0, 0
        return out


def note_windows(note: LossNote, closing: int, open_w: list[int], window_ns: int,
                 ahead: int) -> np.ndarray:
    """The windows ``note``'s records count against when window ``closing`` closes and ``open_w`` are open
    (``closing`` first): per record when their event times say it (a window already closed, or more than
    ``ahead`` windows past the open ones, counts as ``closing``, the next to close, as a late or too-early
    drop does), else the windows to mark for all of them (every open one; for a gap those up to the first
    record after it, including windows not open yet).

    >>> ev = np.zeros(3, [("timing_source", "u1"), ("gpu_start_ns", "u8"), ("enqueue_ns", "u8")])
    >>> ev["enqueue_ns"] = [5, 25, 95]
    >>> note_windows(LossNote("queue_full", "j", 3, ev), 1, [1, 2], 10, 4).tolist()
    [1, 2, 1]
    >>> note_windows(LossNote("delivery_gap", "j", 3, t_hi_ns=45), 1, [1, 2], 10, 4).tolist()
    [1, 2, 3, 4]
    """
    ev = note.events
    horizon = max(open_w) + ahead
    if ev is not None and note.timed:
        w = event_time_ns(ev) // window_ns
        return np.where((w >= closing) & (w <= horizon), w, closing)
    if ev is not None or note.t_hi_ns is None:
        return np.array(open_w, np.int64)
    hi = min(note.t_hi_ns // window_ns, horizon)    # a gap: no record after it is older than the lost ones
    marked = [w for w in open_w if w <= hi] + list(range(max(open_w) + 1, hi + 1))
    return np.array(marked or [closing], np.int64)
