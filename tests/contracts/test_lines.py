"""The one NDJSON line reader: same lines as splitting the whole stream, bounded, linear in a line's length."""
from __future__ import annotations

import random
import socket
import threading
import time

import pytest

from dynamiccl.contracts.lines import LineSplitter, follow, socket_lines


def split_all(stream: bytes) -> list[bytes]:
    return [x for x in stream.split(b"\n")[:-1] if x.strip()]


@pytest.mark.parametrize("seed", range(20))
def test_any_chunking_gives_the_lines_of_the_whole_stream(seed):
    rng = random.Random(seed)
    lines = [bytes(rng.choice(b'ab {}":,\n ') for _ in range(rng.randrange(0, 40))) for _ in range(50)]
    stream = b"\n".join(lines) + b"\n" + b"tail-without-newline"
    s, got, pos = LineSplitter(max_line_bytes=1 << 20), [], 0
    while pos < len(stream):
        n = rng.randrange(1, 30)
        got += s.feed(stream[pos:pos + n])
        pos += n
    assert got == split_all(stream)
    assert s.pending == len(b"tail-without-newline") and s.oversized == 0


def test_an_oversized_line_is_skipped_counted_and_never_buffered_past_the_limit():
    s = LineSplitter(max_line_bytes=100)
    out = s.feed(b"ok1\n" + b"x" * 60)
    for _ in range(10):                       # 60 + 10 x 50 bytes of one line, no newline yet
        out += s.feed(b"y" * 50)
        assert s.pending <= 100
    out += s.feed(b"zz\nok2\n" + b"w" * 101 + b"\nok3\n")
    assert out == [b"ok1", b"ok2", b"ok3"] and s.oversized == 2


def test_the_limit_is_inclusive():
    s = LineSplitter(max_line_bytes=5)
    assert s.feed(b"12") + s.feed(b"345\n123456\n") == [b"12345"] and s.oversized == 1


class FakeSock:
    def __init__(self, chunks):
        self.chunks = list(chunks)
        self.closed = False

    def recv(self, n):
        if not self.chunks:
            return b""
        c = self.chunks.pop(0)
        if isinstance(c, Exception):
            raise c
        return c

    def settimeout(self, t):
        pass

    def close(self):
        self.closed = True


def test_socket_lines_waits_through_timeouts_and_reports_the_peer_closing():
    sock = FakeSock([b'{"a"', socket.timeout(), b":1}\n", b'{"b":2}\n'])
    got = []
    with pytest.raises(ConnectionError):
        for line in socket_lines(sock, threading.Event()):
            got.append(line)
    assert got == [b'{"a":1}', b'{"b":2}']


def test_follow_reconnects_after_the_peer_goes_away_and_stops_when_asked():
    stop = threading.Event()
    socks = iter([FakeSock([b"one\n"]), ConnectionRefusedError("down"), FakeSock([b"two\n"])])

    def connect():
        s = next(socks)
        if isinstance(s, Exception):
            raise s
        return s

    got = []
    for line in follow(connect, stop, backoff=(0.0, 0.0)):
        got.append(line)
        if len(got) == 2:
            stop.set()
    assert got == [b"one", b"two"]


def test_the_retuner_service_reads_a_28_mb_line_in_linear_time(monkeypatch):
    """A 512-node window is one ~28 MB line. Appending each chunk to one bytes object and re-splitting it
    copies O(n^2 / chunk) bytes: seconds of CPU for 28 MB arriving in 16 KiB pieces. The linear reader needs a
    few hundredths of a second; the bound is CPU time (process_time), which other processes on the machine do
    not inflate, far from both."""
    import dynamiccl.collector.features
    from dynamiccl.retuner.config import RetunerConfig
    from dynamiccl.retuner.service import RetunerService

    line = b'{"v":1,"pad":"' + b"x" * (28 << 20) + b'"}'
    chunks = [line[i:i + (1 << 14)] for i in range(0, len(line), 1 << 14)] + [b"\n"]
    monkeypatch.setattr(dynamiccl.collector.features, "connect", lambda addr, timeout=None: FakeSock(chunks))
    svc = RetunerService(RetunerConfig(dry_run=True, changes=None, features=None, metrics=None))
    t0 = time.process_time()
    got = []
    with pytest.raises(ConnectionError):
        for x in svc._lines("tcp:127.0.0.1:1"):
            got.append(len(x))
    cpu = time.process_time() - t0
    assert got == [len(line)]
    print(f"cpu_s={cpu:.3f}")
    assert cpu < 1.0, f"{cpu:.2f} s of CPU for one 28 MB line"
