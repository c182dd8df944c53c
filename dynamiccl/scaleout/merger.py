"""The central tier's window merger and shard assignment (no detector here: :mod:`.central` runs it).

Merge rule: a (job, window) is merged when every expected node reported, nodes known silent
(:meth:`WindowMerger.set_silent`, no heartbeat) aside, unless windows between the last one merged and
this one are unseen while the bus has delivered messages of the job to another consumer that have not
been settled (another shard's or a dead one's, awaiting redelivery: an earlier window may be among
them, and merging this one first would make it late; bounded by ``max_lateness_s``); or ``lateness_s`` after its first partial arrived
(wall clock, injected) once the shard has read everything the bus holds for the job
(:meth:`WindowMerger.set_backlog`: a partial still queued on the bus, or held by a dead shard awaiting
redelivery, is behind the shard's reading, not missing) and a partial of a later window of the job has
arrived (the bus delivers past this window: a partial still missing is not stuck behind a stalled
publisher, as while a NATS server fails over); or ``max_lateness_s`` after its first partial whatever
the backlog (a shard that never catches up, or a job's last window, still merges). The nodes that had not reported are
counted missing (and named in the window's counters), a partial arriving after its window was merged
is counted late and dropped. Merges are keyed by (job, window, node, part): a second delivery of the
same partial is counted as a duplicate and changes nothing. A node's partial sent in several parts
(over the bus's message limit) counts as reported once all its parts arrived; a node whose parts are
still incomplete when the window merges is counted missing and its parts are left out (a window holds
a node's records whole or not at all).

Shards: rendezvous hashing of jobs over the live shards (a shard is live while its heartbeat is
younger than ``ttl_s``), so a dead shard's jobs move to the survivors within ``ttl_s`` and no other
job moves. An observer that itself did not run for over ``ttl_s / 2`` (its process stalled) does not
count that pause against the others (their heartbeats could not have been read either), for at most
two stalls per shard since its last beat: a dead shard's jobs move within ``ttl_s`` plus two of the
observer's stalls.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

from dynamiccl.collector.features import WindowFeatures
from dynamiccl.contracts.partition import check_partitions
from dynamiccl.scaleout.bus import unit
from dynamiccl.collector.processors.wait import WAIT_OUTCOMES
from dynamiccl.scaleout.features import MAX_WAIT_S, window_features
from dynamiccl.scaleout.partials import NodePartial, merge_partials
from dynamiccl.scaleout.wire import RawPartial, frames_of

__all__ = ["MergerConfig", "WindowMerger", "ShardTable", "owner", "units"]


@dataclass(frozen=True)
class MergerConfig:
    expected_nodes: dict[str, frozenset[str]]   # job -> the nodes that report its windows
    lateness_s: float = 2.0
    max_lateness_s: float = 30.0                # merged past this whatever the shard's backlog
    max_pending_windows: int = 64               # per job; the oldest is merged early past it
    max_wait_s: float = MAX_WAIT_S              # the waits' gap gate (the collector's window.max_wait_s)

    def validate(self) -> None:
        if not 0 < self.lateness_s <= self.max_lateness_s or self.max_pending_windows < 1 or not self.max_wait_s > 0:
            raise ValueError(f"merger config: 0 < lateness_s <= max_lateness_s, max_pending_windows >= 1 and "
                             f"max_wait_s > 0 (got {self.lateness_s}, {self.max_lateness_s}, "
                             f"{self.max_pending_windows}, {self.max_wait_s})")
        for job, nodes in self.expected_nodes.items():
            if not nodes:
                raise ValueError(f"merger config: job {job!r} expects no node")


def units(expected_nodes: dict[str, frozenset[str]], partitions: dict[str, int] | None = None
          ) -> dict[str, frozenset[str]]:
    """``job -> nodes`` as the central tier's units: a job split ``partitions[job]`` ways (its nodes'
    ``--partitions``) becomes its partitions ``<job>.<p>``, each expecting every node of the job (a node
    sends every partition a partial, empty or not); any other job stays one unit, named as before.

    >>> sorted(units({"a": frozenset({"n0"}), "b": frozenset({"n0"})}, {"b": 2}))
    ['a', 'b.0', 'b.1']
    """
    partitions = partitions or {}
    unknown = sorted(set(partitions) - set(expected_nodes))
    if unknown:
        raise ValueError(f"partitions given for unknown job(s) {unknown}")
    out = {}
    for job, nodes in expected_nodes.items():
        k = check_partitions(partitions.get(job, 1))
        out.update({job: nodes} if k == 1 else {unit(job, i): nodes for i in range(k)})
    return out


def _part(p) -> tuple[int, int]:
    """(part, parts) of a partial: wire ones carry them, a decoded whole one is part 0 of 1."""
    return p.get("part", 0), p.get("parts", 1)


@dataclass
class _Pending:
    first_seen: float
    parts: dict[str, dict[int, NodePartial]] = field(default_factory=dict)   # node -> part -> partial
    nparts: dict[str, int] = field(default_factory=dict)

    def reported(self) -> set[str]:
        """The nodes whose every part arrived."""
        return {n for n, got in self.parts.items() if len(got) == self.nparts[n]}


class WindowMerger:
    def __init__(self, config: MergerConfig, clock: Callable[[], float]):
        config.validate()
        self.config, self.clock = config, clock
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._merged_upto: dict[str, int] = {}
        self._backlog: dict[str, int] = {}
        self._elsewhere: dict[str, int] = {}
        self._silent: dict[str, frozenset[str]] = {}
        self._newest: dict[str, int] = {}
        self.counters = {"partials": 0, "duplicates": 0, "late": 0, "unknown_job": 0, "unknown_node": 0,
                         "windows_merged": 0, "nodes_missing": 0, "inconsistent_parts": 0, "incomplete_parts": 0,
                         "windows_empty": 0}

    def refusal(self, job: str, node: str, window: int, part: int = 0, parts: int = 1) -> str | None:
        """Why a partial of (job, node, window) would be refused (its counter's name), or None; read
        from the message header before the body is inflated, so a redelivery costs nothing."""
        nodes = self.config.expected_nodes.get(job)
        if nodes is None:
            return "unknown_job"
        if node not in nodes:
            return "unknown_node"
        if window <= self._merged_upto.get(job, -1 << 62):
            return "late"
        pend = self._pending.get((job, window))
        if pend is None or node not in pend.parts:
            return None
        if pend.nparts[node] != parts:
            return "inconsistent_parts"
        return "duplicates" if part in pend.parts[node] else None

    def refuse(self, reason: str) -> bool:
        self.counters[reason] += 1
        return False

    def add(self, job: str, p: NodePartial) -> bool:
        """File one partial; False (and counted) when it is a duplicate, late or unexpected."""
        part, parts = _part(p)
        reason = self.refusal(job, p["node"], p["window"], part, parts)
        if reason is not None:
            return self.refuse(reason)
        pend = self._pending.setdefault((job, p["window"]), _Pending(self.clock()))
        pend.parts.setdefault(p["node"], {})[part] = p
        pend.nparts[p["node"]] = parts
        self._newest[job] = max(p["window"], self._newest.get(job, p["window"]))
        self.counters["partials"] += 1
        return True

    def set_backlog(self, job: str, messages: int, elsewhere: int = 0) -> None:
        """How many of the job's messages the bus still holds for this shard (queued, or awaiting
        redelivery); while any, a window waits for its nodes up to ``max_lateness_s`` only.
        ``elsewhere``: those of them delivered to another consumer and not settled (a gap before a
        complete window waits while any)."""
        self._backlog[job] = max(0, int(messages))
        self._elsewhere[job] = max(0, int(elsewhere))

    def elsewhere(self, job: str) -> int:
        return self._elsewhere.get(job, 0)

    def set_done(self, job: str, window: int) -> None:
        """The job's last window run (its checkpoint, maybe by a previous owner): later windows are
        counted from it, earlier ones are late."""
        self._merged_upto[job] = max(int(window), self._merged_upto.get(job, -1 << 62))

    def set_silent(self, job: str, nodes: frozenset[str]) -> None:
        """Nodes known dead (no heartbeat): a window does not wait for them; they are counted missing."""
        self._silent[job] = frozenset(nodes)

    def _waits(self, job: str, w: int, pend: _Pending, expected: frozenset[str], now: float) -> bool:
        if expected - self._silent.get(job, frozenset()) <= pend.reported():
            gap = w > self._merged_upto.get(job, w - 1) + 1
            return (gap and self._elsewhere.get(job, 0) > 0
                    and now - pend.first_seen < self.config.max_lateness_s)
        behind = self._backlog.get(job, 0) > 0 or self._newest.get(job, w) <= w
        return now - pend.first_seen < (self.config.max_lateness_s if behind else self.config.lateness_s)

    def jobs(self) -> set[str]:
        """Jobs with windows pending."""
        return {job for job, _ in self._pending}

    def forget(self, job: str) -> int:
        """Drop a job's pending windows (the job moved to another shard); returns how many."""
        gone = [k for k in self._pending if k[0] == job]
        for k in gone:
            del self._pending[k]
        self._merged_upto.pop(job, None)
        self._backlog.pop(job, None)
        self._elsewhere.pop(job, None)
        self._silent.pop(job, None)
        self._newest.pop(job, None)
        return len(gone)

    def due(self) -> list[tuple[str, WindowFeatures]]:
        """Merged windows now due, per job in window order."""
        now, out = self.clock(), []
        per_job: dict[str, list[int]] = {}
        for job, w in self._pending:
            per_job.setdefault(job, []).append(w)
        for job, wins in per_job.items():
            wins.sort()
            expected = self.config.expected_nodes[job]
            for i, w in enumerate(wins):
                pend = self._pending[(job, w)]
                crowded = len(wins) - i > self.config.max_pending_windows
                if self._waits(job, w, pend, expected, now) and not crowded:
                    break                      # windows merge in order: a later one waits for this one
                wf = self._merge(job, w, expected)
                if wf is not None:
                    out.append((job, wf))
        return out

    def _merge(self, job: str, w: int, expected: frozenset[str]) -> WindowFeatures | None:
        """The merged window; None (counted ``windows_empty``) when no node's partial is whole."""
        pend = self._pending.pop((job, w))
        whole = pend.reported()
        missing = sorted(expected - whole)
        self._merged_upto[job] = w
        self.counters["windows_merged"] += 1
        self.counters["nodes_missing"] += len(missing)
        self.counters["incomplete_parts"] += sum(len(pend.parts[n]) for n in pend.parts.keys() - whole)
        parts = [p for n in sorted(whole) for p in pend.parts[n].values()]
        if not parts:
            self.counters["windows_empty"] += 1
            return None
        wf = window_features(merge_partials(_batched(parts)),
                             {"nodes_reported": len(whole), "nodes_missing": len(missing),
                              "missing_nodes": missing,
                              # every node's peers authenticated (the shard adds whether the bus did)
                              "inputs_authenticated": int(all(p.get("auth", False) for p in parts))},
                             max_wait_s=self.config.max_wait_s)
        # untimed instances by outcome, the withheld-for-lost-records ones by scope (scaleout/waits.py)
        for k in WAIT_OUTCOMES + ("lossy_communicator", "lossy_job"):
            self.counters[f"wait_{k}"] = self.counters.get(f"wait_{k}", 0) + wf.counters.get(f"wait_{k}", 0)
        return wf


