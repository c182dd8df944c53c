"""Example Alertmanager webhook receiver of the stack (``dynamiccl stack webhook``, compose's ``alert-log``)."""
from __future__ import annotations

import collections
import http.server
import json
import logging
import threading
import time
from typing import Callable

__all__ = ["AlertWebhook", "print_notification"]

log = logging.getLogger("dynamiccl.stack")


class AlertWebhook:
    """Alertmanager webhook receiver (example): each POSTed notification is kept (bounded) and handed to
    ``on_notification``; ``dynamiccl stack webhook`` prints one JSON line per alert.

    Bad input (not JSON, not a notification, body over ``max_body``) gets a 4xx and is counted in
    ``rejected``; the server keeps running.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, max_keep: int = 1000,
                 max_body: int = 1 << 20, on_notification: Callable[[dict], None] | None = None,
                 clock: Callable[[], float] = time.time):
        self.notifications: collections.deque[tuple[float, dict]] = collections.deque(maxlen=max_keep)
        self.received = 0
        self.rejected = 0
        self._lock = threading.Condition()
        self._max_body = max_body
        self._on = on_notification
        self._clock = clock
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, fmt, *args):  # noqa: D401 - quiet
                log.debug("webhook: " + fmt, *args)

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                if n > hook._max_body:
                    return self._reject(413, "body too large")
                try:
                    body = json.loads(self.rfile.read(n) or b"null")
                except (ValueError, UnicodeDecodeError):
                    return self._reject(400, "not JSON")
                if not isinstance(body, dict) or not isinstance(body.get("alerts"), list):
                    return self._reject(400, "not an Alertmanager notification (no alerts list)")
                with hook._lock:
                    hook.received += 1
                    hook.notifications.append((hook._clock(), body))
                    hook._lock.notify_all()
                if hook._on is not None:
                    try:
                        hook._on(body)
                    except Exception:  # a printing error must not take the receiver down
                        log.exception("webhook: notification handler failed")
                self.send_response(200)
                self.end_headers()

            def do_GET(self):  # noqa: N802 - health check
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(f"received {hook.received} rejected {hook.rejected}\n".encode())

            def _reject(self, code: int, why: str):
                with hook._lock:
                    hook.rejected += 1
                self.send_response(code)
                self.end_headers()
                self.wfile.write(why.encode())

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        h, p = self._server.server_address[:2]
        return f"{h}:{p}"

    def start(self) -> "AlertWebhook":
        self._thread = threading.Thread(target=self._server.serve_forever, name="alert-webhook", daemon=True)
        self._thread.start()
        return self

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float) -> tuple[float, dict] | None:
        """First kept (time, alert) whose alert satisfies ``predicate``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for t, note in self.notifications:
                    for alert in note.get("alerts", []):
                        if predicate(alert):
                            return t, alert
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(min(left, 0.5))

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def print_notification(note: dict) -> None:
    for a in note.get("alerts", []):
        print(json.dumps({"status": a.get("status"), "labels": a.get("labels", {}),
                          "annotations": a.get("annotations", {}), "startsAt": a.get("startsAt")},
                         sort_keys=True), flush=True)
