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


def _node0_filed():
    """A merger holding node0's partial of a window (node1's still out): parts, clock, merger, window."""
    parts, clock = partials(events()), Clock()
    m = WindowMerger(CFG, clock)
    w = sorted(parts)[1]
    m.add("j", parts[w][0])
    return parts, clock, m, w


def test_silent_node_reported_missing_after_lateness():
    parts, clock, m, w = _node0_filed()
    clock.t = 2.0
    assert m.due() == []                # past the lateness, but nothing later arrived: the bus may be stalled
    m.add("j", parts[w + 1][0])         # node0 delivers the next window: the bus is flowing
    clock.t = 2.1
    (_, wf), = m.due()
    assert wf.counters["missing_nodes"] == ["node1"] and m.counters["nodes_missing"] == 1
    assert set(wf.ranks["host"].to_list()) == {"node0"}


def test_a_stalled_bus_delays_a_window_up_to_max_lateness():
    parts, clock, m, w = _node0_filed()
    clock.t = CFG.max_lateness_s - 0.1
    assert m.due() == []
    m.add("j", parts[w][1])             # the stalled partial arrives: complete, nothing missing
    (_, wf), = m.due()
    assert wf.counters["nodes_missing"] == 0
    m.add("j", parts[w + 1][0])
    clock.t += CFG.max_lateness_s       # a job's last window: merged after max_lateness_s
    (_, wf), = m.due()
    assert wf.counters["missing_nodes"] == ["node1"]


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


def _two_shards():
    """Two shards over one table and checkpoint store, both beaten once: (clock, runs, table, first,
    other), ``first`` owning job "j"."""
    clock, runs, ckpt = Clock(), [], {}
    table = ShardTable(ttl_s=1.5, clock=clock)
    shards = {n: CentralShard(n, CFG, table, ckpt, lambda job: _Loop(runs), clock) for n in ("s0", "s1")}
    for s in shards.values():
        s.poll()
    first = shards[owner("j", ["s0", "s1"])]
    return clock, runs, table, first, shards[({"s0", "s1"} - {first.name}).pop()]


def test_failover_moves_job_and_runs_no_window_twice():
    parts = partials(events())
    clock, runs, table, first, other = _two_shards()
    w0, w1 = sorted(parts)[:2]
    for m in _msgs(parts, w0):
        assert first.handle(m) == "filed" and other.handle(m) == "not_owned"   # only the owner takes it
    first.poll()
    assert runs == [float(w0)]
    for t in (0.5, 1.0, 1.5, 2.0):                           # first stops beating: it died
        clock.t = t
        other.poll()
    assert table.live() == [other.name]
    for m in _msgs(parts, w0) + _msgs(parts, w1):            # redelivered after the failover
        other.handle(m)
    other.poll()
    assert runs == [float(w0), float(w1)] and other.counters["already_run"] == 2   # w0's two partials
    assert other.merger.counters["nodes_missing"] == 0       # nothing merged again, so none counted missing


def test_a_stalled_observer_does_not_declare_its_peers_dead():
    clock = Clock()
    table = ShardTable(ttl_s=1.5, clock=clock)
    table.beat("s0")
    table.beat("s1")
    clock.t = 5.0                       # the whole process stalled 5 s (nobody could beat)
    table.beat("s0")
    assert table.live() == ["s0", "s1"] and table.pauses == 1
    for t in (5.5, 6.0, 6.5, 7.0):      # now looking regularly: s1's silence counts
        clock.t = t
        table.beat("s0")
        table.live()
    assert table.live() == ["s0"]


def test_a_window_waits_while_the_bus_still_holds_the_jobs_partials():
    parts = partials(events())
    clock = Clock()
    m = WindowMerger(MergerConfig({"j": frozenset({"node0", "node1"})}, lateness_s=2.0, max_lateness_s=10.0), clock)
    w = sorted(parts)[1]
    m.add("j", parts[w][0])
    m.add("j", parts[w + 1][0])
    m.set_backlog("j", 300)             # node1's partial may be among the 300 not yet read
    clock.t = 3.0
    assert m.due() == []
    m.set_backlog("j", 0)               # read everything: node1 is missing
    (_, wf), = m.due()
    assert wf.counters["missing_nodes"] == ["node1"]
    m.set_backlog("j", 5)
    clock.t = 13.0                      # past max_lateness_s whatever the backlog
    (_, wf), = m.due()
    assert wf.counters["missing_nodes"] == ["node1"]


def test_a_dead_shard_expires_within_its_bound_even_if_the_observer_stalls_between_every_look():
    """Cause of the slow takeovers: the survivor, busy merging, looked at the table less often than
    every ttl/2, and each look pardoned the whole gap, so the dead shard's heartbeat never aged."""
    clock = Clock()
    table = ShardTable(ttl_s=1.5, clock=clock)
    table.beat("s0")
    table.beat("s1")                    # s1 dies now
    expired_at = None
    for i in range(1, 60):              # s0 looks once a second (a stall each time) and beats
        clock.t = float(i)
        table.beat("s0")
        if "s1" not in table.live():
            expired_at = clock.t
            break
    assert expired_at is not None and expired_at <= table.ttl_s + (table.max_pardons + 1) * 1.0
    assert table.pauses >= 1


def test_a_live_shard_beating_between_the_observers_long_stalls_is_never_expired():
    clock = Clock()
    table = ShardTable(ttl_s=1.5, clock=clock)
    table.beat("s0")
    table.beat("s1")
    for i in range(1, 30):              # one process, 10 s stalls: each shard runs once between them
        clock.t = 10.0 * i
        table.beat("s0")
        assert table.live() == ["s0", "s1"]
        table.beat("s1")
    assert table.live() == ["s0", "s1"]


def test_a_shard_handling_its_jobs_partials_is_live_whatever_the_stalls_before():
    """Seen in benchmarks/fanin.py (two shards, one process, load 15): the owner's fetch returned while
    its peer merged, 3 stalls without the owner beating; its first handled partial found itself expired,
    so it refused its own job's partials ("not_owned"), the peer took the job for a moment, and a window
    merged with half its nodes missing. A shard that is handling messages is running: it is live."""
    parts = partials(events())
    clock, runs, table, first, other = _two_shards()
    for i in range(1, 4):               # the peer's merges: 3 stalls of 2 s, the owner awaiting its fetch
        clock.t = 2.0 * i
        other.poll()
    assert [first.handle(m) for m in _msgs(parts, sorted(parts)[0])] == ["filed", "filed"]
