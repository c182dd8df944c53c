"""Feature stream exporter: in-process subscriptions and an NDJSON server (unix/tcp).

Each subscriber (in process or a socket client) has a bounded queue of ``queue_max_windows``;
when full the *oldest* window is dropped and counted
(``dynamiccl_collector_feature_windows_dropped_total``). The server thread writes non-blocking,
so a slow client never stalls the pipeline. At ``max_subscribers`` a new connection takes the slot
of a client that has left windows unread for ``stall_timeout_s``, else it is refused and counted.
"""
from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from collections import deque

from dynamiccl.collector.component import WindowResult
from dynamiccl.collector.config import FeaturesConfig
from dynamiccl.collector.features import WindowFeatures, encode_line
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.net import listen
from dynamiccl.collector.ratelog import RateLimitedLog

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


class _Client:
    __slots__ = ("sock", "queue", "pending", "peer", "backlog_since")

    def __init__(self, sock, peer):
        self.sock, self.peer = sock, peer
        self.queue: deque[bytes] = deque()
        self.pending = memoryview(b"")
        self.backlog_since: float | None = None  # since when windows wait for this client


class FeatureStream:
    """Exporter: consumes WindowResult and delivers ``result.features`` to every subscriber."""

    def __init__(self, config: FeaturesConfig, *, metrics: SelfMetrics | None = None):
        config.validate()
        self.config = config
        self.metrics = metrics or SelfMetrics()
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()
        self._clients: dict[int, _Client] = {}
        self._listener = None
        self._kind = None
        self._sel = None
        self._thread = None
        self._stop = threading.Event()
        self._wake_r = self._wake_w = None
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

    def _count_subscribers(self) -> None:
        with self.metrics._lock:
            self.metrics.feature_subscribers = len(self._subs) + len(self._clients)

    def consume(self, result: WindowResult) -> None:
        wf = result.features
        with self._lock:
            subs = list(self._subs)
            clients = list(self._clients.values())
        for sub in subs:
            sub._put(wf)
        if clients:
            line = encode_line(wf)
            with self._lock:
                for c in clients:
                    if len(c.queue) >= self.config.queue_max_windows:
                        c.queue.popleft()
                        self._count_drop()
                    if c.backlog_since is None:
                        c.backlog_since = time.monotonic()
                    c.queue.append(line)
            self._wake()

    # -- server ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None or self.config.address is None:
            return
        self._listener, self._kind, self.address = listen(self.config.address, key="features")
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dynamiccl-feature-server", daemon=True)
        self._thread.start()
        log.info("feature stream on %s", self.address)

    def _wake(self) -> None:
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass

    def shutdown(self) -> None:
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            sub.close()
        if self._thread is None:
            return
        self._stop.set()
        self._wake()
        self._thread.join(timeout=10)
        self._thread = None
        for c in list(self._clients.values()):
            self._drop_client(c)
        self._sel.close()
        self._listener.close()
        if self._kind == "unix":
            try:
                os.unlink(self.address[5:])
            except OSError:
                pass
        self._wake_r.close()
        self._wake_w.close()
        self._wake_r = self._wake_w = None

    def _drop_client(self, c: _Client) -> None:
        with self._lock:
            self._clients.pop(id(c), None)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        self._count_subscribers()

    def _run(self) -> None:
        while not self._stop.is_set():
            # writable interest only for clients with data
            with self._lock:
                clients = list(self._clients.values())
            for c in clients:
                want = selectors.EVENT_READ | (selectors.EVENT_WRITE if (c.queue or c.pending) else 0)
                try:
                    self._sel.modify(c.sock, want, c)
                except (KeyError, ValueError):
                    pass
            try:
                events = self._sel.select(timeout=0.5)
            except OSError:  # pragma: no cover
                continue
            for key, mask in events:
                try:
                    if key.data is None:
                        try:
                            self._wake_r.recv(4096)
                        except OSError:
                            pass
                    elif key.data == "listen":
                        self._accept()
                    else:
                        self._service(key.data, mask)
                except Exception:
                    log.exception("feature server: unexpected error")
                    if isinstance(key.data, _Client):
                        self._drop_client(key.data)

    def _accept(self) -> None:
        try:
            sock, addr = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if len(self._clients) + len(self._subs) >= self.config.max_subscribers and not self._evict_stalled():
            sock.close()
            self.metrics.refused("subscriber_limit")
            self._refusal_log.warning("subscriber_limit", "feature stream: %s refused: %d subscribers "
                                      "(max_subscribers), none stalled for %g s (counted in "
                                      "dynamiccl_collector_connections_refused_total{reason=\"subscriber_limit\"})",
                                      addr or "a peer", self.config.max_subscribers, self.config.stall_timeout_s)
            return
        sock.setblocking(False)
        c = _Client(sock, addr)
        with self._lock:
            self._clients[id(c)] = c
        self._sel.register(sock, selectors.EVENT_READ, c)
        self._count_subscribers()

    def _evict_stalled(self) -> bool:
        """Make room by dropping the client that has left windows unread longest, if it has for
        ``stall_timeout_s`` (an idle connection that never reads cannot hold a slot for ever)."""
        now = time.monotonic()
        with self._lock:
            stalled = [c for c in self._clients.values()
                       if c.backlog_since is not None and now - c.backlog_since > self.config.stall_timeout_s]
        if not stalled:
            return False
        self._drop_client(min(stalled, key=lambda c: c.backlog_since))
        self.metrics.refused("subscriber_stalled")
        return True

    def _service(self, c: _Client, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            try:
                data = c.sock.recv(4096)  # clients send nothing; EOF means they left
            except (BlockingIOError, InterruptedError):
                data = b"x"
            except OSError:
                data = b""
            if not data:
                self._drop_client(c)
                return
        if mask & selectors.EVENT_WRITE:
            while True:
                if not c.pending:
                    with self._lock:
                        if not c.queue:
                            c.backlog_since = None  # caught up
                            return
                        c.pending = memoryview(c.queue.popleft())
                try:
                    sent = c.sock.send(c.pending)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    self._drop_client(c)
                    return
                c.pending = c.pending[sent:]
