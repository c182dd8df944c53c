"""``dynamiccl retuner run``: the retuner as a service.

Two reader threads subscribe to the detector's regime-change stream (NDJSON, one
:class:`detector.events.RegimeChange` per line) and the collector's feature stream (NDJSON windows); each
reconnects with exponential backoff (0.5 s → 30 s) when its peer is down. They put what they read on one
bounded queue (``queue_max`` items: a full queue drops the oldest *window* — never a regime change — and
counts it, ``reason="queue_full"``); one worker thread hands items to the :class:`~retuner.agent.Retuner`.
``/metrics`` is served on ``RetunerConfig.metrics``. Nothing after start-up is fatal: bad lines are counted
and skipped, a dead peer is retried, a failed write leaves the plugin on its last good config.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from typing import Callable

from prometheus_client import CollectorRegistry

from retuner.agent import Retuner
from retuner.config import RetunerConfig

__all__ = ["RetunerService"]

log = logging.getLogger("retuner.service")
_BACKOFF = (0.5, 30.0)


class RetunerService:
    def __init__(self, cfg: RetunerConfig, *, clock: Callable[[], float] = time.time, queue_max: int = 256) -> None:
        self.cfg = cfg.validate()
        self.registry = CollectorRegistry()
        self.retuner = Retuner(cfg, clock=clock, registry=self.registry)
        self.queue_max = queue_max
        self._q: deque = deque()
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._http = None
        self.metrics_address: str | None = None

    # ---- lifecycle ----
    def start(self) -> "RetunerService":
        if self.cfg.metrics:
            from collector.config import parse_host_port
            from prometheus_client import start_http_server
            from detector.metrics import export_process_metrics
            host, port = parse_host_port(self.cfg.metrics, key="metrics")
            export_process_metrics(self.registry)
            self._http = start_http_server(port, addr=host, registry=self.registry)   # OSError: start-up error
            srv = self._http[0] if isinstance(self._http, tuple) else None
            bound = srv.server_address[1] if srv is not None else port
            self.metrics_address = f"{host}:{bound}"
        for name, addr, fn in (("changes", self.cfg.changes, self._read_changes),
                               ("features", self.cfg.features, self._read_features)):
            if addr:
                t = threading.Thread(target=self._reader, args=(name, addr, fn), name=f"retuner-{name}", daemon=True)
                t.start()
                self._threads.append(t)
        w = threading.Thread(target=self._worker, name="retuner-worker", daemon=True)
        w.start()
        self._threads.append(w)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for s in list(self._socks):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout)
        if self._http is not None and isinstance(self._http, tuple):
            self._http[0].shutdown()
        self.retuner.close()

    # ---- queue ----
    def _put(self, kind: str, item) -> None:
        with self._cv:
            if len(self._q) >= self.queue_max:
                for i, (k, _) in enumerate(self._q):      # drop the oldest window, keep regime changes
                    if k == "window":
                        del self._q[i]
                        self.retuner.metrics.drop("queue_full")
                        break
                else:
                    self._q.popleft()
                    self.retuner.metrics.drop("queue_full")
            self._q.append((kind, item))
            self._cv.notify()

    def _worker(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                self._cv.wait_for(lambda: self._q or self._stop.is_set(), timeout=1.0)
                if not self._q:
                    continue
                kind, item = self._q.popleft()
            try:
                if kind == "change":
                    self.retuner.on_change(item)
                else:
                    self.retuner.on_window(item)
            except Exception:           # the Retuner already never raises; belt and braces for the service
                log.exception("retuner worker: %s dropped", kind)

    # ---- readers ----
    def _reader(self, name: str, addr: str, fn) -> None:
        delay = _BACKOFF[0]
        while not self._stop.is_set():
            try:
                fn(addr)
                delay = _BACKOFF[0]
            except (OSError, ValueError) as e:
                if self._stop.is_set():
                    return
                log.warning("%s stream %s: %s; retrying in %.1f s", name, addr, e, delay)
            if self._stop.wait(delay):
                return
            delay = min(_BACKOFF[1], delay * 2)

    def _lines(self, addr: str):
        from collector.features import connect
        sock = connect(addr, timeout=10.0)
        sock.settimeout(1.0)
        self._socks.append(sock)
        buf = b""
        try:
            while not self._stop.is_set():
                try:
                    chunk = sock.recv(1 << 16)
                except socket.timeout:
                    continue
                if not chunk:
                    raise ConnectionError("peer closed the stream")
                buf += chunk
                if len(buf) > 64 << 20:
                    raise ValueError("line longer than 64 MiB")
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield line
        finally:
            self._socks.remove(sock)
            sock.close()

    def _read_changes(self, addr: str) -> None:
        for line in self._lines(addr):
            self._put("change", line)          # parsed (and counted if malformed) by Retuner.on_change

    def _read_features(self, addr: str) -> None:
        from collector.features import decode_line
        for line in self._lines(addr):
            try:
                wf = decode_line(line)
            except (ValueError, KeyError, TypeError) as e:
                self.retuner.metrics.drop("malformed")
                log.debug("feature line dropped: %s", e)
                continue
            self._put("window", wf)
