"""The regime-change stream: NDJSON over TCP or a Unix socket, one `RegimeChange` per line, and a
`dynamiccl.detector.where_refresh.WhereUpdate` line when a reported change's ``where`` is judged anew.

Each client gets a bounded queue (``max_queue`` lines); when it is full the *oldest* line is
dropped and counted (``dynamiccl_detector_changes_dropped_total{reason="queue_full"}``), so a
slow or stuck client never blocks the detector (the shared broadcast server of the contracts). On connect, a client first receives the changes
that are still active (not yet recovered), so a retuner that (re)connects late knows the current
regime; ids are unique, so a client can ignore ones it has seen.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable

from dynamiccl.collector.net import close_listener, listen
from dynamiccl.contracts.broadcast import LineBroadcaster

from .events import RegimeChange
from .where_refresh import WhereUpdate, is_where_update

__all__ = ["ChangeServer", "subscribe_changes"]

log = logging.getLogger("dynamiccl.detector.server")


class ChangeServer:
    """Serves regime changes to any number (≤ ``max_clients``) of NDJSON clients, through the shared
    :class:`dynamiccl.contracts.broadcast.LineBroadcaster`.

    ``active`` is a callable returning the changes to replay to a new client. A client that has left
    changes unread for ``send_timeout_s`` gives up its slot when a new client needs one.
    """

    def __init__(self, address: str, *, max_queue: int = 1024, max_clients: int = 64,
                 send_timeout_s: float = 10.0, active: Callable[[], Iterable[RegimeChange]] | None = None,
                 on_drop: Callable[[], None] | None = None, on_clients: Callable[[int], None] | None = None):
        self.address_spec = address
        self.max_queue = max_queue
        self.max_clients = max_clients
        self.send_timeout_s = send_timeout_s
        self._active = active or (lambda: ())
        self._on_drop = on_drop or (lambda: None)
        self._on_clients = on_clients or (lambda n: None)
        self._server: LineBroadcaster | None = None
        self._listener = None
        self._kind = None
        self.address: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "ChangeServer":
        self._listener, self._kind, self.address = listen(self.address_spec, key="serve")
        self._server = LineBroadcaster(
            self._listener, max_queue=self.max_queue, max_clients=self.max_clients,
            stall_timeout_s=self.send_timeout_s, greeting=self._greeting, on_drop=self._on_drop,
            on_refuse=self._refused, on_clients=self._on_clients, name="detector-change-server").start()
        log.info("regime-change stream on %s", self.address)
        return self

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown(timeout=5)
            self._server = None
        close_listener(self._listener, self._kind, self.address)
        self._listener = None

    @property
    def n_clients(self) -> int:
        return self._server.n_clients if self._server is not None else 0

    @property
    def dropped(self) -> int:
        return self._server.dropped if self._server is not None else 0

    # -- publishing -------------------------------------------------------------------------------
    def publish(self, change: RegimeChange) -> None:
        if self._server is not None:
            self._server.publish((change.to_json() + "\n").encode())

    def publish_update(self, update: WhereUpdate) -> None:
        if self._server is not None:
            self._server.publish((update.to_json() + "\n").encode())

    def _greeting(self) -> list[bytes]:
        return [(ch.to_json() + "\n").encode() for ch in list(self._active())]

    def _refused(self, reason: str, peer: str) -> None:
        log.warning("change stream: %s %s (%d clients at most)", "refusing" if reason == "subscriber_limit"
                    else "dropped stalled client", peer, self.max_clients)


def subscribe_changes(address: str, *, timeout: float | None = None, connect_timeout: float = 10.0,
                      where_updates: bool = False):
    """Iterate over the `RegimeChange` objects a detector serves (``unix:PATH`` or ``tcp:HOST:PORT``);
    with ``where_updates`` also the `WhereUpdate` lines (newer ``where`` verdicts on served changes), else
    those lines are skipped.

    Malformed lines raise ``ValueError`` (with the reason); the iterator ends when the server closes.
    """
    from dynamiccl.collector.features import connect
    sock = connect(address, timeout=connect_timeout)
    sock.settimeout(timeout)

    from dynamiccl.contracts.lines import client_lines
    return _items(client_lines(sock), where_updates)   # connected now, before the first item is asked for


def _items(lines, where_updates: bool):
    for line in lines:
        if is_where_update(line):
            if where_updates:
                yield WhereUpdate.from_json(line)
            continue
        yield RegimeChange.from_json(line)