def _batched(parts: list) -> list[NodePartial]:
    """Wire partials (still bytes) become one frame set for the whole window; decoded ones pass."""
    raws = [p for p in parts if isinstance(p, RawPartial)]
    return [p for p in parts if not isinstance(p, RawPartial)] + ([frames_of(raws)] if raws else [])


def _weight(job: str, shard: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{job}\0{shard}".encode(), digest_size=8).digest(), "big")


def owner(job: str, shards: list[str]) -> str | None:
    """The live shard owning ``job`` (rendezvous hashing).

    >>> owner("j", ["a", "b"]) in ("a", "b"), owner("j", [])
    (True, None)
    """
    return max(shards, key=lambda s: _weight(job, s)) if shards else None


class ShardTable:
    """Heartbeats of the shards; ``live`` are those heard from within ``ttl_s``.

    An observer that did not look for over ``ttl_s / 2`` (its process stalled: a long merge, a busy
    machine) does not count that pause against the others, whose heartbeats it could not read
    either; but it pardons a shard's silence for at most ``max_pardons`` stalls since that shard's
    last beat. A live shard beats between its observer's stalls (in the same process it runs between
    them; in another its queued beats arrive), so it is never expired by stalls alone; a dead one is
    expired at the first look after ``ttl_s`` of unpardoned silence, i.e. within ``ttl_s`` plus
    ``max_pardons`` stalls. (Pardoning every stall let a survivor that stalls between every look,
    busy merging, never take a dead shard's jobs.)"""

    def __init__(self, ttl_s: float, clock: Callable[[], float], max_pardons: int = 2):
        if ttl_s <= 0 or max_pardons < 0:
            raise ValueError(f"ttl_s must be > 0 and max_pardons >= 0 (got {ttl_s}, {max_pardons})")
        self.ttl_s, self.clock, self.max_pardons = ttl_s, clock, max_pardons
        self._seen: dict[str, float] = {}
        self._pardons: dict[str, int] = {}
        self._last_look = clock()
        self.pauses = 0

    def beat(self, shard: str) -> None:
        self._look(self.clock())          # a shard beating is its observer running
        self._seen[shard] = self.clock()
        self._pardons[shard] = 0

    def _look(self, now: float) -> None:
        gap, self._last_look = now - self._last_look, now
        if gap <= self.ttl_s / 2:
            return
        self.pauses += 1                   # this observer stalled: the pause is nobody's death
        for s, t in self._seen.items():
            if self._pardons[s] < self.max_pardons:
                self._pardons[s] += 1
                self._seen[s] = min(now, t + gap)

    def live(self) -> list[str]:
        now = self.clock()
        self._look(now)
        for s in [s for s, t in self._seen.items() if now - t > self.ttl_s]:
            del self._seen[s]          # expire the dead
            del self._pardons[s]
        return sorted(self._seen)

    def owns(self, shard: str, job: str) -> bool:
        return owner(job, self.live()) == shard
