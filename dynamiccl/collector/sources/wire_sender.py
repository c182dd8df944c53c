"""Bounded record queue + background sender thread speaking the plugin's wire format.

A source inside a training process (``dynamiccl.collector.sources.torch_distributed``) appends one tuple
per finished operation to :attr:`WireSender.queue` — a ``collections.deque`` whose length it
checks first (``if len(q) < cap: q.append(t) else: sender.drop()``), so the application thread
never blocks, never allocates more than one tuple, and never touches a socket. The sender
thread wakes every ``flush_ms`` (1 ms while the queue is more than a quarter full), turns the
queued tuples into ``EVENT_DTYPE`` records with a few numpy column assignments, and writes
frames exactly as the C plugin does (``dynamiccl/collector/wire_format.py``):

* each connection starts with PROCESS, then one COMM record per known communicator (again
  after every reconnect; a communicator registered later is announced before its first record);
* COLL / P2P records, ``record_seq`` = position in the queue order (assigned when taken from the
  queue, so a record lost on the way to the collector shows as a delivery gap);
* a STATS record right after the hello and about once a second, with the same counters the plugin reports
  and the connection's ordinal in ``reserved[0]`` (a restarted collector counts what went before).

The collector being down never hurts the job: the thread reconnects with backoff (0.1 s … 5 s),
drains the queue meanwhile and counts what it could not deliver (``records_undelivered``).

A socket in the per-user runtime directory (the default, ``dynamiccl/contracts/runtime_paths.py``) is
connected only while that directory passes ``check_private_dir`` (checked before every connect, as
the C sender does): a directory another user owns or can write may hold a squatter's socket, which
would receive the job's records. Such a directory is logged once with its reason; the records are
counted undelivered.

>>> import socket, numpy as np
>>> from dynamiccl.collector.decode import StreamDecoder
>>> a, b = socket.socketpair()
>>> s = WireSender(SenderConfig(collector="unix:/nonexistent", host="h0", job_id="j"))
>>> comm = Comm(comm_hash=0xABC, name="world", rank=0, nranks=2, nnodes=1)
>>> s.register_comm(comm)
>>> s.queue.append((comm, 1, 1, 6, 0, 256, 1024, 0, 1_000, 51_000, 2))  # AllReduce, 1 KiB, 50 µs
>>> s.attach(a)                         # tests: use an already-connected socket
>>> s.flush_once()
1
>>> res = StreamDecoder().feed(b.recv(1 << 16))
>>> int(res.events["bytes"][0]), int(res.events["cpu_end_ns"][0] - res.events["enqueue_ns"][0])
(1024, 50000)
>>> a.close(); b.close()
"""
from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dynamiccl.collector.auth import encode_preamble
from dynamiccl.collector.config import parse_address
from dynamiccl.collector.sources.sender_config import SenderConfig, env_int, job_id_from_env
from dynamiccl.collector.sources import wire_records as records
from dynamiccl.collector.sources.wire_records import EVENT_FIELDS
from dynamiccl.collector.wire_format import MAX_RECORDS_PER_FRAME
from dynamiccl.contracts.runtime_paths import UnsafeDirectory, check_private_dir

