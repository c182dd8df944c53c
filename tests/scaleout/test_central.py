"""Central merger and shards: lateness, missing and duplicate partials, failover without re-running."""
from __future__ import annotations

from dataclasses import dataclass, field

from dynamiccl.scaleout.bus import Message, msg_id, subject
from dynamiccl.scaleout.central import CentralShard
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, WindowMerger, owner
from dynamiccl.scaleout.wire import encode_partial
from tests.scaleout.helpers import Clock, events, partials

CFG = MergerConfig({"j": frozenset({"node0", "node1"})}, lateness_s=2.0)


def test_merged_when_all_reported_duplicates_change_nothing():
    parts = partials(events())
    m = WindowMerger(CFG, Clock())
    w = sorted(parts)[1]
    a, b = parts[w]
    assert m.add("j", a) and not m.add("j", a)
    assert m.due() == []
    assert m.add("j", b)
    (job, wf), = m.due()
    assert wf.counters["nodes_missing"] == 0 and m.counters["duplicates"] == 1
    assert not m.add("j", a) and m.counters["late"] == 1


def test_silent_node_reported_missing_after_lateness():
    parts = partials(events())
    clock = Clock()
    m = WindowMerger(CFG, clock)
    w = sorted(parts)[1]
    m.add("j", parts[w][0])
    clock.t = 1.9
    assert m.due() == []
    clock.t = 2.0
    (_, wf), = m.due()
    assert wf.counters["missing_nodes"] == ["node1"] and m.counters["nodes_missing"] == 1
    assert set(wf.ranks["host"].to_list()) == {"node0"}


def test_unknown_job_and_node_counted():
    p = next(iter(partials(events()).values()))[0]
    m = WindowMerger(MergerConfig({"k": frozenset({"x"})}), Clock())
    assert not m.add("j", p) and m.counters["unknown_job"] == 1
    m2 = WindowMerger(MergerConfig({"j": frozenset({"x"})}), Clock())
    assert not m2.add("j", p) and m2.counters["unknown_node"] == 1


@dataclass
class _Step:
    changes: list = field(default_factory=list)


class _Loop:
    def __init__(self, runs):
        self.runs = runs

    def step(self, wf):
        self.runs.append(wf.window_start)
        return _Step([f"change@{wf.window_start}"])


def _msgs(parts, w):
    return [Message(subject("j", p["node"]), encode_partial(p, "j"), msg_id("j", p["node"], w)) for p in parts[w]]


def test_failover_moves_job_and_runs_no_window_twice():
    parts = partials(events())
    clock, runs, ckpt = Clock(), [], {}
    table = ShardTable(ttl_s=1.5, clock=clock)
    shards = {n: CentralShard(n, CFG, table, ckpt, lambda job: _Loop(runs), clock) for n in ("s0", "s1")}
    for s in shards.values():
        s.poll()
    first = shards[owner("j", ["s0", "s1"])]
    other = shards[({"s0", "s1"} - {first.name}).pop()]
    w0, w1 = sorted(parts)[:2]
    for m in _msgs(parts, w0):
        assert first.handle(m) == "filed" and other.handle(m) == "not_owned"   # only the owner takes it
    first.poll()
    assert runs == [float(w0)]
    clock.t = 1.0
    other.poll()                                             # first stops beating: it died
    clock.t = 2.0
    assert table.live() == [other.name]
    for m in _msgs(parts, w0) + _msgs(parts, w1):            # redelivered after the failover
        other.handle(m)
    other.poll()
    assert runs == [float(w0), float(w1)] and other.counters["windows_skipped"] == 1
