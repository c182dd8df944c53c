"""Wires receivers → aggregator → exporters and runs them in process.

::

    StreamReceiver ─┐                    ┌─ QueuedConsumer ─ WindowAggregator ─┬─ PrometheusExporter
    Source.push ────┼─ Pipeline.ingest ──┤   (bounded, drops "queue_full")      └─ FeatureStream
    ReplayReceiver ─┘  (validate, count) └─ QueuedConsumer ─ ParquetExporter (not for replayed data)

Components are created exporters first and started in that order; ``shutdown()`` stops the
receivers, drains the queues, closes every open window, flushes parquet and stops the servers.

>>> from dynamiccl.collector.config import default_config
>>> from dynamiccl.harness.collector_testing import synthetic_events
>>> cfg = default_config().replace(receiver={"listen": ()}, parquet={"directory": None},
...                                prometheus={"address": None}, features={"address": None})
>>> p = Pipeline(cfg).start()
>>> sub = p.subscribe()
>>> p.source.push(synthetic_events(100, nranks=4), host="h0", job_id="demo")
400
>>> p.shutdown()
>>> wf = sub.get(timeout=5)
>>> wf.keys["records"].sum(), wf.ranks.height
(400, 8)
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from prometheus_client import CollectorRegistry

from dynamiccl.contracts.version import __version__
from dynamiccl.collector.component import Fanout, QueuedConsumer, RecordBatch
from dynamiccl.collector.config import CollectorConfig, default_config
from dynamiccl.collector.exporters.feature_stream import FeatureStream, Subscription
from dynamiccl.collector.exporters.prometheus import PrometheusExporter
from dynamiccl.collector.metrics import PluginStats, SelfMetrics
from dynamiccl.collector.processors.peers import PeerStage
from dynamiccl.collector.processors.time_gate import EventTimeGate
from dynamiccl.collector.processors.wait_losses import LossNote
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.collector.receivers.replay import ReplayReceiver
from dynamiccl.collector.receivers.source import Source
from dynamiccl.collector.receivers.stream import StreamReceiver
from dynamiccl.collector.records import event_time_ns, valid_mask

__all__ = ["Pipeline"]

log = logging.getLogger(__name__)


def _version() -> str:
    return __version__


class Pipeline:
    """The collector, in process. ``start()`` returns self; ``shutdown()`` is idempotent."""

    def __init__(self, config: CollectorConfig | None = None, *,
                 registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = (config or default_config()).validate()
        self.metrics = SelfMetrics()
        rc = self.config.receiver
        # windows say whether every network peer had to authenticate (the retuner checks it)
        self.metrics.inputs_authenticated = int(rc.tokens_file is not None and (
            rc.auth_unix or not any(a.startswith("unix:") for a in rc.listen)))
        self.plugin_stats = PluginStats(self.config.receiver.gap_tracker_max_processes)
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        cfg = self.config
        self.queues: dict[str, QueuedConsumer] = {}
        # exporters
        self.prometheus = PrometheusExporter(cfg.prometheus, metrics=self.metrics,
                                             plugin_stats=self.plugin_stats, registry=self.registry,
                                             queues=self.queues, version=_version(), clock=clock)
        self.features = FeatureStream(cfg.features, metrics=self.metrics)
        self.telemetry = None
        if cfg.telemetry.gpu:
            from dynamiccl.collector.telemetry.gpu import GpuTelemetry
            self.telemetry = GpuTelemetry(cfg.telemetry, registry=self.registry)
        self.parquet = None
        if cfg.parquet.directory is not None:
            from dynamiccl.collector.exporters.parquet import ParquetExporter
            self.parquet = ParquetExporter(cfg.parquet, metrics=self.metrics, clock=clock)
            self.queues["parquet"] = QueuedConsumer(
                self.parquet, max_items=cfg.parquet.queue_max_records, name="parquet",
                weight=len, on_drop=lambda b: self.metrics.drop("parquet_queue_full", len(b)),
                tick_s=1.0, clock=clock)
        # processor
        window_out = Fanout([self.prometheus, self.features])
        self.aggregator = WindowAggregator(cfg.window, next_consumer=window_out,
                                           metrics=self.metrics, clock=clock)
        self.queues["aggregator"] = QueuedConsumer(
            self.aggregator, max_items=cfg.window.queue_max_records, name="aggregator", weight=len,
            on_drop=self._queue_full, tick_s=0.1, clock=clock)
        # per-peer network timing (PEER records): its own windows, Prometheus rows and parquet table
        self.peers = PeerStage(cfg.peers, cfg.window, metrics=self.metrics, gauge_ttl_s=cfg.prometheus.gauge_ttl_s,
                               parquet_dir=cfg.parquet.directory, registry=self.registry, clock=clock)
        self.queues["peers"] = QueuedConsumer(
            self.peers, max_items=cfg.peers.queue_max_records, name="peers", weight=len,
            on_drop=lambda b: self.metrics.drop("peer_queue_full", len(b)), tick_s=0.5, clock=clock)
        # receivers
        self.time_gate = EventTimeGate(cfg.window.max_event_spread_s,
                                       max_hosts=cfg.receiver.gap_tracker_max_processes, clock=clock)
        self.source = Source(self.ingest)
        self.stream = None
        if cfg.receiver.listen:
            self.stream = StreamReceiver(cfg.receiver, next_consumer=_StreamIngest(self),
                                         metrics=self.metrics, plugin_stats=self.plugin_stats,
                                         peer_consumer=self.queues["peers"], clock=clock,
                                         losses=self.aggregator.losses)
        self.replay = None
        if cfg.replay:
            self.replay = ReplayReceiver(cfg.replay, ingest=self._ingest_replay)
        self._started = False
        self._stopped = False

    # -- data entry ---------------------------------------------------------------------------------
    def ingest(self, batch: RecordBatch, *, block: bool = False, received: bool = True,
               history: bool = True) -> int:
        """Validate, count and hand a batch to the aggregator (and parquet if ``history``).

        Live data (``history``) passes the per-host event-time gate; replayed history does not.
        Returns the number of valid records accepted by the aggregator queue."""
        ev = batch.events
        if received:
            self.metrics.add("received", len(ev))
        ok = valid = valid_mask(ev)
        n_valid = int(ok.sum())
        self.metrics.drop("invalid", len(ev) - n_valid)
        if history:
            in_range = self.time_gate.admit(batch.host, event_time_ns(ev))
            if in_range is not None:
                ok = ok & in_range           # a new array: ``valid`` stays the valid mask
        n_ok = int(ok.sum())
        self.metrics.drop("clock_range", n_valid - n_ok)
        if n_valid - n_ok and self.aggregator.losses is not None:    # their times untrusted: every open window
            self.aggregator.losses.note(LossNote("clock_range", batch.job_id, n_valid - n_ok,
                                                 ev[valid & ~ok], timed=False))
        if n_ok < len(ev):
            if n_ok == 0:
                return 0
            batch = RecordBatch(ev[ok], batch.host, batch.job_id, batch.comm_names)
        self.metrics.add("decoded", n_ok)
        pq = self.queues.get("parquet")
        if history and pq is not None:
            pq.consume(batch)
        return n_ok if self.queues["aggregator"].consume(batch, block=block) else 0

    def _queue_full(self, batch: RecordBatch) -> None:
        """The aggregator's queue refused a decoded batch: counted, and told to the waits' lossy rule."""
        self.metrics.drop("queue_full", len(batch))
        if self.aggregator.losses is not None:
            self.aggregator.losses.note(LossNote("queue_full", batch.job_id, len(batch), batch.events))

    def _ingest_replay(self, batch: RecordBatch, block: bool = True) -> int:
        return self.ingest(batch, block=block, history=False)

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> "Pipeline":
        if self._started:
            return self
        self._started = True
        started = []
        try:
            for comp in (self.telemetry, self.prometheus, self.features, self.parquet, *self.queues.values(),
                         self.aggregator, self.stream, self.replay):
                if comp is not None:
                    comp.start()
                    started.append(comp)
        except BaseException:
            for comp in reversed(started):
                try:
                    comp.shutdown()
                except Exception:  # pragma: no cover
                    log.exception("shutdown after failed start")
            self._stopped = True
            raise
        log.info("collector started (window %.3gs, listen %s, metrics %s, features %s, parquet %s)",
                 self.config.window.window_s, ", ".join(self.addresses["listen"]) or "-",
                 self.addresses["metrics"] or "-", self.addresses["features"] or "-",
                 self.config.parquet.directory or "-")
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop within about ``timeout`` s: the aggregator's queue drains and the open windows close in
        the first half, the parquet queue drains until three quarters (batches and windows left then
        are counted as dropped, ``reason="shutdown"``), the parquet history finishes its files in the
        rest. A backlog of tiny batches (a flood of forged jobs, each its own part file) held
        SIGTERM past any bound before."""
        if self._stopped:
            return
        self._stopped = True
        if not self._started:  # safe without start(): nothing runs, nothing to flush
            return
        start = self._clock()
        left = lambda: max(0.0, start + timeout - self._clock())  # noqa: E731
        took: dict[str, float] = {}

        def step(name: str, fn, *args, **kwargs) -> None:
            t0 = self._clock()
            fn(*args, **kwargs)
            took[name] = self._clock() - t0
            if took[name] > 0.5:   # said now: a bounded shutdown may be cut before its summary line
                log.info("shutdown: %s took %.2f s", name, took[name])

        for rec in (self.stream, self.replay):
            if rec is not None:
                step("receivers", rec.shutdown)
        aq = self.queues["aggregator"]
        late = lambda b: self.metrics.drop("shutdown", len(b))  # noqa: E731
        step("aggregator_queue", lambda: (aq.flush(max(0.0, left() - timeout / 2)),
                                          aq.shutdown(deadline=start + timeout / 2, on_late=late)))
        step("windows", self.aggregator.shutdown, deadline=start + timeout / 2)  # → prometheus, features
        peers = self.queues["peers"]
        step("peers", lambda: (peers.flush(max(0.0, left() - timeout / 2)),
                               peers.shutdown(deadline=start + timeout / 2, on_late=late), self.peers.shutdown()))
        pq = self.queues.get("parquet")
        if pq is not None:
            step("parquet_queue", lambda: (pq.flush(max(0.0, left() - timeout / 4)),
                                           pq.shutdown(deadline=start + 3 * timeout / 4, on_late=late)))
            step("parquet", self.parquet.shutdown, timeout=max(left(), 0.5))
        step("servers", lambda: (self.features.shutdown(), self.prometheus.shutdown()))
        if self.telemetry is not None:
            self.telemetry.shutdown()
        log.info("collector stopped in %.2f s (%s)", self._clock() - start,
                 ", ".join(f"{k} {v:.2f}" for k, v in took.items()))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until queued batches have been processed (windows may stay open)."""
        return all(q.flush(timeout) for q in self.queues.values())

    # -- consumers -------------------------------------------------------------------------------------
    def subscribe(self, max_queue: int | None = None) -> Subscription:
        """In-process feature stream subscription (bounded; drops oldest)."""
        return self.features.subscribe(max_queue)

    @property
    def addresses(self) -> dict:
        return {"listen": list(self.stream.addresses) if self.stream else [],
                "metrics": self.prometheus.address, "features": self.features.address}

    def __enter__(self) -> "Pipeline":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()


class _StreamIngest:
    """Receiver downstream: the stream receiver already counted ``received``."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def consume(self, batch: RecordBatch) -> None:
        self.pipeline.ingest(batch, received=False)


