"""ShardRunner's view of the bus: a consumer that cannot be asked its backlog is not "caught up"."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import nats

from dynamiccl.scaleout.central import CentralShard
from dynamiccl.scaleout.merger import MergerConfig, ShardTable
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
