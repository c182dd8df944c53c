"""The detector as a service: collector feature stream in; regime changes out to the NDJSON
stream, Prometheus, the log (one JSON line per change on stdout) and Grafana annotations.

`DetectorService` owns a `dynamiccl.detector.service.Detector` and runs:

* a reader thread: connects to the collector's feature stream and processes each window;
  when the collector goes away (restart, crash) it reconnects with capped exponential backoff;
  a malformed line is counted (``windows_dropped_total{reason="malformed"}``) and skipped;
* a `ChangeServer` (bounded per-client queues, drops counted);
* ``/metrics`` (prometheus_client) on the detector's own registry;
* when an annotation sink is given (``annotate``: the CLI builds one that posts to Grafana), an annotation
  thread with a bounded queue: a failing sink gives one clear log line per outage and
  ``grafana_annotations_total{result="error"}``, and the service carries on. The sink is injected so the
  detector needs nothing from the views layer that draws the changes.
"""
from __future__ import annotations

import logging
import socket
import sys
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, TextIO

from dynamiccl.collector.features import WindowFeatures
from dynamiccl.contracts.lines import socket_lines

from .config import DEFAULT_FEATURES, DEFAULT_METRICS, DEFAULT_SERVE, DetectorConfig
from .events import RegimeChange, TransientEnd
from .feature_decode import decode
from .server import ChangeServer
from .service import Detector
from .where_refresh import with_where

__all__ = ["ServiceConfig", "DetectorService"]

log = logging.getLogger("detector")
_WHERE_KEPT = 4096   # newest where verdicts kept for the replay to new clients (older: the report's own)


@dataclass(frozen=True)
class ServiceConfig:
    """Where the service reads and writes (docs/architecture.md "Ports")."""
    features: str | None = DEFAULT_FEATURES   # None: no reader; feed windows with process_window()
    metrics: str | None = DEFAULT_METRICS
    serve: str | None = DEFAULT_SERVE
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 5.0
    client_queue: int = 1024
    grafana_queue: int = 256
    max_line_bytes: int = 256 << 20

    def validate(self) -> "ServiceConfig":
        from dynamiccl.collector.config import parse_address, parse_host_port
        if self.features is not None:
            parse_address(self.features, key="--features")
        if self.serve is not None:
            parse_address(self.serve, key="--serve")
        if self.metrics is not None:
            parse_host_port(self.metrics, key="--metrics")
        if not 0 < self.reconnect_min_s <= self.reconnect_max_s:
            raise ValueError("reconnect_min_s must be > 0 and <= reconnect_max_s")
        return self


