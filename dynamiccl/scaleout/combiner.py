"""One job's regime changes from its communicator partitions: the per-job combiner before the job's
one retuner.

A job split by communicator (``<job>.<p>``, scaleout/bus.py) runs a detector per partition, so a
job-wide event — a bandwidth drop on every rank — is reported by every partition. The retuner must
see it once. Each partition's owner sends, after every window it ran, a :class:`Note` (its partition,
the window's end, the changes of that window) on ``dynamiccl.changes.<job>``; the combiner (with the
owner of the job's partition 0) groups changes of the same kind whose onsets (``start_s``) lie within
``tolerance_s`` of the group's first, at most one per partition (two changes of one partition are two
changes, as on one collector), and releases a group as one change once every partition has run past
its last detection by ``tolerance_s`` (nothing matching can still come), or ``max_wait_s`` after it
formed (a partition whose shard is failing over does not hold the job's retuner back for long). The
released change is the group's earliest (a slowdown whose members disagree on its kind: the detector's
size-response rule on their pooled fits, :func:`_kind`), with the union of every member's ``where`` (comms, names,
funcs, size buckets, ranks — the first member's first, so a straggler's rank stays first — and hosts)
and ``evidence["merged"]`` naming each member (partition, id, onset, detection, magnitude). A recovery
names the combined change it ends. A partition's change of the same event detected within ``merge_s``
of another's (the detector's own incident-merge rule; either order, as notes arrive in any) joins that group, or, once released, that
released change (counted ``merged_late``, nothing released): one partition may see a job-wide drop a few
seconds after another. Counters: notes, changes in, released, merged (members folded into
another), merged_late, forced (released by age), dropped (a bad note, a partition out of range, over ``max_groups``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable

from dynamiccl.contracts.partition import check_partitions
from dynamiccl.detector.classify import LARGE_BYTES, SLOPE_Z_MIN
from dynamiccl.detector.config_groups import IncidentConfig
from dynamiccl.detector.events import RegimeChange
from dynamiccl.scaleout.bus import token

__all__ = ["CombinerConfig", "ChangeCombiner", "Note", "changes_subject", "encode_note", "decode_note"]

CHANGES_PREFIX = "dynamiccl.changes"
MAX_NOTE_BYTES = 1 << 20
_MAX_REMEMBERED = 4096          # released changes' member ids kept for the recoveries that name them
_SNAPSHOT_IDS = 64              # of which a snapshot carries the newest


def changes_subject(job: str) -> str:
    """>>> changes_subject("j1")
    'dynamiccl.changes.j1'"""
    return f"{CHANGES_PREFIX}.{token('job', job)}"


@dataclass(frozen=True)
class CombinerConfig:
    partitions: int
    tolerance_s: float = 2.0        # onsets this close are one event (two windows of 1 s)
    max_wait_s: float = 10.0        # wall clock: a group waits no longer for a slow partition
    max_groups: int = 256           # open groups per job; past it the oldest is released early
    # a partition's change detected this soon after another partition's released change of the same event
    # joins it: the detector's own rule (incidents.merge_s: alarms this soon after an incident's detection
    # join it), so a job-wide drop one partition sees a few seconds later is one change, as on one collector
    merge_s: float = IncidentConfig().merge_s

    def validate(self) -> "CombinerConfig":
        check_partitions(self.partitions)
        if not (self.tolerance_s >= 0 and self.max_wait_s > 0 and self.max_groups >= 1 and self.merge_s >= 0):
            raise ValueError(f"combiner config: tolerance_s >= 0, max_wait_s > 0, max_groups >= 1, merge_s >= 0 (got "
                             f"{self.tolerance_s}, {self.max_wait_s}, {self.max_groups}, {self.merge_s})")
        return self


@dataclass(frozen=True)
class Note:
    """What one partition's loop produced for one window: its end (event time) and its changes."""
    job: str
    partition: int
    window_end: float
    changes: tuple[RegimeChange, ...] = ()
    #: with the job's retuner on (``--retune``): the window's retuner inputs (``retuner_feed.window_rows``)
    #: and the transients it closed (``retuner_feed.transient_json``); absent otherwise, so a note is as before
    window: dict | None = None
    ended: tuple[dict, ...] = ()