__all__ = ["SenderConfig", "Comm", "WireSender", "EVENT_FIELDS", "env_int", "job_id_from_env"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Comm:
    """One communicator as the collector sees it (COMM record + per-record fields)."""
    comm_hash: int
    name: str
    rank: int
    nranks: int
    nnodes: int = 0  # 0 = unknown
    extra: dict = field(default_factory=dict)  # source-private (e.g. group rank of global ranks)


class WireSender:
    """Queue + sender thread. ``start()`` launches the thread; ``close()`` flushes (≤ 0.5 s)."""

    def __init__(self, config: SenderConfig, *,
                 stats_provider: Callable[[], dict] | None = None,
                 on_tick: Callable[[], float | None] | None = None,
                 clock_ns: Callable[[], int] = time.time_ns,
                 monotonic: Callable[[], float] = time.monotonic):
        self.config = config.validate()
        self.queue: deque = deque()
        self.capacity = config.queue_size
        self._stats_provider = stats_provider
        self._on_tick = on_tick
        self._clock_ns = clock_ns
        self._mono = monotonic
        self.start_ns = clock_ns()
        self.pid = os.getpid()
        self._comms: list[Comm] = []
        self._announced: set[int] = set()   # id(comm) announced on the current connection
        self.conn_ordinal = 0               # 1, 2, ... per connection: STATS reserved[0] (receivers/continuity.py)
        self._sock: socket.socket | None = None
        self._next_connect = 0.0
        self._backoff = config.reconnect_min_s
        self._ever_connected = False
        self._drop_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one flush at a time (thread vs close/flush_once)
        # counters (STATS record)
        self.seq = 0                 # record_seq of the last record taken from the queue
        self.dropped_queue_full = 0  # records refused: queue full (hot path, under _drop_lock)
        self.undelivered = 0         # taken from the queue but not sent (no collector / failure)
        self.sent = 0
        self.reconnects = 0
        self.frames_sent = 0
        self.unsafe_dir_logged = False   # the runtime directory was refused (logged once)

    # -- application side ---------------------------------------------------------------------
    def offer(self, item: tuple) -> bool:
        """Append one event tuple (``EVENT_FIELDS`` order) unless the queue is full."""
        if len(self.queue) < self.capacity:
            self.queue.append(item)
            return True
        self.drop()
        return False

    def drop(self, n: int = 1) -> None:
        with self._drop_lock:
            self.dropped_queue_full += n

    def register_comm(self, comm: Comm) -> None:
        """Announce a communicator (before its first record; again after each reconnect)."""
        with self._lock:
            self._comms.append(comm)

    def wake(self) -> None:
        self._wake.set()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "WireSender":
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="dynamiccl-wire-sender", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 0.5) -> None:
        """Stop the thread after a last flush bounded by ``timeout`` seconds; close the socket."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            self._disconnect()

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def attach(self, sock: socket.socket) -> None:
        """Use an already-connected socket (tests); sends the PROCESS/COMM hello on it."""
        with self._lock:
            self._disconnect()
            sock.settimeout(self.config.send_timeout_s)
            self._sock = sock
            self._announced = set()
            self._hello()

    def counters(self) -> dict:
        """The STATS values (plus ``queued``), as plain ints."""
        extra = self._stats_provider() if self._stats_provider else {}
        return {
            "events_dropped_pool_full": int(extra.get("events_dropped_pool_full", 0)),
            "records_dropped_ring_full": self.dropped_queue_full,
            "records_undelivered": self.undelivered,
            "records_sent": self.sent,
            "records_emitted": self.seq + len(self.queue),
            "events_stale": int(extra.get("events_stale", 0)),
            "reconnects": self.reconnects,
            "sampled_out": int(extra.get("sampled_out", 0)),
            "kernel_ch_rejected": 0,
            "queued": len(self.queue),
        }

    # -- sender thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        next_stats = self._mono() + self.config.stats_interval_s
        flush_s = self.config.flush_ms / 1000.0
        while True:
            wait = flush_s
            if len(self.queue) > self.capacity // 4:
                wait = 0.001
            if self._on_tick is not None:
                try:
                    want = self._on_tick()
                except Exception:  # a source bug must not kill the sender
                    log.exception("dynamiccl source tick failed")
                    want = None
                if want is not None:
                    wait = min(wait, want)
            self._wake.wait(wait)
            self._wake.clear()
            stopping = self._stop.is_set()
            try:
                now = self._mono()
                with_stats = now >= next_stats or stopping
                if with_stats:
                    next_stats = now + self.config.stats_interval_s
                self.flush_once(stats=with_stats)
            except Exception:  # pragma: no cover - never let the thread die
                log.exception("dynamiccl sender: unexpected error")
            if stopping:
                return

    def flush_once(self, *, stats: bool = False) -> int:
        """Connect if due, drain the queue and send it; returns the records taken."""
        with self._lock:
            self._check_peer()
            if self._sock is None and self._mono() >= self._next_connect:
                self._connect()
            return self._drain(stats)

    def _drain(self, stats: bool) -> int:
        taken = 0
        q = self.queue
        while True:
            n = min(len(q), MAX_RECORDS_PER_FRAME - 1 - len(self._comms))
            if n <= 0 and not stats:
                break
            items = [q.popleft() for _ in range(max(n, 0))]
            taken += len(items)
            records = self._encode(items) if items else None
            prefix = self._pending_comms() if self._sock is not None else []
            chunks = [r.tobytes() for r in prefix]
            if records is not None:
                chunks.append(records.tobytes())
            if stats:
                chunks.append(self._stats_record().tobytes())
                stats = False
            if chunks:
                self._send(chunks, len(items))
            if len(q) == 0:
                break
        return taken

    def _encode(self, items: list[tuple]) -> np.ndarray:
        rec = records.events(items, pid=self.pid, first_seq=self.seq + 1)
        self.seq += len(items)
        return rec

    def _pending_comms(self) -> list[np.ndarray]:
        out = []
        for c in self._comms:
            if id(c) not in self._announced:
                self._announced.add(id(c))
                out.append(records.comm(c, pid=self.pid))
        return out

    def _stats_record(self) -> np.ndarray:
        return records.stats(self.counters(), pid=self.pid, time_ns=self._clock_ns(), conn_ordinal=self.conn_ordinal)

    def _process_record(self) -> np.ndarray:
        return records.process(pid=self.pid, start_ns=self.start_ns, host=self.config.host, job_id=self.config.job_id)

    # -- socket ---------------------------------------------------------------------------------------
    def _send(self, chunks: list[bytes], n_events: int) -> None:
        if self._sock is None:
            self.undelivered += n_events
            return
        frame = records.frame(b"".join(chunks))
        try:
            self._sock.sendall(frame, socket.MSG_NOSIGNAL)
        except OSError as exc:
            log.info("dynamiccl source: lost the collector at %s (%s)", self.config.collector, exc)
            self.undelivered += n_events
            self._disconnect()
            return
        self.sent += n_events
        self.frames_sent += 1

    def _hello(self) -> None:
        self._announced = set()
        if self.config.token:  # the auth preamble goes before the first frame
            try:
                self._sock.sendall(encode_preamble(self.config.token))
            except OSError:
                self._disconnect()
                return
        self.conn_ordinal += 1
        chunks = [self._process_record().tobytes()] + [r.tobytes() for r in self._pending_comms()]
        self._send(chunks + [self._stats_record().tobytes()], 0)   # ordinal + what earlier connections took

    def _unsafe_dir(self, kind: str, target) -> str | None:
        """Why the socket's directory must not be used now, or ``None`` (see the module docstring)."""
        if kind != "unix" or os.path.dirname(target) != self.config.private_dir.rstrip("/"):
            return None
        try:
            check_private_dir(self.config.private_dir)
        except FileNotFoundError:
            return None  # no collector yet: connect() fails and is retried
        except (UnsafeDirectory, OSError) as exc:
            return str(exc)
        return None

    def _connect(self) -> None:
        kind, target = parse_address(self.config.collector, key="DYNAMICCL_COLLECTOR")
        unsafe = self._unsafe_dir(kind, target)
        if unsafe is not None:
            if not self.unsafe_dir_logged:
                log.warning("dynamiccl source: not connecting to %s: %s; records are counted undelivered "
                            "(logged once)", self.config.collector, unsafe)
                self.unsafe_dir_logged = True
            self._next_connect = self._mono() + self.config.reconnect_max_s
            return
        sock = None
        try:
            if kind == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            else:
                host, port = target
                family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.config.connect_timeout_s)
            sock.connect(target)
        except OSError:
            if sock is not None:
                sock.close()
            self._next_connect = self._mono() + self._backoff
            self._backoff = min(self._backoff * 2, self.config.reconnect_max_s)
            return
        sock.settimeout(self.config.send_timeout_s)
        self._sock = sock
        self._backoff = self.config.reconnect_min_s
        if self._ever_connected:
            self.reconnects += 1
        self._ever_connected = True
        log.info("dynamiccl source: connected to %s", self.config.collector)
        self._hello()

    def _check_peer(self) -> None:
        """The collector never writes: readable means EOF (collector gone)."""
        if self._sock is None:
            return
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            if not readable:
                return
            data = self._sock.recv(256)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return
        except (OSError, ValueError):
            self._disconnect()
            return
        if data == b"":
            self._disconnect()

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:  # pragma: no cover
                pass
            self._sock = None
            self._announced = set()
