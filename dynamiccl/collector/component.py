"""Component contracts shared by every receiver, processor and exporter (OTel-collector shape).

Data moves through one method, ``consume(item)``. Receivers are built with their downstream
consumer; after ``consume`` returns the caller must not reuse the item. ``start()`` and
``shutdown()`` are idempotent and ``shutdown()`` is safe without ``start()``.

Two item types flow through the pipeline:

* :class:`RecordBatch` — decoded COLL/P2P records of one plugin process (receivers → aggregator,
  parquet exporter);
* :class:`WindowResult` — one closed window (aggregator → Prometheus exporter, feature stream).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Consumer", "Receiver", "Processor", "Exporter", "RecordBatch", "WindowResult",
    "PermanentError", "Fanout", "QueuedConsumer", "FuncConsumer",
]

log = logging.getLogger(__name__)


class PermanentError(Exception):
    """An error that retrying cannot fix (bad configuration, unusable address)."""


@runtime_checkable
class Consumer(Protocol):
    def consume(self, item: Any) -> None: ...


@runtime_checkable
class Receiver(Protocol):
    """Produces items into ``next_consumer``; owns its threads and sockets."""

    def start(self) -> None: ...
    def shutdown(self) -> None: ...


@runtime_checkable
class Processor(Protocol):
    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def consume(self, item: Any) -> None: ...


@runtime_checkable
class Exporter(Protocol):
    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def consume(self, item: Any) -> None: ...


@dataclass(slots=True)
class RecordBatch:
    """COLL/P2P records (``wire_format.EVENT_DTYPE``) of one plugin process.

    ``comm_names`` maps comm_hash → name as known for this process so far (may be empty).
    """
    events: np.ndarray
    host: str
    job_id: str
    comm_names: Mapping[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.events)


@dataclass(slots=True)
class WindowResult:
    """One closed window: the feature-stream message plus frames only the exporters need.

    ``histograms``: job_id, host, comm, func, algo, proto, size_bucket, bucket (0..21), count, sum_s
    ``per_key``: keys frame (contract columns) — same object as ``features.keys``
    ``last_event``: job_id, host, rank, last_event_s
    ``skew``: job_id, comm, rank, skew_s (mean arrival − instance median arrival)
    """
    features: Any  # dynamiccl.collector.features.WindowFeatures (kept Any to avoid an import cycle)
    histograms: Any
    last_event: Any
    skew: Any
    # per record: its instance has no timed record in the window (None: every record is timed); the wait
    # stand-ins' candidates (processors/wait.py), from the aggregation's own instance table
    wholly_untimed: Any = None


class FuncConsumer:
    """Adapts a function to the Consumer protocol (OTel ``ConsumeMetricsFunc``)."""

    def __init__(self, func: Callable[[Any], None]):
        if func is None:
            raise ValueError("func must not be None")
        self.func = func

    def consume(self, item: Any) -> None:
        self.func(item)


class Fanout:
    """Hands each item to every consumer; an exception in one is logged once and counted."""

    def __init__(self, consumers: list[Consumer], *, on_error: Callable[[str], None] | None = None):
        self.consumers = list(consumers)
        self._on_error = on_error
        self._logged: set[str] = set()

    def consume(self, item: Any) -> None:
        for consumer in self.consumers:
            try:
                consumer.consume(item)
            except Exception:  # never let one exporter break the others
                name = type(consumer).__name__
                if name not in self._logged:
                    self._logged.add(name)
                    log.exception("consumer %s failed (logged once; further failures counted)", name)
                if self._on_error is not None:
                    self._on_error(name)


class QueuedConsumer:
    """A bounded queue plus one worker thread in front of a consumer (OTel ``sending_queue``).

    ``consume`` never blocks: when the queue holds ``max_items`` weight (``weight(item)``, e.g.
    records) the item is dropped and ``on_drop(item)`` is called. ``tick(now)`` of the wrapped
    consumer, if any, is called at least every ``tick_s`` seconds from the worker thread.
    """

    def __init__(self, consumer: Any, *, max_items: int, name: str,
                 weight: Callable[[Any], int] = lambda item: 1,
                 on_drop: Callable[[Any], None] | None = None, tick_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic):
        if max_items <= 0:
            raise ValueError("max_items must be > 0")
        self.consumer = consumer
        self.max_items = max_items
        self.name = name
        self._weight = weight
        self._on_drop = on_drop
        self._tick_s = tick_s
        self._clock = clock
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._busy = 0

    @property
    def pending(self) -> int:
        return self._pending

    def consume(self, item: Any, block: bool = False, timeout: float | None = None) -> bool:
        """Queue ``item``; returns False (and calls on_drop) if it was dropped.

        ``block=True`` waits (up to ``timeout``) for room instead of dropping at once."""
        w = self._weight(item)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._pending + w > self.max_items and self._pending > 0:
                if not block or self._thread is None:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._idle.wait(0.05 if left is None else min(left, 0.05))
            drop = self._pending + w > self.max_items and self._pending > 0
            if not drop:
                self._pending += w
        if drop:
            if self._on_drop is not None:
                self._on_drop(item)
            return False
        self._queue.put((item, w))
        return True

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"dynamiccl-{self.name}", daemon=True)
        self._thread.start()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far has been consumed."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._thread is None:
                return self._pending == 0
            while self._pending > 0 or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
        return True

    def shutdown(self, deadline: float | None = None, on_late: Callable[[Any], None] | None = None) -> None:
        """Stop the worker, then hand what is left to the consumer on this thread. Items still queued
        when ``deadline`` (on this queue's clock) has passed go to ``on_late`` instead (counted by the
        caller), so a backlog of many small batches cannot hold a bounded shutdown."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        self._queue.put(None)
        thread.join(timeout=30)
        self._thread = None
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                break
            if entry is None:
                continue
            if deadline is not None and on_late is not None and self._clock() >= deadline:
                with self._lock:
                    self._pending -= entry[1]
                on_late(entry[0])
            else:
                self._deliver(entry)

    def _deliver(self, entry) -> None:
        item, w = entry
        with self._lock:
            self._busy += 1
        try:
            self.consumer.consume(item)
        except Exception:
            log.exception("%s: consumer failed on one item (item dropped)", self.name)
        finally:
            with self._lock:
                self._pending -= w
                self._busy -= 1
                self._idle.notify_all()

    def _run(self) -> None:
        tick = getattr(self.consumer, "tick", None)
        next_tick = self._clock() + self._tick_s
        while not self._stop.is_set():
            try:
                entry = self._queue.get(timeout=self._tick_s)
            except queue.Empty:
                entry = None
            if entry is not None:
                self._deliver(entry)
            now = self._clock()
            if tick is not None and now >= next_tick:
                next_tick = now + self._tick_s
                try:
                    tick(now)
                except Exception:
                    log.exception("%s: tick failed", self.name)
