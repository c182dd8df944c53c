"""The central tier's window merger and shard assignment (no detector here: :mod:`.central` runs it).

Merge rule: a (job, window) is merged when every expected node reported, or ``lateness_s`` after its
first partial arrived (wall clock, injected), whichever is first; the nodes that had not reported are
counted missing (and named in the window's counters), a partial arriving after its window was merged
is counted late and dropped. Merges are keyed by (job, window, node): a second delivery of the same
partial is counted as a duplicate and changes nothing.

Shards: rendezvous hashing of jobs over the live shards (a shard is live while its heartbeat is
younger than ``ttl_s``), so a dead shard's jobs move to the survivors within ``ttl_s`` and no other
job moves.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

from dynamiccl.collector.features import WindowFeatures
from dynamiccl.scaleout.features import window_features
from dynamiccl.scaleout.partials import NodePartial, merge_partials

__all__ = ["MergerConfig", "WindowMerger", "ShardTable", "owner"]


@dataclass(frozen=True)
class MergerConfig:
    expected_nodes: dict[str, frozenset[str]]   # job -> the nodes that report its windows
    lateness_s: float = 2.0
    max_pending_windows: int = 64               # per job; the oldest is merged early past it

    def validate(self) -> None:
        if not self.lateness_s > 0 or self.max_pending_windows < 1:
            raise ValueError(f"merger config: lateness_s > 0 and max_pending_windows >= 1 "
                             f"(got {self.lateness_s}, {self.max_pending_windows})")
        for job, nodes in self.expected_nodes.items():
            if not nodes:
                raise ValueError(f"merger config: job {job!r} expects no node")


@dataclass
class _Pending:
    first_seen: float
    parts: dict[str, NodePartial] = field(default_factory=dict)


class WindowMerger:
    def __init__(self, config: MergerConfig, clock: Callable[[], float]):
        config.validate()
        self.config, self.clock = config, clock
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._merged_upto: dict[str, int] = {}
        self.counters = {"partials": 0, "duplicates": 0, "late": 0, "unknown_job": 0, "unknown_node": 0,
                         "windows_merged": 0, "nodes_missing": 0}

    def add(self, job: str, p: NodePartial) -> bool:
        """File one partial; False (and counted) when it is a duplicate, late or unexpected."""
        c = self.counters
        nodes = self.config.expected_nodes.get(job)
        if nodes is None:
            c["unknown_job"] += 1
            return False
        if p["node"] not in nodes:
            c["unknown_node"] += 1
            return False
        if p["window"] <= self._merged_upto.get(job, -1 << 62):
            c["late"] += 1
            return False
        pend = self._pending.setdefault((job, p["window"]), _Pending(self.clock()))
        if p["node"] in pend.parts:
            c["duplicates"] += 1
            return False
        pend.parts[p["node"]] = p
        c["partials"] += 1
        return True

    def jobs(self) -> set[str]:
        """Jobs with windows pending."""
        return {job for job, _ in self._pending}

    def forget(self, job: str) -> int:
        """Drop a job's pending windows (the job moved to another shard); returns how many."""
        gone = [k for k in self._pending if k[0] == job]
        for k in gone:
            del self._pending[k]
        self._merged_upto.pop(job, None)
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
                if len(pend.parts) < len(expected) and now - pend.first_seen < self.config.lateness_s \
                        and not crowded:
                    break                      # windows merge in order: a later one waits for this one
                out.append((job, self._merge(job, w, expected)))
        return out

    def _merge(self, job: str, w: int, expected: frozenset[str]) -> WindowFeatures:
        pend = self._pending.pop((job, w))
        missing = sorted(expected - set(pend.parts))
        self._merged_upto[job] = w
        self.counters["windows_merged"] += 1
        self.counters["nodes_missing"] += len(missing)
        return window_features(merge_partials(list(pend.parts.values())),
                               {"nodes_reported": len(pend.parts), "nodes_missing": len(missing),
                                "missing_nodes": missing})


def _weight(job: str, shard: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{job}\0{shard}".encode(), digest_size=8).digest(), "big")


def owner(job: str, shards: list[str]) -> str | None:
    """The live shard owning ``job`` (rendezvous hashing).

    >>> owner("j", ["a", "b"]) in ("a", "b"), owner("j", [])
    (True, None)
    """
    return max(shards, key=lambda s: _weight(job, s)) if shards else None


class ShardTable:
    """Heartbeats of the shards; ``live`` are those heard from within ``ttl_s``."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]):
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.ttl_s, self.clock = ttl_s, clock
        self._seen: dict[str, float] = {}

    def beat(self, shard: str) -> None:
        self._seen[shard] = self.clock()

    def live(self) -> list[str]:
        now = self.clock()
        for s in [s for s, t in self._seen.items() if now - t > self.ttl_s]:
            del self._seen[s]          # expire the dead
        return sorted(self._seen)

    def owns(self, shard: str, job: str) -> bool:
        return owner(job, self.live()) == shard
