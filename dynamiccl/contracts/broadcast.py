"""One bounded NDJSON broadcast server: every line published goes to every connected client.

The collector's feature stream and the detector's regime-change stream both serve through it. Rules:

* each client has a bounded queue (``max_queue`` lines); when it is full the *oldest* line is dropped and
  counted (``on_drop``), so a slow or stuck client never blocks the publisher;
* one thread writes non-blocking with a selector, so no client can stall another;
* at ``max_clients`` (plus ``extra_clients()``, subscribers the owner serves in process) a new connection
  takes the slot of a client that has left lines unread for ``stall_timeout_s``, else it is refused;
  both are counted (``on_refuse("subscriber_stalled" | "subscriber_limit", peer)``);
* ``greeting()`` gives the lines a new client receives first (the changes still active, for example);
* clients send nothing: anything they send is read and discarded, end of file closes them.

The caller binds the listening socket (its address rules live with it) and hands it over.

>>> import socket, threading
>>> srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM); srv.bind(("127.0.0.1", 0)); srv.listen()
>>> b = LineBroadcaster(srv, greeting=lambda: [b"hello\\n"]).start()
>>> c = socket.create_connection(srv.getsockname()); f = c.makefile("rb")
>>> f.readline()
b'hello\\n'
>>> import time; t0 = time.monotonic()
>>> while b.n_clients < 1 and time.monotonic() - t0 < 5: time.sleep(0.01)
>>> b.publish(b"one\\n"); f.readline()
b'one\\n'
>>> c.close(); b.shutdown()
"""
from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections import deque
from typing import Callable, Iterable

__all__ = ["LineBroadcaster"]

log = logging.getLogger(__name__)


class _Client:
    __slots__ = ("sock", "queue", "pending", "peer", "backlog_since")

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock, self.peer = sock, peer
        self.queue: deque[bytes] = deque()
        self.pending = memoryview(b"")
        self.backlog_since: float | None = None  # since when lines wait for this client


class LineBroadcaster:
    def __init__(self, listener: socket.socket, *, max_queue: int = 1024, max_clients: int = 64,
                 stall_timeout_s: float = 10.0, greeting: Callable[[], Iterable[bytes]] = tuple,
                 extra_clients: Callable[[], int] = lambda: 0, on_drop: Callable[[], None] = lambda: None,
                 on_refuse: Callable[[str, str], None] = lambda reason, peer: None,
                 on_clients: Callable[[int], None] = lambda n: None, name: str = "broadcast") -> None:
        self._listener = listener
        self.max_queue, self.max_clients, self.stall_timeout_s = max_queue, max_clients, stall_timeout_s
        self._greeting, self._extra = greeting, extra_clients
        self._on_drop, self._on_refuse, self._on_clients = on_drop, on_refuse, on_clients
        self._name = name
        self._clients: dict[int, _Client] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        self.dropped = 0

    @property
    def n_clients(self) -> int:
        with self._lock:
            return len(self._clients)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "LineBroadcaster":
        self._listener.setblocking(False)
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop serving and close every client; the listening socket is the caller's to close."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        for c in list(self._clients.values()):
            self._drop_client(c)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- publishing -----------------------------------------------------------------------------
    def publish(self, line: bytes) -> None:
        with self._lock:
            for c in self._clients.values():
                self._enqueue(c, line)
        self._wake()

    def _enqueue(self, c: _Client, line: bytes) -> None:
        if len(c.queue) >= self.max_queue:
            c.queue.popleft()
            self.dropped += 1
            self._on_drop()
        if c.backlog_since is None:
            c.backlog_since = time.monotonic()
        c.queue.append(line)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # -- the server thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                clients = list(self._clients.values())
            for c in clients:      # writable interest only for clients with data
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
                self._event(key.data, mask)

    def _event(self, data, mask: int) -> None:
        try:
            if data is None:
                self._wake_r.recv(4096)
            elif data == "listen":
                self._accept()
            else:
                self._service(data, mask)
        except (BlockingIOError, InterruptedError):
            pass
        except Exception:
            log.exception("%s: unexpected error", self._name)
            if isinstance(data, _Client):
                self._drop_client(data)

    def _accept(self) -> None:
        try:
            sock, addr = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        peer = str(addr) if addr else "unix"
        if self.n_clients + self._extra() >= self.max_clients and not self._evict_stalled():
            sock.close()
            self._on_refuse("subscriber_limit", peer)
            return
        sock.setblocking(False)
        c = _Client(sock, peer)
        with self._lock:
            for line in self._greeting():
                self._enqueue(c, line)
            self._clients[id(c)] = c
            n = len(self._clients)
        self._sel.register(sock, selectors.EVENT_READ, c)
        self._on_clients(n)

    def _evict_stalled(self) -> bool:
        """Make room by dropping the client that has left lines unread longest, if it has for
        ``stall_timeout_s`` (a connection that never reads cannot hold a slot for ever)."""
        now = time.monotonic()
        with self._lock:
            stalled = [c for c in self._clients.values()
                       if c.backlog_since is not None and now - c.backlog_since > self.stall_timeout_s]
        if not stalled:
            return False
        victim = min(stalled, key=lambda c: c.backlog_since or now)
        self._drop_client(victim)
        self._on_refuse("subscriber_stalled", victim.peer)
        return True

    def _drop_client(self, c: _Client) -> None:
        with self._lock:
            gone = self._clients.pop(id(c), None) is not None
            n = len(self._clients)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        if gone:
            self._on_clients(n)

    def _service(self, c: _Client, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            try:
                data = c.sock.recv(4096)       # clients send nothing; end of file means they left
            except (BlockingIOError, InterruptedError):
                data = b"x"
            except OSError:
                data = b""
            if not data:
                self._drop_client(c)
                return
        if mask & selectors.EVENT_WRITE:
            self._write(c)

    def _write(self, c: _Client) -> None:
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
