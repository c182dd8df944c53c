"""ShardRunner's view of the bus: a consumer that cannot be asked its backlog is not "caught up"."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import nats

from dynamiccl.scaleout.central import CentralShard
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, WindowMerger
from dynamiccl.scaleout.nats_bus import JobConsumer
from dynamiccl.scaleout.service import ShardRunner
from tests.scaleout.helpers import Clock, events, partials


class _Sub:
    """A pull subscription that delivers nothing."""

    async def fetch(self, batch, timeout):
        raise nats.errors.TimeoutError


class _Js:
    """JetStream whose consumer info answers ``infos`` in turn (an exception: the consumer could not
    be asked, as while its leader moves after a server died)."""

    def __init__(self, infos):
        self.infos = list(infos)

    async def consumer_info(self, stream, consumer, timeout=None):
        assert consumer == "job-j" and timeout is not None and timeout <= 1.0   # bounded, not the client's 5 s
        info = self.infos.pop(0)
        if isinstance(info, Exception):
            raise info
        return info


def test_an_unanswered_backlog_keeps_the_window_waiting_for_partials_still_on_the_bus():
    parts = partials(events())
    clock = Clock()
    cfg = MergerConfig({"j": frozenset({"node0", "node1"})}, lateness_s=2.0, max_lateness_s=10.0)
    shard = CentralShard("s0", cfg, ShardTable(1.5, clock), {}, lambda job: None, clock)
    runner = ShardRunner(shard, js=None, clock=clock)
    consumer = JobConsumer(_Js([SimpleNamespace(num_pending=0, num_ack_pending=3),   # node1's: a dead shard's
                                nats.errors.TimeoutError()]), "j")
    consumer.sub = _Sub()
    runner.consumers["j"] = consumer
    w = sorted(parts)[1]
    shard.merger.add("j", parts[w][0])            # node0 of window w, and a later window: the bus is past w
    shard.merger.add("j", parts[w + 1][0])
    asyncio.run(runner._pull("j"))                # 3 still held for redelivery
    clock.t = 3.0                                 # past lateness_s
    asyncio.run(runner._pull("j"))                # the consumer cannot be asked: counted, not "caught up"
    assert consumer.fetch_errors == 1
    assert shard.merger.due() == []               # node1's partial is still on the bus: no missing node
    clock.t = 11.0                                # bounded: max_lateness_s whatever the bus says
    (_, wf), _ = shard.merger.due()              # window w, then w + 1 (node1 absent from both)
    assert wf.counters["missing_nodes"] == ["node1"]


def test_a_complete_window_after_a_gap_waits_for_earlier_windows_held_elsewhere():
    """Seen in benchmarks/fanin.py with two shard processes (1,000 nodes, load 11): a shard briefly
    owned the other's job and held windows 3-5; the owner, seeing window 6 complete, ran it, and 3-5
    came back "already run": lost. A complete window now waits while an earlier one is unseen and the
    bus has messages of the job delivered elsewhere, unsettled."""
    parts = partials(events(n_instances=7000))
    wins = sorted(parts)
    clock = Clock()
    cfg = MergerConfig({"j": frozenset({"node0", "node1"})}, lateness_s=2.0, max_lateness_s=10.0)
    ran = []

    class _Loop:
        def step(self, wf):
            ran.append(round(wf.window_start))
            return SimpleNamespace(changes=[])
    # window 0 was run by the job's previous owner (its checkpoint)
    shard = CentralShard("s0", cfg, ShardTable(1.5, clock), {"j": wins[0]}, lambda job: _Loop(), clock)
    merger = shard.merger
    for p in parts[wins[4]]:                      # window 4 complete; 1-3 held by another shard
        merger.add("j", p)
    merger.set_backlog("j", 4, elsewhere=4)
    shard.poll()
    assert ran == []
    for w in wins[1:4]:                           # handed back (nak) and fetched here
        for p in parts[w]:
            merger.add("j", p)
    merger.set_backlog("j", 0, elsewhere=0)
    shard.poll()
    assert ran == wins[1:5]
    for p in parts[wins[-1]]:                     # a gap with nothing held elsewhere: no wait
        merger.add("j", p)
    shard.poll()
    assert ran == wins[1:5] + [wins[-1]] and wins[-1] > wins[4] + 1


def test_the_gap_wait_is_bounded():
    parts = partials(events(n_instances=7000))
    wins = sorted(parts)
    clock = Clock()
    merger = WindowMerger(MergerConfig({"j": frozenset({"node0", "node1"})}, max_lateness_s=10.0), clock)
    merger.set_done("j", wins[0])
    for p in parts[wins[3]]:
        merger.add("j", p)
    merger.set_backlog("j", 5, elsewhere=5)
    clock.t = 9.9
    assert merger.due() == []
    clock.t = 10.1
    assert [round(wf.window_start) for _, wf in merger.due()] == [wins[3]]