def encode_note(n: Note) -> bytes:
    d = {"v": 1, "job": n.job, "partition": n.partition, "window_end": n.window_end,
         "changes": [json.loads(c.to_json()) for c in n.changes]}
    if n.window is not None:
        d["window"], d["ended"] = n.window, list(n.ended)
    return json.dumps(d, separators=(",", ":"), allow_nan=False).encode()


def decode_note(data: bytes) -> Note:
    """A note from the bus; ValueError naming what is wrong."""
    if len(data) > MAX_NOTE_BYTES:
        raise ValueError(f"change note: {len(data)} bytes > {MAX_NOTE_BYTES}")
    try:
        d = json.loads(data)
        if d.get("v") != 1:
            raise ValueError(f"unsupported version {d.get('v')!r}")
        changes = tuple(RegimeChange.from_json(json.dumps(c)) for c in d["changes"])
        window, ended = d.get("window"), d.get("ended") or []
        if window is not None and not isinstance(window, dict) or not isinstance(ended, list):
            raise ValueError("'window' must be an object and 'ended' a list")
        return Note(token("job", str(d["job"])), int(d["partition"]), float(d["window_end"]), changes,
                    window, tuple(ended))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"change note: {type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class _Released:
    """A released change that a later partition's report of the same event may still join."""
    cid: str
    event: str
    detected_s: float
    partitions: frozenset[int]


@dataclass
class _Group:
    formed: float
    members: dict[int, RegimeChange] = field(default_factory=dict)   # partition -> its change

    @property
    def first(self) -> RegimeChange:
        return min(self.members.values(), key=lambda c: (c.detected_s, c.start_s))


#: a slowdown is one event whether a partition reads it as "bandwidth" or "latency": the kind is the
#: detector's reading of the size response over the streams it has, and a partition has fewer (on a
#: job-wide drop one partition said "latency", the other and the single collector "bandwidth")
_EVENT = {"bandwidth": "slowdown", "latency": "slowdown"}


def _event(kind: str) -> str:
    return _EVENT.get(kind, kind)


def _streams(c: RegimeChange) -> int:
    n = c.evidence.get("n_streams", 0) if isinstance(c.evidence, dict) else 0
    return n if isinstance(n, int) else 0


def _kind(cs: list[RegimeChange]) -> str:
    """The members' kind; where a slowdown's members disagree, the detector's size-response rule
    (detector/classify.py) on their pooled fits: a communicator lies in one partition, so the
    within-communicator slopes of the partitions pool by inverse variance into the job's slope; without
    a significant pooled slope (or the fits), the most affected member's size decides, as there."""
    kinds = {c.kind for c in cs}
    if len(kinds) == 1:
        return cs[0].kind
    fits = [c.evidence.get("size_response") or {} for c in cs]
    pairs = [(f["slope_per_doubling"], f["slope_se"]) for f in fits
             if isinstance(f.get("slope_per_doubling"), float) and isinstance(f.get("slope_se"), float) and f["slope_se"] > 0]
    if pairs:
        w = [1.0 / se ** 2 for _, se in pairs]
        slope = sum(b * wi for (b, _), wi in zip(pairs, w)) / sum(w)
        z = slope * sum(w) ** 0.5
        if abs(z) >= SLOPE_Z_MIN:
            return "bandwidth" if z > 0 else "latency"
    top = max(range(len(cs)), key=lambda i: abs(cs[i].magnitude))
    size = fits[top].get("fallback_bytes")
    if isinstance(size, (int, float)):
        return "bandwidth" if not size < LARGE_BYTES else "latency"
    return max(cs, key=lambda c: (_streams(c), -c.detected_s)).kind


def _union(lists) -> list:
    out: list = []
    for xs in lists:
        out.extend(x for x in xs if x not in out)
    return out


