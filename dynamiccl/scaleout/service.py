"""The two scale-out services' run loops (``dynamiccl node`` / ``dynamiccl central``; docs/scale-out.md).

Node: the collector's socket receiver → a bounded queue (drops counted) → one worker thread that files
records and closes windows (``NodeCollector``) → the bounded outbox → NATS JetStream, flushed from the
event loop; an unreachable bus never blocks ingest (the outbox drops its oldest, counted).

Central: :class:`ShardRunner` binds the durable consumer of every job its shard owns, files partials,
tells the merger how much the bus still holds for the job (``set_backlog``), runs the due windows
through the shard's loop and acknowledges a partial only after its window ran; held partials get
their ack deadline extended, so a shard that dies leaves them to be redelivered to the next owner.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable

from dynamiccl.collector.component import QueuedConsumer, RecordBatch
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.processors.wait_losses import LossNote
from dynamiccl.collector.receivers.stream import StreamReceiver
from dynamiccl.scaleout.auth import classify_refusal, load_credentials
from dynamiccl.scaleout.bus import Message, Outbox, job_of, window_of
from dynamiccl.scaleout.config import NodeServiceConfig
from dynamiccl.scaleout.liveness import LIVE_BUCKET, BucketClock, Liveness, ckpt_key, node_key, shard_key
from dynamiccl.scaleout.nats_bus import JobConsumer, ensure_stream, publish
from dynamiccl.scaleout.node import NodeCollector
from dynamiccl.scaleout.tls import TlsConfig
from dynamiccl.scaleout.tuner_bus import TunerSink, ensure_tuner_stream, fetch_latest, stored_subject

__all__ = ["NodeIngest", "run_node", "ShardRunner", "connect"]

log = logging.getLogger(__name__)


class NodeIngest:
    """The receiver's batches into the node collector (in the queue's worker thread); records of
    another job are dropped and counted (``wrong_job``): a node collector speaks for one job."""

    def __init__(self, node: NodeCollector):
        self.node = node
        node.counters.setdefault("dropped_wrong_job", 0)
        node.counters.setdefault("dropped_queue_full", 0)

    def consume(self, batch: RecordBatch) -> None:
        if batch.job_id != self.node.config.job_id:
            self.node.counters["dropped_wrong_job"] += len(batch)
            return
        self.node.consume(batch.events)

    def tick(self, _now: float) -> None:
        self.node.close_ready()

    def dropped(self, batch: RecordBatch) -> None:
        """The queue refused ``batch``: counted, and its communicators' waits withheld in its windows."""
        self.node.counters["dropped_queue_full"] += len(batch)
        if self.node.config.wait_streams and batch.job_id == self.node.config.job_id:
            self.node.losses.note(LossNote("queue_full", batch.job_id, len(batch), batch.events))


def refusal_counter(counters: dict, who: str) -> Callable[[Exception], Awaitable[None]]:
    """nats-py's error callback: the server's refusals (unknown user, a subject the user may not
    publish to or read) and failed TLS handshakes counted in ``counters`` (``auth_refused``, ``publish_refused``,
    ``subscribe_refused``, ``tls_refused``)
    and logged once each;
    other errors logged at debug (the client reconnects by itself)."""
    async def on_error(e: Exception) -> None:
        kind = classify_refusal(e)
        if kind is None:
            log.debug("%s: NATS: %s", who, e)
            return
        counters[kind] = counters.get(kind, 0) + 1
        if counters[kind] == 1:
            log.warning("%s: the NATS server refused: %s (counted as %s)", who, e, kind)
    return on_error


