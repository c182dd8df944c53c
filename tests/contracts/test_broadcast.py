"""The shared NDJSON broadcast server: bounded per-client queues, refusals counted, a stuck client
never blocks the publisher or the other clients."""
from __future__ import annotations

import socket
import time

from dynamiccl.contracts.broadcast import LineBroadcaster


def _until(cond, timeout=20.0):
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < timeout:
        time.sleep(0.01)
    return cond()


def _server(**kw):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    return srv, LineBroadcaster(srv, **kw).start()


def test_a_client_that_never_reads_loses_its_oldest_lines_and_blocks_nobody():
    drops, refused = [], []
    srv, b = _server(max_queue=8, max_clients=2, on_drop=lambda: drops.append(1),
                     on_refuse=lambda reason, peer: refused.append(reason))
    stuck = socket.create_connection(srv.getsockname())
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader = socket.create_connection(srv.getsockname())
    f = reader.makefile("rb")
    assert _until(lambda: b.n_clients == 2)
    line = b"x" * 1000 + b"\n"
    t0 = time.monotonic()
    for _ in range(5000):                       # ~5 MB: far beyond the stuck client's socket buffers
        b.publish(line)
    assert time.monotonic() - t0 < 20.0         # publishing never waited for the stuck client (it never reads)
    assert _until(lambda: len(drops) > 4000)    # its queue stayed at 8 lines: the rest dropped, counted
    assert f.readline() == line                 # the other client is served
    third = socket.create_connection(srv.getsockname())
    assert _until(lambda: refused == ["subscriber_limit"])
    for s in (stuck, reader, third):
        s.close()
    b.shutdown()
    srv.close()


def test_a_new_client_gets_the_greeting_first_and_a_stalled_one_gives_up_its_slot():
    refused = []
    srv, b = _server(max_clients=1, stall_timeout_s=0.05, greeting=lambda: [b"active\n"],
                     on_refuse=lambda reason, peer: refused.append(reason))
    first = socket.create_connection(srv.getsockname())
    first.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    assert _until(lambda: b.n_clients == 1)
    for _ in range(20000):                      # 20 MB, beyond the kernel's socket buffers: a backlog stays
        b.publish(b"y" * 1000 + b"\n")          # the first client reads nothing: its backlog ages
    time.sleep(0.1)
    second = socket.create_connection(srv.getsockname())
    assert second.makefile("rb").readline() == b"active\n"
    assert refused == ["subscriber_stalled"] and b.n_clients == 1
    first.close()
    second.close()
    b.shutdown()
    srv.close()