class ChangeCombiner:
    """``offer(note)`` and ``due()`` return the job's changes to hand to its retuner, in release order."""

    def __init__(self, job: str, config: CombinerConfig, clock: Callable[[], float], first_id: int = 0):
        self.job, self.config, self.clock = token("job", job), config.validate(), clock
        self._marks: dict[int, float] = {}          # partition -> end of the last window it ran
        self._groups: list[_Group] = []
        self._combined_of: dict[tuple[int, str], str] = {}   # (partition, change id) -> released id
        self._released = first_id               # ids go on from here (the job's combiner came back to this shard)
        self._recent: list[_Released] = []       # released changes a late member may still join (merge_s)
        self.counters = {"notes": 0, "changes_in": 0, "released": 0, "merged": 0, "forced": 0, "dropped": 0,
                         "merged_late": 0}

    def offer(self, note: Note) -> list[RegimeChange]:
        if note.job != self.job or not 0 <= note.partition < self.config.partitions:
            self.counters["dropped"] += 1
            return []
        self.counters["notes"] += 1
        self._marks[note.partition] = max(note.window_end, self._marks.get(note.partition, note.window_end))
        for rc in note.changes:
            self.counters["changes_in"] += 1
            self._file(note.partition, rc)
        return self.due()

    def _file(self, partition: int, rc: RegimeChange) -> None:
        if self._join_released(partition, rc):
            return
        tol = self.config.tolerance_s
        for g in self._groups:
            if (partition not in g.members and _event(g.first.kind) == _event(rc.kind)
                    and (abs(g.first.start_s - rc.start_s) <= tol
                         or abs(rc.detected_s - g.first.detected_s) <= self.config.merge_s)):
                g.members[partition] = rc
                return
        self._groups.append(_Group(self.clock(), {partition: rc}))

    def _join_released(self, partition: int, rc: RegimeChange) -> bool:
        """The merge rule after release: ``rc`` of a partition not yet in a released change of the same
        event, detected within ``merge_s`` of it (either side: partitions' notes arrive in any order), is that change (counted ``merged_late``; its
        recovery will name the released change). Changes no partition can still join are forgotten."""
        low = min((self._marks.get(p, float("-inf")) for p in range(self.config.partitions)))
        self._recent = [r for r in self._recent if low <= r.detected_s + self.config.merge_s + self.config.tolerance_s]
        for i, r in enumerate(self._recent):
            if (partition not in r.partitions and r.event == _event(rc.kind)
                    and abs(rc.detected_s - r.detected_s) <= self.config.merge_s):
                self._recent[i] = replace(r, partitions=r.partitions | {partition})
                self._combined_of[(partition, rc.id)] = r.cid
                self.counters["merged_late"] += 1
                return True
        return False

    def _ready(self, g: _Group, now: float) -> bool:
        if len(g.members) == self.config.partitions:
            return True
        last = max(c.detected_s for c in g.members.values())
        low = min((self._marks.get(p, float("-inf")) for p in range(self.config.partitions)))
        return low >= last + self.config.tolerance_s

    def due(self) -> list[RegimeChange]:
        """The groups that can no longer grow (or waited ``max_wait_s``), oldest detection first."""
        now, out, keep = self.clock(), [], []
        crowded = len(self._groups) - self.config.max_groups
        for i, g in enumerate(sorted(self._groups, key=lambda g: g.first.detected_s)):
            aged = now - g.formed >= self.config.max_wait_s or i < crowded
            if self._ready(g, now) or aged:
                self.counters["forced"] += not self._ready(g, now)
                out.append(self._release(g))
            else:
                keep.append(g)
        self._groups = keep
        return out

    @property
    def last_id(self) -> int:
        """The number in the last released change's id (``rc-<job>-combined-<n>``)."""
        return self._released

    def snapshot(self) -> bytes:
        """What a successor needs to go on (its marks, open groups, last id and the recent ids recoveries
        name): scaleout/change_bus.py keeps it in the liveness bucket for the next owner of ``<job>.0``."""
        ids = list(self._combined_of.items())[-_SNAPSHOT_IDS:]
        return json.dumps({"v": 1, "job": self.job, "released": self._released,
                           "marks": {str(p): t for p, t in self._marks.items()},
                           "groups": [{str(p): json.loads(c.to_json()) for p, c in g.members.items()} for g in self._groups],
                           "ids": [[p, i, c] for (p, i), c in ids],
                           "recent": [[r.cid, r.event, r.detected_s, sorted(r.partitions)]
                                      for r in self._recent[-_SNAPSHOT_IDS:]]}, separators=(",", ":")).encode()

    def restore(self, data: bytes) -> None:
        """Go on from a predecessor's :meth:`snapshot` (its open groups wait ``max_wait_s`` afresh);
        ValueError naming what is wrong, and nothing changed."""
        if len(data) > MAX_NOTE_BYTES:
            raise ValueError(f"combiner snapshot: {len(data)} bytes > {MAX_NOTE_BYTES}")
        try:
            d = json.loads(data)
            if d.get("v") != 1 or d.get("job") != self.job:
                raise ValueError(f"version {d.get('v')!r} of job {d.get('job')!r}")
            now, n = self.clock(), self.config.partitions
            marks = {int(p): float(t) for p, t in d["marks"].items()}
            groups = [_Group(now, {int(p): RegimeChange.from_json(json.dumps(c)) for p, c in g.items()})
                      for g in d["groups"]]
            ids = {(int(p), str(i)): str(c) for p, i, c in d["ids"]}
            recent = [_Released(str(c), str(e), float(t), frozenset(int(p) for p in ps))
                      for c, e, t, ps in d.get("recent", [])[-_SNAPSHOT_IDS:]]
            if not all(0 <= p < n for p in [*marks, *(p for g in groups for p in g.members),
                                            *(p for r in recent for p in r.partitions)]) or \
                    len(groups) > self.config.max_groups or any(not g.members for g in groups):
                raise ValueError("a partition out of range, an empty group or too many groups")
            released = int(d["released"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"combiner snapshot: {type(e).__name__}: {e}") from None
        self._released = max(self._released, released)
        self._marks, self._groups, self._recent = marks, groups, recent
        self._combined_of.update(ids)

    def mark(self, partition: int) -> float:
        """The end of the last window ``partition`` reported (-inf: none)."""
        return self._marks.get(partition, float("-inf"))

    def open_detected(self) -> float:
        """The earliest detection among the groups still open (inf: none): what the job's retuner may
        not run past yet (scaleout/retuner_feed.py)."""
        return min((g.first.detected_s for g in self._groups), default=float("inf"))

    def combined_id(self, partition: int, change_id: str) -> str | None:
        """The id of the released change that merged ``partition``'s ``change_id`` (None: not released)."""
        return self._combined_of.get((partition, change_id))

    def flush(self) -> list[RegimeChange]:
        """Every open group (the job's partition 0 moves away, or the shard stops)."""
        out = [self._release(g) for g in sorted(self._groups, key=lambda g: g.first.detected_s)]
        self._groups = []
        return out

    def _release(self, g: _Group) -> RegimeChange:
        first, members = g.first, sorted(g.members.items())
        self._released += 1
        cid = f"rc-{self.job}-combined-{self._released}"
        for p, c in members:
            self._combined_of[(p, c.id)] = cid
        while len(self._combined_of) > _MAX_REMEMBERED:    # bounded: a recovery names a recent change
            del self._combined_of[next(iter(self._combined_of))]
        recovers = first.recovers
        if first.recovers is not None:
            p0 = next(p for p, c in members if c is first)
            recovers = self._combined_of.get((p0, first.recovers), first.recovers)
        cs = [first] + [c for _, c in members if c is not first]
        merged = [{"partition": p, "id": c.id, "start_s": c.start_s, "detected_s": c.detected_s,
                   "magnitude": c.magnitude} for p, c in members]
        self.counters["released"] += 1
        self.counters["merged"] += len(members) - 1
        kind = _kind(cs)
        self._recent.append(_Released(cid, _event(kind), first.detected_s, frozenset(p for p, _ in members)))
        del self._recent[:-self.config.max_groups]          # bounded
        return replace(first, id=cid, job_id=self.job, kind=kind, recovers=recovers,
                       comms=_union(c.comms for c in cs), comm_names=_union(c.comm_names for c in cs),
                       funcs=_union(c.funcs for c in cs), size_buckets=_union(c.size_buckets for c in cs),
                       ranks=_union(c.ranks for c in cs), hosts=_union(c.hosts for c in cs),
                       evidence={**first.evidence, "merged": merged})
