"""The kit's in-process collector: the plugins' Unix socket, decoded by the collector's own decoder.

Imports only the standard library, numpy and ``dynamiccl.collector.decode`` (numpy only). Keeps every
COLL/P2P and PEER record, the last STATS record of each plugin process, and counts protocol errors.
"""
from __future__ import annotations

import os
import selectors
import socket
import threading

import numpy as np

from dynamiccl.collector.decode import ProtocolError, StreamDecoder
from dynamiccl.collector.wire_format import EVENT_DTYPE, PEER_DTYPE, STATS_DTYPE

__all__ = ["KitReceiver"]

_READ = 1 << 20


class KitReceiver:
    """``with KitReceiver(path) as rx: ...``; then ``rx.events()`` and ``rx.stats``."""

    def __init__(self, path: str):
        self.path = path
        self._chunks: list[np.ndarray] = []
        self._peers: list[np.void] = []            # PEER records (per-peer network timing, opt-in)
        self.stats: dict[int, np.void] = {}        # pid -> last STATS record
        self.hosts: dict[int, str] = {}            # pid -> host from PROCESS
        self.protocol_errors: list[str] = []
        self.connections = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "KitReceiver":
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(self.path)
        os.chmod(self.path, 0o600)
        self._srv.listen(256)
        self._srv.setblocking(False)
        self._thread = threading.Thread(target=self._loop, name="validate-receiver", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._srv.close()
        if os.path.exists(self.path):
            os.unlink(self.path)

    def events(self) -> np.ndarray:
        with self._lock:
            return np.concatenate(self._chunks) if self._chunks else np.zeros(0, EVENT_DTYPE)

    def peers(self) -> np.ndarray:
        with self._lock:
            return np.array(self._peers, dtype=PEER_DTYPE) if self._peers else np.zeros(0, PEER_DTYPE)

    def stats_table(self) -> dict[int, dict[str, int]]:
        with self._lock:
            return {pid: {k: int(s[k]) for k in STATS_DTYPE.names if k not in ("kind", "pad", "reserved")}
                    for pid, s in self.stats.items()}

    # --- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._srv, selectors.EVENT_READ, None)
        while not self._stop.is_set() or len(sel.get_map()) > 1:
            for key, _ in sel.select(timeout=0.1):
                if key.data is None:
                    self._accept(sel)
                elif not self._read(key.fileobj, key.data):
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
            if self._stop.is_set() and not sel.select(timeout=0.2):
                break
        for key in list(sel.get_map().values()):
            if key.data is not None:
                key.fileobj.close()
        sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            conn, _ = self._srv.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        self.connections += 1
        sel.register(conn, selectors.EVENT_READ, {"dec": StreamDecoder(), "buf": bytearray()})

    def _read(self, conn: socket.socket, state: dict) -> bool:
        try:
            data = conn.recv(_READ)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        buf = state["buf"]
        buf += data
        dec: StreamDecoder = state["dec"]
        try:
            res = dec.feed(bytes(buf))
        except ProtocolError as e:
            self.protocol_errors.append(f"{e.reason}: {e}")
            return False
        del buf[:res.consumed]
        with self._lock:
            if dec.pid is not None and dec.host is not None:
                self.hosts[dec.pid] = dec.host
            if res.events is not None and len(res.events):
                self._chunks.append(np.array(res.events, copy=True))
            self._peers.extend(res.peers)
            for s in res.stats:
                self.stats[int(s["pid"])] = s
        return True
