"""A central shard: partials in → merged windows → the same loop (detector, retuner) per unit.

A unit is a job, or one communicator partition ``<job>.<p>`` of a job split by communicator
(``bus.unit``; each is owned, merged, checkpointed and detected on its own, so a very large job's
merging spreads over the shards). A shard takes a message only for a unit it owns (:class:`ShardTable`);
a unit's windows go to its own ``Loop`` (built by ``make_loop``, the single-machine loop). After a window ran, the job's checkpoint
(the last window run; a JetStream key-value bucket or, in-process, a dict shared by the shards) moves
on, so a shard that takes a job over after a failover skips the windows its predecessor already ran:
no regime change is run twice.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, MutableMapping

from dynamiccl.scaleout.bus import Message, partition_of, subject, unit
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, WindowMerger
from dynamiccl.scaleout.wire import peek_header, read_partial

__all__ = ["CentralShard", "detector_loop"]

log = logging.getLogger(__name__)


def detector_loop(config, make_retuner: Callable[[str], Any] | None = None,
                  sinks: Callable[[str], list] | None = None) -> Callable[[str], Any]:
    """``make_loop`` for a shard: per job the single-machine ``Loop`` over the product's detector
    (``config``: a ``DetectorConfig``), with that job's retuner where ``make_retuner`` gives one (the
    CLI builds it: the retuner is not this layer's) and the change sinks ``sinks(job)``."""
    from dynamiccl.detector.service import Detector
    from dynamiccl.loop import Loop

    def make(u: str):
        # a partition's changes go to its job's combiner (a sink: scaleout/combiner.py), which feeds the
        # job's one retuner; a whole job's loop holds the retuner itself
        rt = make_retuner(u) if make_retuner is not None and partition_of(u) is None else None
        return Loop(Detector(config), rt, sinks=sinks(u) if sinks is not None else ())
    return make


class CentralShard:
    def __init__(self, name: str, config: MergerConfig, table: ShardTable,
                 checkpoints: MutableMapping[str, int], make_loop: Callable[[str], Any],
                 clock: Callable[[], float], *, bus_authenticated: bool = False):
        self.name, self.table, self.checkpoints = name, table, checkpoints
        # the bus refuses unknown publishers (this shard connects as a user, so the server has users):
        # with every node's peers authenticated too, the window is as trusted as a single collector's
        self.bus_authenticated = bus_authenticated
        self.merger = WindowMerger(config, clock)
        self._make_loop = make_loop
        self.loops: dict[str, Any] = {}
        self.counters = {"received": 0, "not_owned": 0, "malformed": 0, "windows_run": 0,
                         "windows_skipped": 0, "already_run": 0, "changes": 0, "subject_mismatch": 0}

    def handle(self, msg: Message) -> str:
        """File one message: "filed", or why not: "malformed", "not_owned" (the transport gives it back
        for the job's owner), "refused" (duplicate, late or unexpected; counted by the merger)."""
        self.counters["received"] += 1
        # a shard handling a message is running, so live: its last beat may predate 3 of its observer's
        # stalls (another shard's merges in the same process), and it would refuse its own jobs' partials
        self.table.beat(self.name)
        try:
            head = peek_header(msg.data)
            if msg.subject != subject(head["job"], head["node"], head["partition"]):
                # the subject is what the server authorised the publisher for (scaleout/auth.py): a partial
                # claiming another job, node or partition than its subject is refused whole
                self.counters["subject_mismatch"] += 1
                n = self.counters["subject_mismatch"]
                if n & (n - 1) == 0:                # logged at 1, 2, 4, 8, ...: a flood cannot flood the log
                    log.warning("shard %s: %s carries a partial of job %r node %r: refused (%d so far)", self.name,
                                msg.subject, head["job"], head["node"], n)
                return "malformed"
            u = unit(head["job"], head["partition"])   # the job, or one communicator partition of it
            if not self.table.owns(self.name, u):
                self.counters["not_owned"] += 1
                return "not_owned"
            if head["window"] <= self.checkpoints.get(u, -1 << 62):
                self.counters["already_run"] += 1   # redelivered after a failover: its window ran
                return "refused"
            reason = self.merger.refusal(u, head["node"], head["window"], head["part"], head["parts"])
            if reason is not None:                  # duplicate or late: settled without inflating it
                self.merger.refuse(reason)
                return "refused"
            p = read_partial(msg.data)              # checked and inflated; frames built per window at merge
        except ValueError as e:
            self.counters["malformed"] += 1
            log.warning("shard %s: %s: %s", self.name, msg.subject, e)
            return "malformed"
        return "filed" if self.merger.add(u, p) else "refused"

    def poll(self) -> list:
        """Run the windows now due; returns the loop steps."""
        self.table.beat(self.name)
        for job in self.merger.jobs():
            if not self.table.owns(self.name, job):
                self.merger.forget(job)             # moved away: its unacknowledged partials go to the owner
                self.loops.pop(job, None)
            elif job in self.checkpoints:           # run here or by the previous owner: gaps count from it
                self.merger.set_done(job, self.checkpoints[job])
        steps = []
        for job, wf in self.merger.due():
            w = int(round(wf.window_start / wf.window_s))
            if w <= self.checkpoints.get(job, -1 << 62):
                self.counters["windows_skipped"] += 1   # run by this job's previous owner
                continue
            wf.counters["inputs_authenticated"] = int(self.bus_authenticated and
                                                      wf.counters.get("inputs_authenticated", 0) == 1)
            loop = self.loops.get(job) or self.loops.setdefault(job, self._make_loop(job))
            step = loop.step(wf)
            self.checkpoints[job] = w
            self.counters["windows_run"] += 1
            self.counters["changes"] += len(step.changes)
            steps.append((job, step))
        return steps
