"""One NDJSON line reader for the services' streams: linear time, bounded, reconnecting.

:class:`LineSplitter` cuts a byte stream into lines. Each received chunk is scanned once for newlines and a
partial line is kept as a list of pieces joined once when its newline arrives, so a line of n bytes costs O(n)
however many chunks it came in (appending to one ``bytes`` and re-splitting it costs O(n^2 / chunk)). A line
longer than ``max_line_bytes`` is discarded up to its newline and counted in ``oversized``; the buffer never
holds more than ``max_line_bytes`` plus one chunk.

:func:`socket_lines` reads one connection for a service; :func:`client_lines` for a client (its timeout
raises); :func:`follow` reconnects with exponential backoff.

>>> s = LineSplitter(max_line_bytes=8)
>>> s.feed(b'{"a":1}\\n{"b"'), s.feed(b':2}\\n\\n'), s.feed(b"0123456789\\nok\\n"), s.oversized
([b'{"a":1}'], [b'{"b":2}'], [b'ok'], 1)
"""
from __future__ import annotations

import logging
import socket
import threading
from typing import Callable, Iterator

__all__ = ["LineSplitter", "socket_lines", "client_lines", "follow"]

log = logging.getLogger("dynamiccl.lines")


class LineSplitter:
    def __init__(self, max_line_bytes: int = 64 << 20) -> None:
        if max_line_bytes <= 0:
            raise ValueError(f"max_line_bytes must be positive, got {max_line_bytes}")
        self.max_line_bytes = max_line_bytes
        self.oversized = 0            # lines discarded for exceeding max_line_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._discarding = False      # inside an oversized line: drop bytes until its newline

    @property
    def pending(self) -> int:
        """Bytes of the unfinished line held now."""
        return self._size

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete, non-blank lines that ``chunk`` finishes (without their newline), in order."""
        out: list[bytes] = []
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            self._take(chunk, start, nl, out)
            start = nl + 1
        if start < len(chunk):
            self._hold(chunk[start:] if start else chunk)
        return out

    def _take(self, chunk: bytes, start: int, end: int, out: list[bytes]) -> None:
        if self._discarding:
            self._discarding = False
            return
        if self._size + (end - start) > self.max_line_bytes:
            self._drop()
            return
        if self._parts:
            self._parts.append(chunk[start:end])
            line = b"".join(self._parts)
            self._parts, self._size = [], 0
        else:
            line = chunk[start:end]
        if line.strip():
            out.append(line)

    def _hold(self, piece: bytes) -> None:
        if self._discarding:
            return
        if self._size + len(piece) > self.max_line_bytes:
            self._drop()
            self._discarding = True
            return
        self._parts.append(piece)
        self._size += len(piece)

    def _drop(self) -> None:
        self.oversized += 1
        log.warning("stream: a line longer than %d bytes discarded", self.max_line_bytes)
        self._parts, self._size = [], 0


def socket_lines(sock: socket.socket, stop: threading.Event, *, max_line_bytes: int = 64 << 20,
                 chunk_bytes: int = 1 << 20, on_oversized: Callable[[], None] | None = None) -> Iterator[bytes]:
    """Lines from one connection until the peer closes it (``ConnectionError``) or ``stop`` is set.

    Set a socket timeout first so ``stop`` is checked while the peer is silent. ``on_oversized`` is called once
    per discarded line (count it as a refusal).
    """
    splitter = LineSplitter(max_line_bytes)
    seen = 0
    while not stop.is_set():
        try:
            chunk = sock.recv(chunk_bytes)
        except (TimeoutError, socket.timeout):
            continue
        if not chunk:
            raise ConnectionError("peer closed the stream")
        lines = splitter.feed(chunk)
        while on_oversized is not None and seen < splitter.oversized:
            seen += 1
            on_oversized()
        yield from lines


def client_lines(sock: socket.socket, *, max_line_bytes: int = 64 << 20,
                 chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """A client's lines from one connection until the server closes it; the socket's timeout (if
    any) raises ``TimeoutError`` while waiting for data. The socket is closed when the iterator ends."""
    splitter = LineSplitter(max_line_bytes)
    try:
        while chunk := sock.recv(chunk_bytes):
            yield from splitter.feed(chunk)
    finally:
        sock.close()


def follow(connect: Callable[[], socket.socket], stop: threading.Event, *, name: str = "stream",
           backoff: tuple[float, float] = (0.5, 30.0), **kw) -> Iterator[bytes]:
    """Lines from ``connect()``'s socket, reconnecting after ``OSError`` with exponential backoff
    (``backoff[0]`` doubling up to ``backoff[1]``, reset after a connection delivered a line)."""
    delay = backoff[0]
    while not stop.is_set():
        try:
            sock = connect()
            try:
                for line in socket_lines(sock, stop, **kw):
                    delay = backoff[0]
                    yield line
            finally:
                sock.close()
        except OSError as e:       # ConnectionError, refused, reset, timeout while connecting
            if stop.is_set():
                return
            log.warning("%s: %s; reconnecting in %.1f s", name, e, delay)
        if stop.wait(delay):
            return
        delay = min(backoff[1], delay * 2)
