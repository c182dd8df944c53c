"""A unix-socket sink for the torch.distributed source's tests: each connection's bytes, decoded with the
collector's decoder."""
from __future__ import annotations

import socket
import threading
import time

from dynamiccl.collector.decode import StreamDecoder


class Sink:
    """Unix-socket server keeping each connection's bytes."""

    def __init__(self, path: str):
        self.path = path
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(16)
        self.conns: list[bytearray] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            buf = bytearray()
            with self._lock:
                self.conns.append(buf)
            threading.Thread(target=self._read, args=(c, buf), daemon=True).start()

    @staticmethod
    def _read(c, buf):
        with c:
            while True:
                try:
                    b = c.recv(1 << 16)
                except OSError:
                    return
                if not b:
                    return
                buf.extend(b)

    def decoded(self):
        out = []
        with self._lock:
            conns = [bytes(b) for b in self.conns]
        for raw in conns:
            dec = StreamDecoder()
            res = dec.feed(raw)
            assert res.consumed == len(raw), "a partial frame was left on a finished connection"
            out.append((dec, res))
        return out

    def close(self):
        self.srv.close()


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()
