"""The fan-in benchmark's two central shards, each in its own process, as ``dynamiccl central`` runs
on two machines: each has its own ``ShardTable`` and checkpoints and learns the other's heartbeats and
checkpoints only through the JetStream key-value bucket (``scaleout/liveness.py``). The victim is
killed with SIGKILL (no goodbye, its held partials unacknowledged). Spawned, not forked: a forked
child of a process whose polars thread pool is running may hang in its first polars call.

Each window a shard runs comes back on a queue as ``("run", job, window, nodes_reported, top rank,
monotonic time)`` (CLOCK_MONOTONIC is one clock for every process of the machine), followed by a
snapshot of the shard's counters, so the killed shard's last counters are known too.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import sys
import time

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

__all__ = ["ProcessShards"]


class _Changes:
    changes: list = []


class QueueRecorder:
    """The shard's loop stand-in: each window's straggler-candidate rank (most strict-shortest), sent
    to the parent, then ``snapshot()`` (the shard's name and counters)."""

    def __init__(self, out, job: str, snapshot):
        self.out, self.job, self.snapshot = out, job, snapshot

    def step(self, wf):
        top = (wf.ranks.sort(["shortest_count", "rank"], descending=[True, False])["rank"][0]
               if len(wf.ranks) else None)
        self.out.put(("run", self.job, round(wf.window_start), wf.counters["nodes_reported"], top, time.monotonic()))
        self.out.put(("counters", *self.snapshot()))
        return _Changes()


def _counters(shard, runner) -> dict:
    return {**shard.counters, **shard.merger.counters,
            "consumer_errors": sum(c.fetch_errors for c in runner.consumers.values()), "bucket_errors": runner.errors,
            "bucket_blackouts": runner.bucket_clock.blackouts, "watcher_deaf": runner.deaf,
            "rewatch": runner.live.counters.get("rewatch", 0)}


async def _serve(name: str, names: list[str], urls: list[str], expected: dict, lateness: float, out, stop) -> None:
    import nats

    from dynamiccl.scaleout.central import CentralShard
    from dynamiccl.scaleout.liveness import BucketClock, Liveness, live_bucket, watch
    from dynamiccl.scaleout.merger import MergerConfig, ShardTable
    from dynamiccl.scaleout.nats_bus import ensure_stream
    from dynamiccl.scaleout.service import ShardRunner

    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()
    await ensure_stream(js, replicas=3)
    kv = await live_bucket(js, replicas=3)
    bucket_clock = BucketClock(time.monotonic)
    table, ckpt = ShardTable(1.5, bucket_clock), {}
    live = Liveness(table, ckpt, node_ttl_s=5.0, clock=bucket_clock)
    cfg = MergerConfig({j: frozenset(n) for j, n in expected.items()}, lateness_s=lateness)
    # the snapshot reads shard and runner when a window runs, after both exist
    shard = CentralShard(name, cfg, table, ckpt,
                         lambda job: QueueRecorder(out, job, lambda: (name, _counters(shard, runner))), time.monotonic)
    runner = ShardRunner(shard, js, ack_wait_s=1.0, kv=kv, live=live, bucket_clock=bucket_clock)
    watcher = asyncio.create_task(watch(kv, live, stop.is_set, on_update=bucket_clock.echo))

    async def announce():
        while sorted(table.live()) != sorted(names) and not stop.is_set():
            await asyncio.sleep(0.05)
        out.put(("ready", name))
        owned = set()
        while not stop.is_set():            # ownership changes, for the takeover's breakdown
            now = {j for j in expected if table.owns(name, j)}
            for j in now ^ owned:
                out.put(("owns", name, j, j in now, time.monotonic()))
            owned = now
            await asyncio.sleep(0.05)
    ready = asyncio.create_task(announce())
    await runner.run(lambda: not stop.is_set())
    await asyncio.gather(watcher, ready, return_exceptions=True)
    out.put(("counters", name, _counters(shard, runner)))
    await nc.close()


def shard_process(name, names, urls, expected, lateness, out, stop) -> None:
    asyncio.run(_serve(name, names, urls, expected, lateness, out, stop))


class ProcessShards:
    """The shards as processes: ``log`` of windows run, ``counters`` per shard (latest snapshot)."""

    def __init__(self, names, urls, expected: dict, lateness: float):
        ctx = mp.get_context("spawn")
        self.out, self.stop = ctx.Queue(), ctx.Event()
        self.procs = {s: ctx.Process(target=shard_process, name=f"shard-{s}", daemon=True,
                                     args=(s, list(names), list(urls), {j: sorted(n) for j, n in expected.items()},
                                           lateness, self.out, self.stop))
                      for s in names}
        self.log: list = []
        self.ownership: list = []          # (shard, job, owns, monotonic time) at each change
        self.counters: dict = {}
        self._ready: set = set()
        self.killed: set = set()

    def start(self) -> "ProcessShards":
        for p in self.procs.values():
            p.start()
        return self

    def drain(self) -> None:
        while True:
            try:
                item = self.out.get_nowait()
            except queue.Empty:
                return
            if item[0] == "run":
                self.log.append(item[1:])
            elif item[0] == "counters":
                self.counters[item[1]] = item[2]
            elif item[0] == "owns":
                self.ownership.append(item[1:])
            else:
                self._ready.add(item[1])

    def ready(self) -> bool:
        self.check()
        return self._ready == set(self.procs)

    def check(self) -> None:
        """Drain the queue; raise when a shard that was not killed has exited."""
        self.drain()
        for s, p in self.procs.items():
            if s not in self.killed and not p.is_alive():
                raise RuntimeError(f"shard {s} exited ({p.exitcode})")

    def kill(self, name: str) -> None:
        self.killed.add(name)
        self.procs[name].kill()
        self.procs[name].join()

    async def finish(self, timeout_s: float = 20.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        while any(p.is_alive() for p in self.procs.values()) and time.monotonic() < deadline:
            self.drain()
            await asyncio.sleep(0.05)
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
            p.join()
        self.drain()