async def connect(servers, *, replicas: int, credentials: str | None = None, counters: dict | None = None,
                  create: bool = True, timeout_s: float = 10.0, who: str = "dynamiccl", tls: TlsConfig | None = None):
    """A JetStream context on ``servers`` as the user of ``credentials`` (a file: scaleout/auth.py),
    its refusals counted in ``counters``; ``create``: put the partials stream in place (the central
    tier does; a node may not); ``tls``: scaleout/tls.py (its handshake before any byte). Raises ``TimeoutError`` when no server accepted within ``timeout_s``
    (the client's own retries go on inside it: a refused user would otherwise wait forever)."""
    import nats
    auth = load_credentials(credentials).connect_kwargs() if credentials else {}
    if tls is not None:
        auth.update(tls.connect_kwargs())
    nc = await asyncio.wait_for(nats.connect(servers=list(servers), max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                                             connect_timeout=2, error_cb=refusal_counter(counters if counters is not None
                                                                                         else {}, who), **auth),
                                timeout_s)
    js = nc.jetstream()
    if create:
        await ensure_stream(js, replicas=replicas)
        await ensure_tuner_stream(js, replicas=replicas)
    return nc, js


async def run_node(cfg: NodeServiceConfig, stop: asyncio.Event, *, ready: Callable[[NodeCollector, list], None] | None = None,
                   flush_s: float = 0.1) -> NodeCollector:
    """Serve until ``stop``; returns the node collector (its counters) after the last flush."""
    node = NodeCollector(replace(cfg.node, inputs_authenticated=cfg.peers_authenticated),
                         Outbox(None, max_messages=cfg.outbox_messages))
    ingest = NodeIngest(node)
    queue = QueuedConsumer(ingest, max_items=cfg.max_queued_records, name="node", weight=len,
                           on_drop=ingest.dropped, tick_s=0.1)
    receiver = StreamReceiver(cfg.receiver, next_consumer=queue, metrics=SelfMetrics(),
                              losses=node.losses if cfg.node.wait_streams else None)
    queue.start()
    receiver.start()
    nc = js = kv = tuner_sub = None
    beat_at = tuner_at = -1e300
    tuner = TunerSink(cfg.node.job_id, cfg.tuner_config, node.counters) if cfg.tuner_config else None
    try:
        if ready is not None:
            ready(node, receiver.addresses)
        while not stop.is_set():
            if js is None:
                try:
                    nc, js = await connect(cfg.nats.servers, replicas=cfg.nats.replicas, credentials=cfg.nats.credentials,
                                           counters=node.counters, create=False, timeout_s=cfg.nats.connect_timeout_s,
                                           who=f"node {cfg.node.node}", tls=cfg.nats.effective_tls)
                except Exception as e:  # noqa: BLE001 - bus unreachable or refused: ingest goes on, the outbox bounds
                    log.warning("node %s: NATS not reachable (%r); retrying", cfg.node.node, e)
            if js is not None and kv is None:   # the central tier creates the bucket; a node only uses it
                kv = await _bucket(js)
            if js is not None:
                await node.outbox.aflush(lambda m: publish(js, m, cfg.nats.publish_timeout_s, attempts=1))
            if js is not None and tuner is not None:
                tuner_sub, tuner_at = await _tuner_round(nc, js, tuner, tuner_sub, tuner_at, cfg.tuner_poll_s)
            if kv is not None and time.monotonic() - beat_at >= 1.0:     # liveness: every second
                beat_at = time.monotonic()
                try:
                    await kv.put(node_key(cfg.node.job_id, cfg.node.node), b"")
                except Exception as e:  # noqa: BLE001 - counted by the outbox's next failure too
                    node.counters["heartbeat_errors"] = node.counters.get("heartbeat_errors", 0) + 1
                    log.debug("node %s: heartbeat: %s", cfg.node.node, e)
            try:
                await asyncio.wait_for(stop.wait(), flush_s)
            except asyncio.TimeoutError:
                pass
    finally:
        receiver.shutdown()
        queue.shutdown()
        node.close_ready(flush_all=True)
        if js is not None:
            await node.outbox.aflush(lambda m: publish(js, m, cfg.nats.publish_timeout_s, attempts=3))
            await nc.close()
    return node


