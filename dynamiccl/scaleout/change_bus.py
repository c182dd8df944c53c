"""The partitions' regime changes on their way to the job's combiner (``dynamiccl central --partitions``).

Every shard sends, for each window a partition unit ``<job>.<p>`` of its ran, a :class:`~.combiner.Note`
on ``dynamiccl.changes.<job>`` (core NATS; only shard users may publish or read it: scaleout/auth.py).
Every shard listens there; the one owning ``<job>.0`` feeds the notes to the job's
:class:`~.combiner.ChangeCombiner` and hands what it releases to ``deliver(job, change)`` (the change
sinks: the log, ``--changes``). Notes wait in a bounded queue (the oldest dropped and counted); a note
for a job this shard's combiner does not hold is counted and ignored. When ``<job>.0`` moves away the
combiner's open groups are released first (nothing is held back), and the new owner starts empty.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from dynamiccl.scaleout.bus import job_of, partition_of, unit
from dynamiccl.scaleout.combiner import ChangeCombiner, CombinerConfig, Note, changes_subject, decode_note, encode_note

__all__ = ["ChangeHub"]


class ChangeHub:
    def __init__(self, partitions: dict[str, int], owns: Callable[[str], bool], clock: Callable[[], float],
                 deliver: Callable[[str, object], None], *, tolerance_s: float = 2.0, max_wait_s: float = 10.0,
                 max_queued: int = 10_000):
        self.partitions = {j: k for j, k in partitions.items() if k > 1}
        self.owns, self.clock, self.deliver = owns, clock, deliver
        self.tolerance_s, self.max_wait_s = tolerance_s, max_wait_s
        self._in: deque[bytes] = deque()
        self._max_queued = max_queued
        self._out: list[tuple[str, bytes]] = []
        self.combiners: dict[str, ChangeCombiner] = {}
        self.counters = {"notes_sent": 0, "notes_received": 0, "notes_dropped": 0, "notes_malformed": 0,
                         "notes_not_combined": 0, "changes_combined": 0}

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
            note = Note(job, p, float(wf.window_start) + float(wf.window_s), tuple(step.changes))
            self._out.append((changes_subject(job), encode_note(note)))

    def outgoing(self) -> list[tuple[str, bytes]]:
        out, self._out = self._out, []
        self.counters["notes_sent"] += len(out)
        return out

    def receive(self, data: bytes) -> None:
        """A note from the bus (the subscription's callback): queued, bounded."""
        self.counters["notes_received"] += 1
        self._in.append(data)
        while len(self._in) > self._max_queued:
            self._in.popleft()
            self.counters["notes_dropped"] += 1

    def _combiner(self, job: str) -> ChangeCombiner | None:
        if not self.owns(unit(job, 0)):
            gone = self.combiners.pop(job, None)
            if gone is not None:                       # moved away: release what it held, hold nothing back
                self._hand(job, gone.flush())
            return None
        if job not in self.combiners:
            cfg = CombinerConfig(self.partitions[job], self.tolerance_s, self.max_wait_s)
            self.combiners[job] = ChangeCombiner(job, cfg, self.clock)
        return self.combiners[job]

    def _hand(self, job: str, changes) -> None:
        for rc in changes:
            self.counters["changes_combined"] += 1
            self.deliver(job, rc)

    def round(self) -> None:
        """Feed the queued notes to the combiners this shard holds; deliver what they release."""
        while self._in:
            try:
                note = decode_note(self._in.popleft())
            except ValueError:
                self.counters["notes_malformed"] += 1
                continue
            comb = self._combiner(note.job) if note.job in self.partitions else None
            if comb is None:
                self.counters["notes_not_combined"] += 1
                continue
            self._hand(note.job, comb.offer(note))
        for job in sorted(self.partitions):
            comb = self._combiner(job)
            if comb is not None:
                self._hand(job, comb.due())

    def close(self) -> None:
        for job, comb in sorted(self.combiners.items()):
            self._hand(job, comb.flush())
        self.combiners.clear()
