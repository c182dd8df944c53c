"""A minimal collector stand-in for tests and ``simulate bench``: it accepts plugin connections and keeps the records.

>>> import tempfile, os
>>> sink = WireSink(f"unix:{os.path.join(tempfile.mkdtemp(), 's.sock')}")
>>> sink.count, len(sink.events())
(0, 0)
>>> sink.close()
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import numpy as np

from dynamiccl.collector import wire_format as wf
from dynamiccl.collector.decode import ProtocolError, read_frames
from dynamiccl.collector.net import listen

__all__ = ["WireSink"]


class WireSink:
    """A minimal collector stand-in (tests, ``simulate bench``): accepts plugin connections on ``unix:PATH`` or
    ``tcp:HOST:PORT`` and splits the stream into frames with the :mod:`dynamiccl.collector.wire_format` header; records
    are kept raw (``keep=True``) and decoded on demand, vectorised. ``count`` = COLL/P2P records received."""

    def __init__(self, addr: str, *, keep: bool = True) -> None:
        self.addr, self.keep = addr, keep
        self._raw: list[np.ndarray] = []
        self.count = 0
        self.reads = 0          # reads that completed at least one frame with records
        self.bad_frames = 0
        self._lock = threading.Lock()
        # the collector's own listener: a stale socket file is replaced, a live one refused
        self._srv, _, _ = listen(addr, key="WireSink address", backlog=64)
        self._srv.setblocking(True)
        self._threads: list[threading.Thread] = []
        self._conns: list[Any] = []
        self._closed = False
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            self._conns.append(conn)
            t = threading.Thread(target=self._read, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _read(self, conn: Any) -> None:
        try:
            for rec, _used in read_frames(conn):
                if rec is not None:
                    self._keep(rec)
        except ProtocolError:
            with self._lock:
                self.bad_frames += 1

    def _keep(self, rec: np.ndarray) -> None:
        raw = rec.view(np.uint8).reshape(len(rec), wf.RECORD_SIZE)
        kinds = raw[:, 0]
        n_ev = int(np.count_nonzero((kinds == wf.Kind.COLL) | (kinds == wf.Kind.P2P)))
        with self._lock:
            self.reads += 1
            self.count += n_ev
            if self.keep or n_ev < len(rec):
                self._raw.append(raw if self.keep else raw[(kinds != wf.Kind.COLL) & (kinds != wf.Kind.P2P)])

    def _all(self) -> np.ndarray:
        with self._lock:
            return np.concatenate(self._raw) if self._raw else np.zeros((0, wf.RECORD_SIZE), np.uint8)

    def events(self) -> np.ndarray:
        """All COLL/P2P records received (``EVENT_DTYPE``), in arrival order."""
        raw = self._all()
        m = (raw[:, 0] == wf.Kind.COLL) | (raw[:, 0] == wf.Kind.P2P)
        return np.ascontiguousarray(raw[m]).view(wf.EVENT_DTYPE).reshape(-1)

    def records(self, kind: int) -> np.ndarray:
        dt = {wf.Kind.COMM: wf.COMM_DTYPE, wf.Kind.PROCESS: wf.PROCESS_DTYPE, wf.Kind.STATS: wf.STATS_DTYPE}.get(
            kind, wf.EVENT_DTYPE)
        raw = self._all()
        return np.ascontiguousarray(raw[raw[:, 0] == kind]).view(dt).reshape(-1)

    def wait_for(self, n_events: int, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.count < n_events:
            time.sleep(0.01)
        return self.count >= n_events

    def close(self) -> None:
        self._closed = True
        try:
            self._srv.close()
        except OSError:
            pass
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        if self.addr.startswith("unix:") and os.path.exists(self.addr[5:]):
            os.unlink(self.addr[5:])

    def __enter__(self) -> "WireSink":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

