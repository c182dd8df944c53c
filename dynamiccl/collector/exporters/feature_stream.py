"""Feature stream exporter: in-process subscriptions and an NDJSON server (unix/tcp).

Each subscriber (in process or a socket client) has a bounded queue of ``queue_max_windows``;
when full the *oldest* window is dropped and counted
(``dynamiccl_collector_feature_windows_dropped_total``). Socket clients are served by the shared
:class:`dynamiccl.contracts.broadcast.LineBroadcaster` (non-blocking writes: a slow client never stalls
the pipeline; at ``max_subscribers`` a new connection takes the slot of a client that has left windows
unread for ``stall_timeout_s``, else it is refused and counted).
"""
from __future__ import annotations

import logging
import threading
from collections import deque

from dynamiccl.collector.component import WindowResult
from dynamiccl.collector.config import FeaturesConfig
from dynamiccl.collector.features import WindowFeatures, encode_line
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.net import close_listener, listen
from dynamiccl.collector.ratelog import RateLimitedLog
from dynamiccl.contracts.broadcast import LineBroadcaster

__all__ = ["FeatureStream", "Subscription"]

log = logging.getLogger(__name__)


class Subscription:
    """In-process subscription: ``get(timeout)``, iteration, ``close()``."""

    def __init__(self, hub: "FeatureStream", maxlen: int):
        self._hub = hub
        self._q: deque[WindowFeatures] = deque()
        self._maxlen = maxlen
        self._cv = threading.Condition()
        self.closed = False
        self.dropped = 0

    def _put(self, wf: WindowFeatures) -> None:
        with self._cv:
            if len(self._q) >= self._maxlen:
                self._q.popleft()
                self.dropped += 1
                self._hub._count_drop()
            self._q.append(wf)
            self._cv.notify_all()

    def get(self, timeout: float | None = None) -> WindowFeatures | None:
        """Next window, or None on timeout / after close()."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._q or self.closed, timeout):
                return None
            return self._q.popleft() if self._q else None

    def __iter__(self):
        while True:
            wf = self.get()
            if wf is None:
                return
            yield wf

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()
        self._hub._remove(self)


class FeatureStream:
    """Exporter: consumes WindowResult and delivers ``result.features`` to every subscriber."""

    def __init__(self, config: FeaturesConfig, *, metrics: SelfMetrics | None = None):
        config.validate()
        self.config = config
        self.metrics = metrics or SelfMetrics()
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()
        self._server: LineBroadcaster | None = None
        self._listener = None
        self._kind = None
        self.address: str | None = None
        self._refusal_log = RateLimitedLog(log, 60.0)

    # -- in process -----------------------------------------------------------------------------
    def subscribe(self, max_queue: int | None = None) -> Subscription:
        sub = Subscription(self, max_queue or self.config.queue_max_windows)
        with self._lock:
            self._subs.append(sub)
        self._count_subscribers()
        return sub

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)
        self._count_subscribers()

    def _count_drop(self) -> None:
        self.metrics.add("feature_windows_dropped", 1)

    def _count_subscribers(self, _n: int | None = None) -> None:
        with self.metrics._lock:
            self.metrics.feature_subscribers = len(self._subs) + (self._server.n_clients if self._server else 0)

    def consume(self, result: WindowResult) -> None:
        wf = result.features
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            sub._put(wf)
        if self._server is not None and self._server.n_clients:
            self._server.publish(encode_line(wf))

    # -- server ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._server is not None or self.config.address is None:
            return
        self._listener, self._kind, self.address = listen(self.config.address, key="features")
        cfg = self.config
        self._server = LineBroadcaster(
            self._listener, max_queue=cfg.queue_max_windows, max_clients=cfg.max_subscribers,
            stall_timeout_s=cfg.stall_timeout_s, extra_clients=lambda: len(self._subs),
            on_drop=self._count_drop, on_refuse=self._refused, on_clients=self._count_subscribers,
            name="dynamiccl-feature-server").start()
        log.info("feature stream on %s", self.address)

    def _refused(self, reason: str, peer: str) -> None:
        self.metrics.refused(reason)
        if reason == "subscriber_limit":
            self._refusal_log.warning("subscriber_limit", "feature stream: %s refused: %d subscribers "
                                      "(max_subscribers), none stalled for %g s (counted in "
                                      "dynamiccl_collector_connections_refused_total{reason=\"subscriber_limit\"})",
                                      peer, self.config.max_subscribers, self.config.stall_timeout_s)

    def shutdown(self) -> None:
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            sub.close()
        if self._server is None:
            return
        self._server.shutdown()
        self._server = None
        close_listener(self._listener, self._kind, self.address)
