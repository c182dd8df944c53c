"""The partitions' regime changes on their way to the job's combiner (``dynamiccl central --partitions``).

Every shard sends, for each window a partition unit ``<job>.<p>`` of its ran, a :class:`~.combiner.Note`
on ``dynamiccl.changes.<job>`` (core NATS; only shard users may publish or read it: scaleout/auth.py).
Every shard listens there; the one owning ``<job>.0`` feeds the notes to the job's
:class:`~.combiner.ChangeCombiner` and hands what it releases to ``deliver(job, change)`` (the change
sinks: the log, ``--changes``). Notes wait in a bounded queue (the oldest dropped and counted); a note
for a job this shard's combiner does not hold is counted and ignored. The combiner's state is saved
(``snapshots``: the caller puts it in the liveness bucket) and the next owner of ``<job>.0`` goes on
from it (``stored``), replaying the notes it heard since; so a shard whose ``<job>.0`` moves away hands
its open groups on unreleased. Without a store (in-process) it releases them first, and the next owner
starts empty.

With the job's retuner on (``retuner``: job -> its ``JobRetuner``, on every shard alike) each note
also carries the window's retuner inputs and the transients it closed; the owner of ``<job>.0`` joins
the partitions' windows and hands them with the combined changes to the job's one retuner in the
loop's order (scaleout/retuner_feed.py). A note whose job is not its subject's is refused
(``notes_subject_mismatch``): the subject is what the server authorised.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable

from dynamiccl.scaleout.bus import job_of, partition_of, unit
from dynamiccl.scaleout.combiner import ChangeCombiner, CombinerConfig, Note, changes_subject, decode_note, encode_note
from dynamiccl.scaleout.retuner_feed import JobFeed, rows_frame, transient_json, transient_of, window_rows

__all__ = ["ChangeHub"]

log = logging.getLogger(__name__)


class ChangeHub:
    def __init__(self, partitions: dict[str, int], owns: Callable[[str], bool], clock: Callable[[], float],
                 deliver: Callable[[str, object], None], *, tolerance_s: float = 2.0, max_wait_s: float = 10.0,
                 max_queued: int = 10_000, retuner: Callable[[str], Any] | None = None,
                 bus_authenticated: bool = False, stored: Callable[[str], bytes | None] | None = None,
                 recent: int = 256, resave_s: float = 20.0):
        self.partitions = {j: k for j, k in partitions.items() if k > 1}
        self.owns, self.clock, self.deliver = owns, clock, deliver
        self.tolerance_s, self.max_wait_s = tolerance_s, max_wait_s
        self.retuner, self.bus_authenticated = retuner, bus_authenticated
        self._in: deque[tuple[str | None, bytes]] = deque()
        self._max_queued = max_queued
        self._out: list[tuple[str, bytes]] = []
        self.combiners: dict[str, ChangeCombiner] = {}
        self.feeds: dict[str, JobFeed] = {}
        self._ids: dict[str, int] = {}             # job -> last combined id of its combiner here
        # durable combiner (the liveness bucket): ``stored(job)`` is the last snapshot its owner saved; notes
        # heard while another shard combined are kept (bounded) to replay what that snapshot lacks
        self.stored, self.resave_s = stored, resave_s
        self._recent: dict[str, deque[Note]] = {j: deque(maxlen=recent) for j in self.partitions}
        self._dirty: set[str] = set()
        self._saved_at: dict[str, float] = {}
        self.closed = False
        self.counters = {"notes_sent": 0, "notes_received": 0, "notes_dropped": 0, "notes_malformed": 0,
                         "notes_not_combined": 0, "changes_combined": 0, "notes_subject_mismatch": 0,
                         "note_window_bytes": 0, "note_window_rows": 0, "retuner_windows_dropped": 0,
                         "combiner_restored": 0, "combiner_restore_failed": 0, "notes_replayed": 0}

    @property
    def subjects(self) -> list[str]:
        return [changes_subject(j) for j in sorted(self.partitions)]

    def steps(self, steps) -> None:
        """The loop steps a shard round ran: one note per window of a partition unit, queued to send."""
        for u, step in steps:
            p, job = partition_of(u), job_of(u)
            if p is None or job not in self.partitions:
                continue
            wf = step.window
            window = ended = None
            if self.retuner is not None:           # the job's retuner (on partition 0's owner) needs them
                window, ended = window_rows(wf), tuple(transient_json(te) for te in step.ended)
            note = Note(job, p, float(wf.window_start) + float(wf.window_s), tuple(step.changes), window, ended or ())
            data = encode_note(note)
            if window is not None:
                self.counters["note_window_bytes"] += len(data) - len(encode_note(Note(job, p, note.window_end,
                                                                                        note.changes)))
                self.counters["note_window_rows"] += wf.keys.height
            self._out.append((changes_subject(job), data))

    def outgoing(self) -> list[tuple[str, bytes]]:
        out, self._out = self._out, []
        self.counters["notes_sent"] += len(out)
        return out

    def receive(self, data: bytes, subject: str | None = None) -> None:
        """A note from the bus (the subscription's callback, with the subject it came on): queued, bounded."""
        self.counters["notes_received"] += 1
        self._in.append((subject, data))
        while len(self._in) > self._max_queued:
            self._in.popleft()
            self.counters["notes_dropped"] += 1

    def _combiner(self, job: str) -> ChangeCombiner | None:
        if self.closed:
            return None
        if not self.owns(unit(job, 0)):
            gone = self.combiners.pop(job, None)
            if gone is not None:
                if self.stored is None:                # moved away, no successor will go on: hold nothing back
                    self._hand(job, gone.flush())
                self._ids[job] = gone.last_id          # else the next owner goes on from the saved state
            feed = self.feeds.pop(job, None)
            if feed is not None:                       # the new owner's retuner starts from the job's tuner file
                self.counters["retuner_windows_dropped"] += feed.join.drop_all()
            return None
        if job not in self.combiners:
            cfg = CombinerConfig(self.partitions[job], self.tolerance_s, self.max_wait_s)
            # a job's ids go on when its partition 0 comes back: this shard's retuner of the job (kept) and
            # its change sinks must never see one id name two changes
            comb = self.combiners[job] = ChangeCombiner(job, cfg, self.clock, self._ids.get(job, 0))
            if self.retuner is not None:
                self.feeds[job] = JobFeed(job, self.partitions[job], self.retuner(job), comb,
                                          self.clock, bus_authenticated=self.bus_authenticated,
                                          lateness_s=self.max_wait_s, counters=self.counters)
            self._resume(job, comb)
        return self.combiners[job]

    def _resume(self, job: str, comb: ChangeCombiner) -> None:
        """Go on from the previous owner's saved state, then replay the notes heard since it saved it
        (without a snapshot nothing is replayed: what the previous owner released is unknown)."""
        recent, self._recent[job] = self._recent[job], deque(maxlen=self._recent[job].maxlen)
        data = self.stored(job) if self.stored is not None else None
        if not data:
            return
        try:
            comb.restore(data)
        except ValueError as e:
            self.counters["combiner_restore_failed"] += 1
            log.warning("job %s: the combiner's saved state is unusable (%s); it starts empty", job, e)
            return
        self.counters["combiner_restored"] += 1
        for note in recent:
            if note.window_end > comb.mark(note.partition):
                self.counters["notes_replayed"] += 1
                self._offer(comb, note)

    def snapshots(self) -> list[tuple[str, bytes]]:
        """The combiners' states to save: changed since saved, or not saved for ``resave_s`` (the
        bucket's entries expire)."""
        now, out = self.clock(), []
        for job, comb in sorted(self.combiners.items()):
            if job in self._dirty or now - self._saved_at.get(job, -1e300) >= self.resave_s:
                out.append((job, comb.snapshot()))
                self._saved_at[job] = now
        self._dirty.clear()
        if self.closed:
            self.combiners.clear()
            self.feeds.clear()
        return out

    def unsaved(self, job: str) -> None:
        """Saving ``job``'s state failed: try again next round."""
        self._dirty.add(job)

    def _hand(self, job: str, changes) -> None:
        changes = list(changes)
        for rc in changes:
            self.counters["changes_combined"] += 1
            self.deliver(job, rc)
        if job in self.feeds:
            self.feeds[job].changes(changes)

    def _note(self, subject: str | None, data: bytes) -> Note | None:
        """The note, or None (malformed, or another job's than its subject's: counted)."""
        try:
            note = decode_note(data)
            if subject is not None and subject != changes_subject(note.job):
                self.counters["notes_subject_mismatch"] += 1
                return None
        except (ValueError, KeyError, TypeError) as e:
            self.counters["notes_malformed"] += 1
            log.debug("change note: %s", e)
            return None
        return note

    def _rows(self, note: Note):
        """(window rows, transients) of a note for the job's retuner; False (counted) when malformed:
        the whole note is refused, its changes too."""
        try:
            return rows_frame(note.job, note.window), tuple(transient_of(note.job, e) for e in note.ended)
        except (ValueError, KeyError, TypeError) as e:
            self.counters["notes_malformed"] += 1
            log.debug("change note's window: %s", e)
            return False

    def round(self) -> None:
        """Feed the queued notes to the combiners this shard holds; deliver what they release."""
        while self._in:
            note = self._note(*self._in.popleft())
            if note is None:
                continue
            comb = self._combiner(note.job) if note.job in self.partitions else None
            if comb is None:
                self.counters["notes_not_combined"] += 1
                if note.job in self._recent:
                    self._recent[note.job].append(note)
                continue
            self._offer(comb, note)
        for job in sorted(self.partitions):
            comb = self._combiner(job)
            if comb is not None:
                released = comb.due()
                if released:
                    self._dirty.add(job)
                self._hand(job, released)
                if job in self.feeds:
                    self.feeds[job].run()

    def _offer(self, comb: ChangeCombiner, note: Note) -> None:
        feed = self.feeds.get(note.job)
        rows = self._rows(note) if feed is not None and note.window is not None else None
        if rows is False:
            return
        self._dirty.add(note.job)
        self._hand(note.job, comb.offer(note))
        if feed is not None and rows is not None and 0 <= note.partition < self.partitions[note.job]:
            feed.window(note.partition, *rows)

    def close(self) -> None:
        """The shard stops: release every open group and hand the retuner what it held; the combiners'
        states after that are the last :meth:`snapshots` (so the next owner does not release them again)."""
        for job, comb in sorted(self.combiners.items()):
            self._hand(job, comb.flush())
            if job in self.feeds:
                self.feeds[job].flush()
            self._dirty.add(job)
        self.closed = True