async def _tuner_round(nc, js, tuner: TunerSink, sub, fetched_at: float, poll_s: float):
    """The job's tuner file: live versions through a subscription, and its last one read at start and
    every ``poll_s`` (a version published while this node was cut off reaches it at the next read)."""
    if sub is None:
        async def deliver(m):                   # the stream's republish: only what it stored
            tuner.offer(stored_subject(m.subject, m.headers)[0], m.headers, m.data)
        try:
            sub = await nc.subscribe(tuner.live, cb=deliver)
        except Exception as e:  # noqa: BLE001 - retried next round
            tuner.counters["tuner_fetch_errors"] += 1
            log.debug("tuner subscription: %r", e)
    if time.monotonic() - fetched_at >= poll_s:
        fetched_at = time.monotonic()
        await fetch_latest(js, tuner)
    return sub, fetched_at


async def _bucket(js):
    try:
        return await js.key_value(LIVE_BUCKET)
    except Exception as e:  # noqa: BLE001 - not created yet (no shard has started): no heartbeat until it is
        log.debug("liveness bucket: %s", e)
        return None


class ShardRunner:
    """One shard's fetch → file → merge → loop → ack rounds over NATS JetStream."""

    def __init__(self, shard: Any, js, *, ack_wait_s: float = 3.0, fetch_batch: int = 2000,
                 fetch_timeout_s: float = 0.2, clock: Callable[[], float] = time.monotonic,
                 kv=None, live: Liveness | None = None, bucket_timeout_s: float = 1.0,
                 bucket_clock: BucketClock | None = None):
        self.shard, self.js, self.kv, self.live = shard, js, kv, live
        self.bucket_clock = bucket_clock        # the table's and liveness' clock: stopped while writes fail
        self.bucket_timeout_s = bucket_timeout_s
        self._ckpt_due: set[str] = set()        # checkpoints not yet in the bucket (retried every round)
        self.deaf = 0                           # beats written but not heard back in time
        self.ack_wait_s, self.fetch_batch, self.fetch_timeout_s = ack_wait_s, fetch_batch, fetch_timeout_s
        self.clock = clock
        self.consumers: dict[str, JobConsumer] = {}
        self.held: dict[str, list[tuple[int, Any]]] = {}
        self._extended = clock()
        self.errors = 0

    async def _extend(self) -> None:
        """Push back the ack deadline of the partials waiting for their window (every ack_wait / 3)."""
        if self.clock() - self._extended < self.ack_wait_s / 3:
            return
        self._extended = self.clock()
        await asyncio.gather(*(m.in_progress() for held in self.held.values() for _, m in held),
                             return_exceptions=True)

    async def _settle(self, m, status: str, job: str, window: int) -> None:
        if status == "filed":
            self.held.setdefault(job, []).append((window, m))
        elif status == "not_owned":
            await m.nak()                       # the job's owner takes it
        else:
            await m.ack()                       # refused (duplicate, late) or malformed: settled

    async def _pull(self, job: str) -> None:
        if job not in self.consumers:
            self.consumers[job] = await JobConsumer(self.js, job, ack_wait_s=self.ack_wait_s).bind()
        msgs = await self.consumers[job].fetch(self.fetch_batch, self.fetch_timeout_s)
        for m in msgs:
            mid = (m.headers or {}).get("Nats-Msg-Id", "")
            status = self.shard.handle(Message(m.subject, m.data, mid))
            await self._settle(m, status, job, window_of(mid))   # -1: malformed, refused already
        held = len(self.held.get(job, []))
        if len(msgs) >= self.fetch_batch:   # more queued: not caught up (what is held elsewhere: as last known)
            self.shard.merger.set_backlog(job, self.fetch_batch, self.shard.merger.elsewhere(job))
            return
        backlog = await self.consumers[job].backlog(held)
        if backlog is not None:             # unknown (the consumer could not be asked): the last known
            queued, elsewhere = backlog     # stands, bounded by max_lateness_s
            self.shard.merger.set_backlog(job, queued + elsewhere, elsewhere)

    async def _ack_done(self, jobs) -> None:
        for job in jobs:
            done = self.shard.checkpoints.get(job, -1 << 62)
            keep = []
            for w, m in self.held.get(job, []):
                if w <= done:
                    await m.ack()
                else:
                    keep.append((w, m))
            self.held[job] = keep

    async def _put(self, key: str, value: bytes, timeout_s: float) -> bool:
        """One bucket write, abandoned after ``timeout_s`` (the bucket's leader moves for seconds after a
        server died; waiting the client's 5 s would stall this shard's merging and its heartbeat)."""
        try:
            await asyncio.wait_for(self.kv.put(key, value), timeout_s)
        except Exception as e:  # noqa: BLE001 - bucket unreachable: counted; local state goes on
            if self.bucket_clock is not None:
                self.bucket_clock.failed()
            self.errors += 1
            if self.errors & (self.errors - 1) == 0:
                log.warning("shard %s: liveness bucket (%d errors): %r", self.shard.name, self.errors, e)
            return False
        if self.bucket_clock is not None:       # written; but unless the watcher hears the bucket, its
            self.bucket_clock.written()         # time stands still as well
            if self.bucket_clock.deaf(2 * self.shard.table.ttl_s / 3):
                self.bucket_clock.failed(since_last_echo=True)
            else:
                self.bucket_clock.ok()
        return True

    async def _share(self, steps: list) -> None:
        """The checkpoints of the jobs just run (and of any whose last write failed) into the bucket."""
        if self.kv is None:
            return
        self._ckpt_due |= {j for j, _ in steps}
        for job in sorted(self._ckpt_due):
            if await self._put(ckpt_key(job), str(self.shard.checkpoints[job]).encode(), self.bucket_timeout_s):
                self._ckpt_due.discard(job)

    async def _beat(self, alive: Callable[[], bool]) -> None:
        """The heartbeat, every TTL / 3 from its own task: neither a long merge nor a stalled checkpoint
        write delays it, and a stalled beat is abandoned after TTL / 3 for the next one. A written
        beat that does not come back through the watcher within 2 periods means the watcher is deaf:
        the bucket clock stops as for a failed write."""
        period = self.shard.table.ttl_s / 3
        while alive():
            t0 = self.clock()
            written = await self._put(shard_key(self.shard.name), b"", period)
            self.deaf += written and self.bucket_clock is not None and self.bucket_clock.deaf(2 * period)
            await asyncio.sleep(max(0.0, period - (self.clock() - t0)))

    async def step(self) -> list:
        """One round; returns the loop steps run (job, step)."""
        await self._extend()
        early = self.shard.poll()               # windows due already: their steps count as this round's
        if self.live is not None:
            for job, nodes in self.shard.merger.config.expected_nodes.items():
                self.shard.merger.set_silent(job, self.live.silent(job_of(job), nodes))   # job: a unit
        for job in list(self.shard.merger.config.expected_nodes):
            if self.shard.table.owns(self.shard.name, job):
                await self._pull(job)
            elif self.held.get(job):            # moved away: hand its partials back now
                await asyncio.gather(*(m.nak() for _, m in self.held.pop(job)), return_exceptions=True)
        steps = early + self.shard.poll()
        await self._share(steps)
        await self._ack_done({j for j, _ in steps})
        return steps

    async def run(self, alive: Callable[[], bool], on_steps: Callable[[list], None] | None = None,
                  pause_s: float = 0.05, after_round: Callable[[], Awaitable[Any]] | None = None) -> None:
        """Rounds until ``alive()`` fails; ``after_round``: awaited after each (the tuner files' publisher)."""
        beat = asyncio.create_task(self._beat(alive)) if self.kv is not None else None
        try:
            while alive():
                steps = await self.step()
                if on_steps is not None and steps:
                    on_steps(steps)
                if after_round is not None:
                    await after_round()
                await asyncio.sleep(pause_s)
        finally:
            if beat is not None:
                beat.cancel()
                await asyncio.gather(beat, return_exceptions=True)
