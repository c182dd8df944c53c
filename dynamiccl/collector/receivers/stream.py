"""Plugin stream receiver: Unix-socket and TCP listeners, many connections, one selector thread.

Per connection: a :class:`~dynamiccl.collector.decode.StreamDecoder` and, only while a frame is incomplete,
its bytes (reads go through one shared buffer, so an idle connection holds none; all partial frames
together are bounded by ``max_pending_bytes``). Connections are capped (``max_connections``, of
which ``reserved_local_connections`` only Unix-socket peers may use); a peer that sends no PROCESS
record within ``handshake_timeout_s``, nothing for ``idle_timeout_s`` or no complete frame for
``frame_timeout_s`` (slow loris) is closed. Every refusal is counted in
``dynamiccl_collector_connections_refused_total{reason}`` and logged at most once a minute per reason.
With ``tokens_file`` set, every connection must open with a valid token (dynamiccl/collector/auth.py). Bad input (wrong magic/version/record size, too many
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

import numpy as np

from dynamiccl.collector.auth import NeedMore, TokenTable, parse_preamble
from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import ReceiverConfig
from dynamiccl.collector.decode import GapTracker, ProtocolError, StreamDecoder
from dynamiccl.collector.metrics import PluginStats, SelfMetrics
from dynamiccl.collector.net import listen
from dynamiccl.collector.processors.peers import PeerBatch
from dynamiccl.collector.processors.wait_losses import LossNote
from dynamiccl.collector.ratelog import RateLimitedLog
from dynamiccl.collector.receivers.continuity import RestartLedger
from dynamiccl.collector.records import event_time_ns
from dynamiccl.collector.wire_format import MAX_RECORDS_PER_FRAME, PEER_DTYPE, RECORD_SIZE

__all__ = ["StreamReceiver"]

log = logging.getLogger(__name__)
_MAX_FRAME = 16 + MAX_RECORDS_PER_FRAME * RECORD_SIZE


#: the plugin socket's mode, whatever the umask: the collector's user and group may connect (connect()
#: needs write permission), other users may not. Deployments share the group with training processes
#: (Kubernetes fsGroup, Slurm runs the collector as the job's user).
UNIX_SOCKET_MODE = 0o660


class _Conn:
    """One connection. Holds no buffer while idle: only a partial frame is kept (``pending``)."""
    __slots__ = ("sock", "transport", "peer", "decoder", "pending", "opened", "last_rx", "frame_since",
                 "rate_start", "rate_count", "greeted", "bound_job", "job_key")

    def __init__(self, sock, transport: str, peer: str, now: float):
        self.sock = sock
        self.transport = transport
        self.peer = peer
        self.decoder = StreamDecoder()
        self.pending = b""
        self.opened = self.last_rx = now
        self.frame_since: float | None = None  # when the partial frame in ``pending`` last progressed
        self.rate_start = now
        self.rate_count = 0
        self.greeted = False           # the auth preamble (or its absence) has been handled
        self.bound_job: str | None = None  # the job its token may speak for (None: any)
        self.job_key: tuple[str, str] | None = None  # (job_id, host) once counted in job_connections


class StreamReceiver:
    """Receiver for ``unix:PATH`` and ``tcp:HOST:PORT`` listeners (``config.listen``)."""

    def __init__(self, config: ReceiverConfig, *, next_consumer, metrics: SelfMetrics,
                 plugin_stats: PluginStats | None = None, peer_consumer=None,
                 clock: Callable[[], float] = time.monotonic, losses=None):
        config.validate()
        self.losses = losses   # floods and delivery gaps told to the waits' lossy rule (processors/wait_losses.py)
        self.peer_consumer = peer_consumer  # PEER records (processors/peers.py); None: counted as invalid
        if next_consumer is None:
            raise ValueError("next_consumer must not be None")
        self.config = config
        self.next_consumer = next_consumer
        self.metrics = metrics
        self.plugin_stats = plugin_stats or PluginStats()
        self.gaps = GapTracker(config.gap_tracker_max_processes)
        self.restarts = RestartLedger(config.gap_tracker_max_processes)
        self._clock = clock
        self._sel: selectors.BaseSelector | None = None
        self._listeners: list[tuple[socket.socket, str, str]] = []
        self._conns: dict[int, _Conn] = {}
        self._tcp_conns = 0
        self._pending_bytes = 0  # bytes of partial frames held by all connections
        self._scratch = bytearray(config.recv_chunk_bytes + _MAX_FRAME)
        self._scratch_view = memoryview(self._scratch)
        self._next_reap = 0.0
        self._refusal_log = RateLimitedLog(log, 60.0, clock=clock)
        self._tokens: TokenTable | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r = self._wake_w = None
        self.addresses: list[str] = []  # bound addresses (tcp port 0 resolved)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        if self.config.tokens_file is not None:  # PermissionError/ValueError: a start-up error
            self._tokens = TokenTable.load(self.config.tokens_file)
        try:
            for address in self.config.listen:
                self._listeners.append(listen(address, key="listen"))
        except BaseException:
            self._close_listeners()
            raise
        for _sock, kind, bound in self._listeners:
            if kind == "unix":
                os.chmod(bound[5:], UNIX_SOCKET_MODE)
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
                events = self._sel.select(timeout=0.25)
            except OSError:  # pragma: no cover
                continue
            now = self._clock()
            if now >= self._next_reap:
                self._next_reap = now + 0.25
                self._reap(now)
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
                self._refuse(None, "accept_failed", f"accept failed: {exc}")
                return
            peer = f"{transport}:{addr}" if addr else f"{transport}:{lsock.getsockname()}"
            cfg = self.config
            tcp_cap = cfg.max_connections - cfg.reserved_local_connections
            if len(self._conns) >= cfg.max_connections or (transport == "tcp" and self._tcp_conns >= tcp_cap):
                sock.close()
                self._refuse(None, "connection_limit", f"{peer}: connection refused: "
                             f"{len(self._conns)} connections open ({self._tcp_conns} tcp; limits "
                             f"max_connections={cfg.max_connections}, tcp {tcp_cap})")
                continue
            sock.setblocking(False)
            conn = _Conn(sock, transport, peer, self._clock())
            self._conns[sock.fileno()] = conn
            self._tcp_conns += transport == "tcp"
            self._sel.register(sock, selectors.EVENT_READ, ("conn", conn))
            with self.metrics._lock:
                self.metrics.connections_open += 1
                self.metrics.connections_total[transport] = self.metrics.connections_total.get(transport, 0) + 1

    def _refuse(self, conn: _Conn | None, reason: str, message: str) -> None:
        """Count a refused or timed-out connection (closing it), log at most once a minute per reason."""
        self.metrics.refused(reason)
        self._refusal_log.warning(reason, "%s (counted in dynamiccl_collector_connections_refused_total"
                                  "{reason=\"%s\"})", message, reason)
        if conn is not None:
            self._close(conn)

    def _reap(self, now: float) -> None:
        """Close connections past a handshake, idle or partial-frame timeout."""
        cfg = self.config
        for conn in list(self._conns.values()):
            if conn.decoder.host is None and now - conn.opened > cfg.handshake_timeout_s:
                self._refuse(conn, "handshake_timeout", f"connection {conn.peer}: no PROCESS record "
                             f"within {cfg.handshake_timeout_s:g} s; closed")
            elif now - conn.last_rx > cfg.idle_timeout_s:
                self._refuse(conn, "idle_timeout", f"connection {conn.peer}: nothing received for "
                             f"{cfg.idle_timeout_s:g} s; closed")
            elif conn.frame_since is not None and now - conn.frame_since > cfg.frame_timeout_s:
                self._refuse(conn, "frame_timeout", f"connection {conn.peer}: a frame incomplete for "
                             f"{cfg.frame_timeout_s:g} s (slow sender); closed")

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd < 0 or self._conns.get(fd) is not conn:
            return
        del self._conns[fd]
        self._tcp_conns -= conn.transport == "tcp"
        self._pending_bytes -= len(conn.pending)
        conn.pending = b""
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        with self.metrics._lock:
            self.metrics.connections_open -= 1
        if conn.job_key is not None:
            self.metrics.job_connection(conn.job_key, -1)

    def _reject(self, conn: _Conn, reason: str, message: str) -> None:
        log.warning("connection %s (host=%s pid=%s): %s; dropping the connection", conn.peer,
                    conn.decoder.host, conn.decoder.pid, message)
        self.metrics.bad(reason)
        self._close(conn)

    def _read(self, conn: _Conn) -> None:
        view = self._scratch_view
        held = len(conn.pending)
        if held:
            view[:held] = conn.pending
        try:
            n = conn.sock.recv_into(view[held:held + self.config.recv_chunk_bytes])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.info("connection %s: %s", conn.peer, exc)
            self._close(conn)
            return
        if n == 0:
            if held:
                self._reject(conn, "truncated", f"connection closed inside a frame ({held} bytes pending)")
            else:
                self._close(conn)
            return
        now = self._clock()
        conn.last_rx = now
        fill = held + n
        start = 0
        if not conn.greeted:
            start = self._greet(conn, view[:fill])
            if start is None:  # refused, or the preamble is still incomplete
                if conn.sock.fileno() >= 0 and not conn.greeted:
                    self._pending_bytes += fill - held
                    conn.pending = bytes(view[:fill])
                return
        try:
            res = conn.decoder.feed(view[start:fill])
        except ProtocolError as exc:
            self._reject(conn, exc.reason, str(exc))
            return
        if conn.bound_job is not None and conn.decoder.job_id not in (None, conn.bound_job):
            self._refuse(conn, "auth", f"connection {conn.peer}: token of job {conn.bound_job!r} used for job "
                         f"{conn.decoder.job_id!r}; closed")
            return
        if conn.job_key is None and conn.decoder.job_id is not None:
            conn.job_key = (conn.decoder.job_id, conn.decoder.host)
            self.metrics.job_connection(conn.job_key, +1)
        res.consumed += start
        rest = fill - res.consumed
        if res.consumed or not rest:
            conn.frame_since = now if rest else None
        if rest and self._pending_bytes - held + rest > self.config.max_pending_bytes:
            self._refuse(conn, "buffer_limit", f"connection {conn.peer}: partial frames of all connections "
                         f"would exceed max_pending_bytes={self.config.max_pending_bytes}; closed")
            return
        self._pending_bytes += rest - held
        conn.pending = bytes(view[res.consumed:fill]) if rest else b""
        if res.n_records:
            self._deliver(conn, res)

    def _greet(self, conn: _Conn, buf) -> int | None:
        """Handle the auth preamble: bytes it used, or None (refused, or not complete yet)."""
        try:
            used, token = parse_preamble(buf)
        except NeedMore:
            return None
        except ValueError as exc:
            self._refuse(conn, "auth", f"connection {conn.peer}: {exc}; closed")
            return None
        if self._tokens is not None and (conn.transport == "tcp" or self.config.auth_unix):
            ok, job = self._tokens.check(token)
            if not ok:
                self._refuse(conn, "auth", f"connection {conn.peer}: {'wrong' if token else 'no'} token; closed")
                return None
            conn.bound_job = job
        conn.greeted = True
        return used

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
            if self.losses is not None and res.events is not None:
                self.losses.note(LossNote("flood", dec.job_id, len(res.events), res.events))
            self._reject(conn, "flood", f"more than {self.config.max_records_per_s_per_connection} "
                                        "records/s on one connection")
            return
        lost, jumps = self.gaps.observe(dec.process_key, res.seqs)
        if lost:
            m.gap(dec.job_id, dec.host, lost, jumps)
            if self.losses is not None:        # the lost records are older than this batch's latest
                t_hi = int(event_time_ns(res.events).max()) if res.events is not None and len(res.events) else None
                self.losses.note(LossNote("delivery_gap", dec.job_id, lost, t_hi_ns=t_hi))
        if res.n_invalid_kind:
            m.drop("invalid", res.n_invalid_kind)
        for st in res.stats:
            self.plugin_stats.update(dec.job_id, dec.host, dec.process_key + (int(st["pid"]),),
                                     {k: int(st[k]) for k in PluginStats.FIELDS})
            self._unconfirmed(dec, st)
        if res.events is not None and len(res.events):
            self.next_consumer.consume(RecordBatch(res.events, dec.host, dec.job_id, dec.comm_names))
        if res.peers:
            if self.peer_consumer is None:
                m.drop("invalid", len(res.peers))
            else:
                self.peer_consumer.consume(PeerBatch(np.array(res.peers, PEER_DTYPE), dec.host, dec.job_id,
                                                     dec.comm_names))

    def _unconfirmed(self, dec, st) -> None:
        n = self.restarts.observe(dec.process_key + (int(st["pid"]),), int(st["reserved"][0]),
                                  int(st["records_sent"]))
        if n:
            m = self.metrics
            m.add("records_unconfirmed", n)
            self._refusal_log.warning("unconfirmed", "job %s host %s pid %d: %d records were sent on %d earlier "
                                      "connection(s) to another collector (a restart?); counted as unconfirmed",
                                      dec.job_id, dec.host, int(st["pid"]), n, int(st["reserved"][0]) - 1)

    @property
    def connections(self) -> int:
        return len(self._conns)


