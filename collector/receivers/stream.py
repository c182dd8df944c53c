"""Plugin stream receiver: Unix-socket and TCP listeners, many connections, one selector thread.

Per connection: a bounded receive buffer (one max-size frame plus ``recv_chunk_bytes``) and a
:class:`~collector.decode.StreamDecoder`. Bad input (wrong magic/version/record size, too many
records, truncated frame at EOF, records before PROCESS, a flood above
``max_records_per_s_per_connection``) is logged once, counted, and that connection is closed;
every other connection keeps being served. ``next_consumer.consume`` must not block (the
pipeline hands it a bounded queue that drops and counts).
"""
from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from typing import Callable


from collector.component import RecordBatch
from collector.config import ReceiverConfig
from collector.decode import GapTracker, ProtocolError, StreamDecoder
from collector.metrics import PluginStats, SelfMetrics
from collector.net import listen
from collector.wire_format import MAX_RECORDS_PER_FRAME, RECORD_SIZE

__all__ = ["StreamReceiver"]

log = logging.getLogger(__name__)
_MAX_FRAME = 16 + MAX_RECORDS_PER_FRAME * RECORD_SIZE


class _Conn:
    __slots__ = ("sock", "transport", "peer", "decoder", "buf", "view", "fill", "rate_start",
                 "rate_count")

    def __init__(self, sock, transport: str, peer: str, bufsize: int, now: float):
        self.sock = sock
        self.transport = transport
        self.peer = peer
        self.decoder = StreamDecoder()
        self.buf = bytearray(bufsize)
        self.view = memoryview(self.buf)
        self.fill = 0
        self.rate_start = now
        self.rate_count = 0


class StreamReceiver:
    """Receiver for ``unix:PATH`` and ``tcp:HOST:PORT`` listeners (``config.listen``)."""

    def __init__(self, config: ReceiverConfig, *, next_consumer, metrics: SelfMetrics,
                 plugin_stats: PluginStats | None = None,
                 clock: Callable[[], float] = time.monotonic):
        config.validate()
        if next_consumer is None:
            raise ValueError("next_consumer must not be None")
        self.config = config
        self.next_consumer = next_consumer
        self.metrics = metrics
        self.plugin_stats = plugin_stats or PluginStats()
        self.gaps = GapTracker(config.gap_tracker_max_processes)
        self._clock = clock
        self._sel: selectors.BaseSelector | None = None
        self._listeners: list[tuple[socket.socket, str, str]] = []
        self._conns: dict[int, _Conn] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r = self._wake_w = None
        self.addresses: list[str] = []  # bound addresses (tcp port 0 resolved)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        try:
            for address in self.config.listen:
                self._listeners.append(listen(address, key="listen"))
        except BaseException:
            self._close_listeners()
            raise
        self.addresses = [bound for _, _, bound in self._listeners]
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        for sock, kind, _bound in self._listeners:
            self._sel.register(sock, selectors.EVENT_READ, ("listen", kind))
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dynamiccl-stream-receiver", daemon=True)
        self._thread.start()
        log.info("stream receiver listening on %s", ", ".join(self.addresses))

    def shutdown(self) -> None:
        if self._thread is None:
            self._close_listeners()
            return
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=10)
        self._thread = None
        for conn in list(self._conns.values()):
            self._close(conn)
        self._close_listeners()
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._wake_r = self._wake_w = None
        if self._sel is not None:
            self._sel.close()
            self._sel = None
        log.info("stream receiver stopped")

    def _close_listeners(self) -> None:
        for sock, kind, bound in self._listeners:
            try:
                sock.close()
            finally:
                if kind == "unix":
                    try:
                        os.unlink(bound[5:])
                    except OSError:
                        pass
        self._listeners = []

    # -- loop ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._sel.select(timeout=0.5)
            except OSError:  # pragma: no cover
                continue
            for key, _mask in events:
                what, info = key.data
                try:
                    if what == "listen":
                        self._accept(key.fileobj, info)
                    elif what == "conn":
                        self._read(info)
                    else:
                        try:
                            self._wake_r.recv(4096)
                        except OSError:
                            pass
                except Exception:  # never let one connection kill the loop
                    if what == "conn":
                        log.exception("connection %s: unexpected error; closing it", info.peer)
                        self.metrics.bad("internal_error")
                        self._close(info)
                    else:
                        log.exception("stream receiver: unexpected error in %s", what)

    def _accept(self, lsock: socket.socket, transport: str) -> None:
        for _ in range(64):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving existing connections
                log.warning("accept failed: %s", exc)
                return
            if len(self._conns) >= self.config.max_connections:
                sock.close()
                continue
            sock.setblocking(False)
            peer = f"{transport}:{addr}" if addr else f"{transport}:{lsock.getsockname()}"
            conn = _Conn(sock, transport, peer, self.config.recv_chunk_bytes + _MAX_FRAME, self._clock())
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, ("conn", conn))
            with self.metrics._lock:
                self.metrics.connections_open += 1
                self.metrics.connections_total[transport] = self.metrics.connections_total.get(transport, 0) + 1

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd < 0 or self._conns.get(fd) is not conn:
            return
        del self._conns[fd]
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        with self.metrics._lock:
            self.metrics.connections_open -= 1

    def _reject(self, conn: _Conn, reason: str, message: str) -> None:
        log.warning("connection %s (host=%s pid=%s): %s; dropping the connection", conn.peer,
                    conn.decoder.host, conn.decoder.pid, message)
        self.metrics.bad(reason)
        self._close(conn)

    def _read(self, conn: _Conn) -> None:
        space = min(len(conn.buf) - conn.fill, self.config.recv_chunk_bytes)
        try:
            n = conn.sock.recv_into(conn.view[conn.fill:conn.fill + space])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.info("connection %s: %s", conn.peer, exc)
            self._close(conn)
            return
        if n == 0:
            if conn.fill:
                self._reject(conn, "truncated", f"connection closed inside a frame ({conn.fill} bytes pending)")
            else:
                self._close(conn)
            return
        conn.fill += n
        try:
            res = conn.decoder.feed(conn.view[:conn.fill])
        except ProtocolError as exc:
            self._reject(conn, exc.reason, str(exc))
            return
        rest = conn.fill - res.consumed
        if res.consumed:
            conn.buf[:rest] = conn.buf[res.consumed:conn.fill]
        conn.fill = rest
        if res.n_records:
            self._deliver(conn, res)

    def _deliver(self, conn: _Conn, res) -> None:
        m = self.metrics
        dec = conn.decoder
        m.add("received", res.n_records)
        now = self._clock()
        if now - conn.rate_start >= 1.0:
            conn.rate_start, conn.rate_count = now, 0
        conn.rate_count += res.n_records
        if conn.rate_count > self.config.max_records_per_s_per_connection:
            m.drop("flood", res.n_records)
            self._reject(conn, "flood", f"more than {self.config.max_records_per_s_per_connection} "
                                        "records/s on one connection")
            return
        lost, jumps = self.gaps.observe(dec.process_key, res.seqs)
        if lost:
            m.gap(dec.job_id, dec.host, lost, jumps)
        if res.n_invalid_kind:
            m.drop("invalid", res.n_invalid_kind)
        for st in res.stats:
            self.plugin_stats.update(dec.job_id, dec.host, dec.process_key + (int(st["pid"]),),
                                     {k: int(st[k]) for k in PluginStats.FIELDS})
        if res.events is not None and len(res.events):
            self.next_consumer.consume(RecordBatch(res.events, dec.host, dec.job_id, dec.comm_names))

    @property
    def connections(self) -> int:
        return len(self._conns)


