"""The regime-change stream: NDJSON over TCP or a Unix socket, one `RegimeChange` per line.

Each client gets a bounded queue (``max_queue`` lines); when it is full the *oldest* line is
dropped and counted (``dynamiccl_detector_changes_dropped_total{reason="queue_full"}``), so a
slow or stuck client never blocks the detector. On connect, a client first receives the changes
that are still active (not yet recovered), so a retuner that (re)connects late knows the current
regime; ids are unique, so a client can ignore ones it has seen.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from collections import deque
from typing import Callable, Iterable

from dynamiccl.collector.net import listen

from .events import RegimeChange

__all__ = ["ChangeServer", "subscribe_changes"]

log = logging.getLogger("dynamiccl.detector.server")


class _Client:
    def __init__(self, server: "ChangeServer", sock: socket.socket, peer: str):
        self.server, self.sock, self.peer = server, sock, peer
        self.q: deque[bytes] = deque()
        self.cv = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, name=f"detector-client-{peer}", daemon=True)

    def put(self, line: bytes) -> None:
        with self.cv:
            if len(self.q) >= self.server.max_queue:
                self.q.popleft()
                self.server._dropped()
            self.q.append(line)
            self.cv.notify()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()

    def _run(self) -> None:
        try:
            self.sock.settimeout(self.server.send_timeout_s)
            while True:
                with self.cv:
                    self.cv.wait_for(lambda: self.q or self.closed)
                    if self.closed and not self.q:
                        return
                    batch = b"".join(self.q)
                    self.q.clear()
                self.sock.sendall(batch)
        except OSError as exc:
            log.info("change stream client %s gone: %s", self.peer, exc)
        finally:
            try:
                self.sock.close()
            except OSError:
                pass
            self.server._forget(self)


class ChangeServer:
    """Serves regime changes to any number (≤ ``max_clients``) of NDJSON clients.

    ``active`` is a callable returning the changes to replay to a new client.
    """

    def __init__(self, address: str, *, max_queue: int = 1024, max_clients: int = 64,
                 send_timeout_s: float = 10.0, active: Callable[[], Iterable[RegimeChange]] | None = None,
                 on_drop: Callable[[], None] | None = None, on_clients: Callable[[int], None] | None = None):
        self.address_spec = address
        self.max_queue = max_queue
        self.max_clients = max_clients
        self.send_timeout_s = send_timeout_s
        self._active = active or (lambda: ())
        self._on_drop = on_drop or (lambda: None)
        self._on_clients = on_clients or (lambda n: None)
        self._clients: list[_Client] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = None
        self._kind = None
        self._thread = None
        self.address: str | None = None
        self.dropped = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "ChangeServer":
        self._listener, self._kind, self.address = listen(self.address_spec, key="serve")
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name="detector-change-server", daemon=True)
        self._thread.start()
        log.info("regime-change stream on %s", self.address)
        return self

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            clients = list(self._clients)
        for c in clients:
            c.close()
        for c in clients:
            c.thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
            if self._kind == "unix":
                try:
                    os.unlink(self.address[5:])
                except OSError:
                    pass
            self._listener = None

    @property
    def n_clients(self) -> int:
        with self._lock:
            return len(self._clients)

    # -- publishing -------------------------------------------------------------------------------
    def publish(self, change: RegimeChange) -> None:
        line = (change.to_json() + "\n").encode()
        with self._lock:
            clients = list(self._clients)
        for c in clients:
            c.put(line)

    # -- internals ----------------------------------------------------------------------------------
    def _dropped(self) -> None:
        with self._lock:
            self.dropped += 1
        self._on_drop()

    def _forget(self, c: _Client) -> None:
        with self._lock:
            if c in self._clients:
                self._clients.remove(c)
            n = len(self._clients)
        self._on_clients(n)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, peer = self._listener.accept()
            except (TimeoutError, socket.timeout, BlockingIOError):
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("change stream: accept failed: %s", exc)
                continue
            sock.setblocking(True)
            peer_s = str(peer) if peer else "unix"
            with self._lock:
                full = len(self._clients) >= self.max_clients
            if full:
                log.warning("change stream: refusing %s (%d clients already)", peer_s, self.max_clients)
                sock.close()
                continue
            c = _Client(self, sock, peer_s)
            for ch in list(self._active()):
                c.put((ch.to_json() + "\n").encode())
            with self._lock:
                self._clients.append(c)
                n = len(self._clients)
            c.thread.start()
            self._on_clients(n)


def subscribe_changes(address: str, *, timeout: float | None = None, connect_timeout: float = 10.0):
    """Iterate over the `RegimeChange` objects a detector serves (``unix:PATH`` or ``tcp:HOST:PORT``).

    Malformed lines raise ``ValueError`` (with the reason); the iterator ends when the server closes.
    """
    from dynamiccl.collector.features import connect
    sock = connect(address, timeout=connect_timeout)
    sock.settimeout(timeout)

    def lines():
        try:
            with sock.makefile("rb") as f:
                for line in f:
                    if line.strip():
                        yield RegimeChange.from_json(line)
        finally:
            sock.close()
    return lines()
