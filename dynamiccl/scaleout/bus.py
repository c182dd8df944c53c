"""The bus between node collectors and the central tier, and the node's bounded outbox.

Subjects: ``dynamiccl.partials.<job>.<node>``, or ``dynamiccl.partials.<job>.<node>.<p>`` for communicator
partition ``p`` of a job split into several (:func:`unit`: the central tier's unit of ownership, merging and
detection is ``<job>`` or ``<job>.<p>``); a message's id is ``<unit>/<node>/<window>`` (JetStream
drops a republished id inside its duplicate window; the central merger drops it too, so duplicate
delivery after a failover changes nothing). :class:`InProcessBus` is the single-machine path: the same
publish/drain interface, bounded, no network. :class:`Outbox` never blocks the node's ingest: a full
outbox drops its oldest message and counts it; a failed send keeps the message for the next flush.
"""
from __future__ import annotations

import re
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol

__all__ = ["token", "subject", "unit", "job_of", "partition_of", "msg_id", "window_of", "Bus", "InProcessBus", "Outbox", "Message"]

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SUBJECT_PREFIX = "dynamiccl.partials"


def token(kind: str, value: str) -> str:
    """``value`` when it is one subject token (ValueError naming ``kind`` otherwise)."""
    if not _TOKEN.match(value):
        raise ValueError(f"{kind} {value!r}: a subject token is 1-64 of [A-Za-z0-9_-]")
    return value


def subject(job: str, node: str, partition: int | None = None) -> str:
    """
    >>> subject("j1", "node-7"), subject("j1", "node-7", 3)
    ('dynamiccl.partials.j1.node-7', 'dynamiccl.partials.j1.node-7.3')
    """
    base = f"{SUBJECT_PREFIX}.{token('job', job)}.{token('node', node)}"
    return base if partition is None else f"{base}.{int(partition)}"


def unit(job: str, partition: int | None = None) -> str:
    """What a central shard owns, merges and runs a detector on: a whole job, or one communicator
    partition of it (job tokens hold no ``.``, so the two never collide).

    >>> unit("j"), unit("j", 2), job_of("j.2"), partition_of("j.2"), partition_of("j")
    ('j', 'j.2', 'j', 2, None)
    """
    return token("job", job) if partition is None else f"{token('job', job)}.{int(partition)}"


def job_of(u: str) -> str:
    return u.partition(".")[0]


def partition_of(u: str) -> int | None:
    _, dot, p = u.partition(".")
    return int(p) if dot else None


def msg_id(job: str, node: str, window: int, part: int = 0, parts: int = 1) -> str:
    """The stream's duplicate key: one per node-window, or per part of a partial sent in ``parts``."""
    return f"{job}/{node}/{window}" if parts == 1 else f"{job}/{node}/{window}/{part}of{parts}"


def window_of(mid: str) -> int:
    """The window a message id names (whole or one part); -1 when it names none.

    >>> window_of("j/n0/17"), window_of("j/n0/17/2of3"), window_of("junk")
    (17, 17, -1)
    """
    f = mid.split("/")
    try:
        return int(f[2]) if len(f) in (3, 4) else -1
    except ValueError:
        return -1


@dataclass(frozen=True)
class Message:
    subject: str
    data: bytes
    msg_id: str


class Bus(Protocol):
    def publish(self, msg: Message) -> None: ...


class InProcessBus:
    """Bounded in-process bus: ``publish`` raises ``BufferError`` when full (the outbox keeps the
    message), ``drain`` hands the oldest messages to the central tier."""

    def __init__(self, max_messages: int = 100_000):
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        self.max_messages = max_messages
        self._q: deque[Message] = deque()
        self.published = 0

    def publish(self, msg: Message) -> None:
        if len(self._q) >= self.max_messages:
            raise BufferError(f"in-process bus full ({self.max_messages} messages)")
        self._q.append(msg)
        self.published += 1

    def drain(self, limit: int = 1 << 30) -> list[Message]:
        out = []
        while self._q and len(out) < limit:
            out.append(self._q.popleft())
        return out


@dataclass
class Outbox:
    """The node's bounded buffer in front of the bus (counters: emitted, dropped, send_errors)."""
    bus: Bus
    max_messages: int = 64
    max_bytes: int = 16 << 20
    on_error: Callable[[Exception], None] = lambda e: None
    _q: deque = field(default_factory=deque)
    _bytes: int = 0
    counters: dict = field(default_factory=lambda: {"offered": 0, "emitted": 0, "dropped": 0,
                                                     "send_errors": 0, "bytes_emitted": 0})

    _lock: threading.Lock = field(default_factory=threading.Lock)   # offer (ingest thread) vs flush

    def offer(self, msg: Message) -> None:
        """Queue without blocking; the oldest message goes (counted) when a bound is hit."""
        with self._lock:
            self.counters["offered"] += 1
            self._q.append(msg)
            self._bytes += len(msg.data)
            while len(self._q) > self.max_messages or self._bytes > self.max_bytes:
                self._bytes -= len(self._q.popleft().data)
                self.counters["dropped"] += 1

    def _head(self) -> Message | None:
        with self._lock:
            return self._q[0] if self._q else None

    def _sent(self, msg: Message) -> None:
        with self._lock:
            if self._q and self._q[0] is msg:     # else a bound dropped it meanwhile (counted there)
                self._q.popleft()
                self._bytes -= len(msg.data)
            self.counters["emitted"] += 1
            self.counters["bytes_emitted"] += len(msg.data)

    def _failed(self, e: Exception) -> None:
        with self._lock:
            self.counters["send_errors"] += 1
        self.on_error(e)

    def flush(self) -> int:
        """Send what is queued, oldest first; stop at the first failure (kept for the next flush)."""
        sent = 0
        while (msg := self._head()) is not None:
            try:
                self.bus.publish(msg)
            except Exception as e:  # any transport failure: keep the message, count, retry later
                self._failed(e)
                break
            self._sent(msg)
            sent += 1
        return sent

    async def aflush(self, send: Callable[[Message], Awaitable[object]]) -> int:
        """``flush`` through an async transport (NATS); the lock is never held across a send."""
        sent = 0
        while (msg := self._head()) is not None:
            try:
                await send(msg)
            except Exception as e:  # noqa: BLE001 - any transport failure: keep the message, count, retry later
                self._failed(e)
                break
            self._sent(msg)
            sent += 1
        return sent

    def __len__(self) -> int:
        return len(self._q)
