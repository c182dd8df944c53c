"""Test-bed traffic helpers, each run inside a namespace by :mod:`dynamiccl.harness.testbed.run`.

``python -m dynamiccl.harness.testbed.traffic serve --bind IP:PORT``
    The "storage" the ranks load their batches from: per connection, each 4-byte little-endian
    length read is answered with that many bytes.
``python -m dynamiccl.harness.testbed.traffic sink --bind IP:PORT``
    Accepts connections and discards what they send (the receiving end of bulk traffic).
``python -m dynamiccl.harness.testbed.traffic bulk``
    Competing bulk TCP traffic, driven by lines on stdin: ``on NAME IP:PORT`` starts a flow
    that sends as fast as the network lets it, ``off NAME`` stops it, ``quit`` exits. Every
    command is acknowledged on stdout with ``ok NAME <epoch seconds>`` once the flow is
    connected (on) or closed (off), so the controller can timestamp the ground truth.

:func:`fetch` is the client side of ``serve`` (used by :mod:`dynamiccl.harness.testbed.worker`).
"""
from __future__ import annotations

import argparse
import socket
import struct
import sys
import threading
import time

__all__ = ["serve", "sink", "bulk", "fetch", "main"]

_LEN = struct.Struct("<I")
_CHUNK = bytes(1 << 20)


def _listener(bind: str) -> socket.socket:
    host, port = bind.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(64)
    return s


def _recv_exact(sock: socket.socket, n: int, buf: bytearray | None = None) -> bytes | None:
    view = memoryview(buf if buf is not None and len(buf) >= n else bytearray(n))[:n]
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return view


def _serve_conn(c: socket.socket) -> None:
    with c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            hdr = _recv_exact(c, 4)
            if hdr is None:
                return
            n = _LEN.unpack(hdr)[0]
            while n > 0:
                k = min(n, len(_CHUNK))
                c.sendall(memoryview(_CHUNK)[:k])
                n -= k


def serve(bind: str) -> None:
    srv = _listener(bind)
    print("ready", flush=True)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=_serve_conn, args=(c,), daemon=True).start()


def _discard(c: socket.socket) -> None:
    buf = bytearray(1 << 20)
    with c:
        try:
            while c.recv_into(buf):
                pass
        except OSError:
            return


def sink(bind: str) -> None:
    srv = _listener(bind)
    print("ready", flush=True)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=_discard, args=(c,), daemon=True).start()


class _Flow:
    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.settimeout(0.5)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        view = memoryview(_CHUNK)
        while not self.stop.is_set():
            try:
                self.sock.send(view)
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


def bulk(stdin=sys.stdin, stdout=sys.stdout) -> None:
    flows: dict[str, _Flow] = {}
    print("ready", file=stdout, flush=True)
    for line in stdin:
        parts = line.split()
        if not parts:
            continue
        cmd = parts[0]
        try:
            if cmd == "on" and len(parts) == 3:
                if parts[1] in flows:
                    flows.pop(parts[1]).close()
                flows[parts[1]] = _Flow(parts[2])
                print(f"ok {parts[1]} {time.time():.6f}", file=stdout, flush=True)
            elif cmd == "off" and len(parts) == 2:
                f = flows.pop(parts[1], None)
                if f is not None:
                    f.close()
                print(f"ok {parts[1]} {time.time():.6f}", file=stdout, flush=True)
            elif cmd == "quit":
                break
            else:
                print(f"error unknown command {line.strip()!r}", file=stdout, flush=True)
        except OSError as exc:
            print(f"error {cmd} {exc}", file=stdout, flush=True)
    for f in flows.values():
        f.close()


def fetch(sock: socket.socket, nbytes: int, buf: bytearray) -> None:
    """Ask the ``serve`` peer on ``sock`` for ``nbytes`` and read them into ``buf``."""
    sock.sendall(_LEN.pack(nbytes))
    if _recv_exact(sock, nbytes, buf) is None:
        raise ConnectionError("the data server closed the connection")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=("serve", "sink", "bulk"))
    ap.add_argument("--bind", default="0.0.0.0:5100")
    args = ap.parse_args(argv)
    try:
        if args.role == "serve":
            serve(args.bind)
        elif args.role == "sink":
            sink(args.bind)
        else:
            bulk()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