class DetectorService:
    def __init__(self, config: ServiceConfig | None = None, detector_config: DetectorConfig | None = None, *,
                 registry=None, out: TextIO | None = None, sleep: Callable[[float], None] | None = None,
                 annotate: Callable[[RegimeChange], object] | None = None):
        self.config = (config or ServiceConfig()).validate()
        self.detector = Detector(detector_config, registry=registry)
        self.metrics = self.detector.metrics
        self._out = out if out is not None else sys.stdout
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._reader: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._httpd = None
        self.server: ChangeServer | None = None
        self.addresses: dict[str, str | None] = {}
        self._gq: deque[RegimeChange] = deque()
        self._gcv = threading.Condition()
        self._gthread: threading.Thread | None = None
        self._annotate = annotate
        self._annotations_down = False
        self._lock = threading.Lock()   # one window at a time (reader vs process_window callers)
        self._where_now: OrderedDict[str, dict] = OrderedDict()   # change id -> newest where (bounded)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "DetectorService":
        cfg = self.config
        if cfg.metrics is not None:
            from prometheus_client import start_http_server

            from dynamiccl.collector.config import parse_host_port
            from .metrics import export_process_metrics
            host, port = parse_host_port(cfg.metrics, key="--metrics")
            export_process_metrics(self.metrics.registry)
            try:
                self._httpd, _ = start_http_server(port, addr=host, registry=self.metrics.registry)
            except OSError as exc:
                raise OSError(exc.errno, f"--metrics {cfg.metrics}: cannot listen: {exc.strerror or exc}") from exc
            self.addresses["metrics"] = f"{host}:{self._httpd.server_address[1]}"
        if cfg.serve is not None:
            self.server = ChangeServer(cfg.serve, max_queue=cfg.client_queue, active=self._active_now,
                                       on_drop=lambda: self.metrics.changes_dropped.labels(reason="queue_full").inc(),
                                       on_clients=self.metrics.subscribers.set).start()
            self.addresses["serve"] = self.server.address
        if self._annotate is not None:
            self._gthread = threading.Thread(target=self._annotation_loop, name="detector-grafana", daemon=True)
            self._gthread.start()
        if cfg.features is not None:
            self._reader = threading.Thread(target=self._read_loop, name="detector-reader", daemon=True)
            self._reader.start()
        self.addresses["features"] = cfg.features
        return self

    def shutdown(self) -> None:
        self._stop.set()
        s = self._sock
        if s is not None:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._reader is not None:
            self._reader.join(timeout=10)
        with self._gcv:
            self._gcv.notify_all()
        if self._gthread is not None:
            self._gthread.join(timeout=10)
        if self.server is not None:
            self.server.shutdown()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    # ------------------------------------------------------------------ processing
    def process_window(self, wf: WindowFeatures) -> list[RegimeChange]:
        """Process one window and send its changes to every output (used by the reader)."""
        with self._lock:
            changes = self.detector.process(wf)
            ended = list(self.detector.ended)
            updates = list(getattr(self.detector, "where_updates", ()))
        for c in changes:
            self._emit(c)
        for te in ended:
            self._emit_transient_end(te)
        for u in updates:
            self._emit_where_update(u)
        return changes

    def _emit_where_update(self, u) -> None:
        """A newer ``where`` on a reported change: its own line on the change stream and in the changes
        file (`WhereUpdate.to_json`, never a RegimeChange line), and the log."""
        try:
            self._out.write(u.to_json() + "\n")
            self._out.flush()
        except (OSError, ValueError):
            pass
        log.info("regime change %s: where now %s %s (confidence %.2f)", u.id, u.where.get("kind"),
                 u.where.get("link") or u.where.get("rank"), u.where.get("confidence", float("nan")))
        self.metrics.where_updates_emitted.inc()
        self._where_now[u.id] = u.where
        self._where_now.move_to_end(u.id)
        while len(self._where_now) > _WHERE_KEPT:
            self._where_now.popitem(last=False)
        if self.server is not None:
            self.server.publish_update(u)

    def _active_now(self) -> list[RegimeChange]:
        """The active changes a newly connected client is sent first, each with its newest ``where``."""
        where = dict(self._where_now)
        return [with_where(c, where[c.id]) if c.id in where else c for c in list(self.detector.active)]

    def _emit_transient_end(self, te: TransientEnd) -> None:
        """A transient's end goes to the stream's subscribers (the retuner) alone, as the recovery it stands
        for (``evidence.transient``): the retuner reverts what it chose for the excursion, as the in-process
        loop does; it is no regime change, so the log, the changes file and Grafana never see it."""
        self.metrics.transient_ends_emitted.inc()
        if self.server is not None:
            self.server.publish(te.as_recovery())

    def _emit(self, c: RegimeChange) -> None:
        try:
            self._out.write(c.to_json() + "\n")
            self._out.flush()
        except (OSError, ValueError):
            pass
        log.info("regime change %s: %s in job %s, x%.2f on %s", c.id, c.kind, c.job_id, c.magnitude,
                 ",".join(c.comm_names[:4]) or "-")
        self.metrics.changes_emitted.inc()
        if self.server is not None:
            self.server.publish(c)
        if self._gthread is not None:
            with self._gcv:
                if len(self._gq) >= self.config.grafana_queue:
                    self._gq.popleft()
                    self.metrics.changes_dropped.labels(reason="grafana_queue_full").inc()
                self._gq.append(c)
                self._gcv.notify()

    # ------------------------------------------------------------------ feature stream
    def _read_loop(self) -> None:
        from dynamiccl.collector.features import connect
        delay = self.config.reconnect_min_s
        first = True
        while not self._stop.is_set():
            try:
                sock = connect(self.config.features, timeout=5.0)
            except OSError as exc:
                self.metrics.feature_up.set(0)
                if first:
                    log.warning("feature stream %s unavailable (%s); retrying", self.config.features, exc)
                    first = False
                self._sleep(delay)
                delay = min(delay * 2, self.config.reconnect_max_s)
                continue
            if self._connected_once:
                self.metrics.reconnects.inc()
            self._connected_once = True
            log.info("connected to the feature stream %s", self.config.features)
            first = True
            delay = self.config.reconnect_min_s
            self.metrics.feature_up.set(1)
            self._sock = sock
            try:
                self._consume(sock)
            except OSError as exc:
                if not self._stop.is_set():
                    log.warning("feature stream %s lost: %s; reconnecting", self.config.features, exc)
            finally:
                self._sock = None
                self.metrics.feature_up.set(0)
                try:
                    sock.close()
                except OSError:
                    pass
            if not self._stop.is_set():
                self._sleep(delay)

    _connected_once = False

    def _consume(self, sock: socket.socket) -> None:
        """Until the collector closes the stream (ConnectionError) or the service stops. A line over
        ``max_line_bytes`` is discarded up to its newline and counted as a malformed window; the stream goes on."""
        sock.settimeout(0.5)
        for line in socket_lines(sock, self._stop, max_line_bytes=self.config.max_line_bytes,
                                 on_oversized=self._oversized):
            self._handle_line(line)

    def _oversized(self) -> None:
        self.metrics.windows_received.inc()
        self.metrics.windows_dropped.labels(reason="malformed").inc()

    def _handle_line(self, line: bytes) -> None:
        try:
            wf = decode(line)
        except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
            self.metrics.windows_received.inc()
            self.metrics.windows_dropped.labels(reason="malformed").inc()
            log.debug("feature stream: malformed line skipped: %s", exc)
            return
        except Exception as exc:  # polars schema errors and the like
            self.metrics.windows_received.inc()
            self.metrics.windows_dropped.labels(reason="malformed").inc()
            log.debug("feature stream: undecodable line skipped: %s", exc)
            return
        self.process_window(wf)

    # ------------------------------------------------------------------ annotations
    def _annotation_loop(self) -> None:
        while True:
            with self._gcv:
                self._gcv.wait_for(lambda: self._gq or self._stop.is_set())
                if self._stop.is_set() and not self._gq:
                    return
                c = self._gq.popleft()
            try:
                self._annotate(c)
            except Exception as exc:  # noqa: BLE001 - never let the annotation sink stop the service
                self.metrics.grafana.labels(result="error").inc()
                if not self._annotations_down:   # one line per outage, not per change
                    log.warning("Grafana annotation failed: %s; the detector carries on (counted in "
                                "dynamiccl_detector_grafana_annotations_total{result=\"error\"})", exc)
                self._annotations_down = True
                continue
            if self._annotations_down:
                log.info("Grafana annotations work again")
            self._annotations_down = False
            self.metrics.grafana.labels(result="ok").inc()
