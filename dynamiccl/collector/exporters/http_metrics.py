"""The ``/metrics`` HTTP server, bounded: at most ``max_clients`` requests at once, each given at
most ``request_timeout_s`` from accept to the end of its response.

prometheus_client's own server starts a thread per connection and keeps it while the peer stays
silent, so idle connections pile up threads. Here a connection beyond ``max_clients`` is closed at
once (counted, ``connections_refused_total{reason="metrics_limit"}``), a silent or slow peer is
cut at its deadline (``reason="metrics_timeout"``), and the serving loop checks deadlines twice a
second.

The body comes from a callable (the exporter's fast renderer, prom_text.py) and is always Prometheus
text 0.0.4, uncompressed: scrapers accept it whatever they asked for, and on loopback gzip would
cost more CPU than it saves.
"""
from __future__ import annotations

import socket
import sys
import threading
import time
from socketserver import ThreadingMixIn
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

__all__ = ["start_metrics_server"]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - scrapes are not worth a log line each
        pass


class _BoundedServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 128
    max_clients = 16
    request_timeout_s = 5.0
    on_refuse: Callable[[str], None] = staticmethod(lambda reason: None)

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_clients)
        self._active: dict[socket.socket, float] = {}
        self._active_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.on_refuse("metrics_limit")
            self.shutdown_request(request)
            return
        request.settimeout(self.request_timeout_s)
        with self._active_lock:
            self._active[request] = time.monotonic() + self.request_timeout_s
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._active_lock:
                self._active.pop(request, None)
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        """A peer that went silent (socket timeout) is counted; none is worth a traceback."""
        if isinstance(sys.exc_info()[1], TimeoutError):
            self.on_refuse("metrics_timeout")

    def service_actions(self) -> None:
        """Cut connections past their deadline (a peer trickling one byte per timeout)."""
        now = time.monotonic()
        with self._active_lock:
            late = [s for s, deadline in self._active.items() if now > deadline]
            for s in late:
                self._active[s] = float("inf")
        for s in late:
            self.on_refuse("metrics_timeout")
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def metrics_app(body: Callable[[], bytes]):
    """WSGI app: GET (any path, as prometheus_client's) → ``body()``; OPTIONS; other methods 405."""
    def app(environ, start_response):
        method = environ["REQUEST_METHOD"]
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET")])
            return [b""]
        if method != "GET":
            start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET")])
            return [f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("200 OK", [])
            return [b""]
        out = body()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4), ("Content-Length", str(len(out)))])
        return [out]
    return app


def start_metrics_server(host: str, port: int, body: Callable[[], bytes], *, max_clients: int,
                         request_timeout_s: float,
                         on_refuse: Callable[[str], None]) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``body()`` on http://host:port/metrics; returns (server, thread)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_cls = type("MetricsServer", (_BoundedServer,), {
        "address_family": family, "max_clients": max_clients, "request_timeout_s": request_timeout_s,
        "on_refuse": staticmethod(on_refuse)})
    httpd = make_server(host, port, metrics_app(body), server_cls, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.5},
                              name="dynamiccl-metrics-http", daemon=True)
    thread.start()
    return httpd, thread
