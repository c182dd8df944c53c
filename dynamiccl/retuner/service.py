"""``dynamiccl retuner run``: the retuner as a service.

Two reader threads subscribe to the detector's regime-change stream (NDJSON, one
:class:`dynamiccl.detector.events.RegimeChange` per line) and the collector's feature stream (NDJSON windows); each
reconnects with exponential backoff (0.5 s → 30 s) when its peer is down. They put what they read on one
bounded queue (``queue_max`` items: a full queue drops the oldest *window* — never a regime change — and
counts it, ``reason="queue_full"``); one worker thread hands items to the :class:`~dynamiccl.retuner.agent.Retuner`
in the loop's order (:class:`dynamiccl.loop.ChangeOrder`: a change after the window it was detected in, as an
in-process run or a replay hands them over), so the service decides as a replay of the same records does.
``/metrics`` is served on ``RetunerConfig.metrics``. Nothing after start-up is fatal: bad lines are counted
and skipped, a dead peer is retried, a failed write leaves the plugin on its last good config.
Inputs pass :class:`~dynamiccl.retuner.inputs.InputGate` first: applying acts only on allow-listed jobs
(``jobs``, required) and communicators, and only on windows whose every network peer authenticated
(unless ``allow_unauthenticated``). A dry run recommends for everything.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from typing import Callable

from prometheus_client import CollectorRegistry

from dynamiccl.contracts.lines import socket_lines
from dynamiccl.detector.events import RegimeChange
from dynamiccl.loop import ChangeOrder
from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.retuner.inputs import InputGate

__all__ = ["RetunerService"]

log = logging.getLogger("dynamiccl.retuner.service")
_BACKOFF = (0.5, 30.0)
MAX_LINE_BYTES = 64 << 20      # one feature window of a very large job; a longer line is skipped and counted


class RetunerService:
    def __init__(self, cfg: RetunerConfig, *, clock: Callable[[], float] = time.time, queue_max: int = 256) -> None:
        self.cfg = cfg.validate()
        if not cfg.dry_run and not cfg.jobs:
            raise ValueError("applying needs an allow-list of jobs (--job PATTERN, repeatable; docs/security.md)")
        self.registry = CollectorRegistry()
        self.retuner = Retuner(cfg, clock=clock, registry=self.registry)
        self.gate = InputGate(jobs=cfg.jobs or ("*",), comms=cfg.comms,
                              allow_unauthenticated=cfg.allow_unauthenticated or cfg.dry_run,
                              metrics=self.retuner.metrics)
        self.queue_max = queue_max
        # without a feature stream there is no window to wait for: changes pass at once
        self.order = ChangeOrder(clock=time.monotonic) if cfg.features else None
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
            from prometheus_client import start_http_server

            from dynamiccl.collector.config import parse_host_port
            from dynamiccl.detector.metrics import export_process_metrics
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
                item = self._q.popleft() if self._q else None
            ready = self._ordered(*item) if item is not None else []
            if self.order is not None:
                ready += self.order.due()
            for kind, x in ready:
                self._hand(kind, x)
        if self.order is not None:
            for kind, x in self.order.flush():
                self._hand(kind, x)

    def _ordered(self, kind: str, item) -> list[tuple[str, object]]:
        if self.order is None:
            return [(kind, item)]
        if kind == "window":
            return self.order.window(item)
        try:
            rc = item if isinstance(item, RegimeChange) else RegimeChange.from_json(item)
        except (ValueError, TypeError, KeyError):
            return [(kind, item)]       # Retuner.on_change counts it as malformed
        return self.order.change(rc)

    def _hand(self, kind: str, item) -> None:
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
        """Lines of one connection, linear in their length; a line over 64 MiB is skipped and counted."""
        from dynamiccl.collector.features import connect
        sock = connect(addr, timeout=10.0)
        sock.settimeout(1.0)
        self._socks.append(sock)
        try:
            yield from socket_lines(sock, self._stop, max_line_bytes=MAX_LINE_BYTES,
                                    on_oversized=lambda: self.retuner.metrics.drop("malformed"))
        finally:
            self._socks.remove(sock)
            sock.close()

    def _read_changes(self, addr: str) -> None:
        for line in self._lines(addr):
            if self.gate.change(line):
                self._put("change", line)      # parsed (and counted if malformed) by Retuner.on_change

    def _read_features(self, addr: str) -> None:
        from dynamiccl.collector.features import decode_line
        for line in self._lines(addr):
            try:
                wf = decode_line(line)
            except (ValueError, KeyError, TypeError) as e:
                self.retuner.metrics.drop("malformed")
                log.debug("feature line dropped: %s", e)
                continue
            wf = self.gate.window(wf)
            if wf is not None:
                self._put("window", wf)
