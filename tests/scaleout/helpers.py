from __future__ import annotations

import numpy as np

from dynamiccl.collector.records import event_time_ns
from dynamiccl.harness.collector_testing import synthetic_events
from dynamiccl.scaleout.partials import node_partial

PER_NODE = 8


class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def events(n_instances=3000, nranks=16, straggler=11, seed=7):
    return synthetic_events(n_instances, nranks=nranks, nnodes=nranks // PER_NODE, seed=seed,
                            rate_per_s=1000.0, straggler_rank=straggler, untimed_fraction=0.05)


def node_of(ev, n):
    return ev[ev["rank"] // PER_NODE == n]


def partials(ev, nodes=(0, 1)):
    """{window: [partial of node n, ...]}"""
    w = event_time_ns(ev) // 1_000_000_000
    return {win: [node_partial(ev[(w == win) & (ev["rank"] // PER_NODE == n)], node=f"node{n}", job_id="j",
                               window=win, window_s=1.0) for n in nodes] for win in np.unique(w).tolist()}


async def until(cond, tries: int = 200, pause_s: float = 0.05) -> bool:
    """Poll ``cond`` (bounded): True once it holds."""
    import asyncio
    for _ in range(tries):
        if cond():
            return True
        await asyncio.sleep(pause_s)
    return False


def run_then_stop(server, coro):
    """``asyncio.run(coro)``, the NATS server stopped whatever happens."""
    import asyncio
    try:
        return asyncio.run(coro)
    finally:
        server.stop()


def single_collector_changes(ev, config, nranks: int) -> list:
    """The regime changes of one collector receiving every node's records (the path a shard must match)."""
    from dynamiccl.collector.component import FuncConsumer, RecordBatch
    from dynamiccl.collector.config import WindowConfig
    from dynamiccl.collector.processors.window_agg import WindowAggregator
    from dynamiccl.loop import Loop
    from dynamiccl.scaleout.central import detector_loop
    changes: list = []
    loop = Loop(detector_loop(config)("j").detector, sinks=[changes.append])
    agg = WindowAggregator(WindowConfig(window_s=1.0), next_consumer=FuncConsumer(lambda r: loop.step(r.features)))
    for n in range(nranks // PER_NODE):
        agg.consume(RecordBatch(ev[ev["rank"] // PER_NODE == n], host=f"node{n}", job_id="j"))
    agg.shutdown()
    return changes
