"""Vectorised decoding of the plugin byte stream (dynamiccl/collector/wire_format.py).

:class:`StreamDecoder` holds one connection's state (host/job id from PROCESS, comm names from
COMM). ``feed(buffer)`` parses every complete frame in the buffer, validates the headers, and
decodes all records of all frames with one ``np.frombuffer``/concatenate; COLL/P2P records are
never touched one by one. PROCESS/COMM/STATS records (rare) are handled individually.
"""
from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from dynamiccl.collector.wire_format import (
    COMM_DTYPE, EVENT_DTYPE, HEADER_DTYPE, MAGIC, MAX_RECORDS_PER_FRAME, PEER_DTYPE, PROCESS_DTYPE,
    RECORD_SIZE, STATS_DTYPE, VERSION, Kind,
)

__all__ = ["StreamDecoder", "split_frames", "read_frames", "ProtocolError", "DecodeResult", "GapTracker", "decode_str"]

_HEADER = struct.Struct("<IHHII")
HEADER_SIZE = HEADER_DTYPE.itemsize
_SEQ_OFFSET = {Kind.COLL: EVENT_DTYPE.fields["record_seq"][1],
               Kind.P2P: EVENT_DTYPE.fields["record_seq"][1],
               Kind.COMM: COMM_DTYPE.fields["record_seq"][1],
               Kind.PROCESS: PROCESS_DTYPE.fields["record_seq"][1],
               Kind.STATS: STATS_DTYPE.fields["record_seq"][1],
               Kind.PEER: PEER_DTYPE.fields["record_seq"][1]}


class ProtocolError(Exception):
    """Bad input on a connection; ``reason`` is a MALFORMED_REASONS label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def decode_str(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass
class DecodeResult:
    events: np.ndarray | None  # COLL/P2P records (EVENT_DTYPE), None when there were none
    consumed: int              # bytes of the buffer used (complete frames)
    n_records: int             # all records in the complete frames
    n_invalid_kind: int = 0
    stats: list = field(default_factory=list)  # STATS records (np.void of STATS_DTYPE)
    peers: list = field(default_factory=list)  # PEER records (np.void of PEER_DTYPE): per-peer network timing
    seqs: np.ndarray | None = None  # record_seq of every record, stream order


class GapTracker:
    """record_seq continuity per plugin process (host, pid, start_ns), across reconnects.

    Records with record_seq 0 are ignored; a value ≤ the highest seen (a re-sent COMM record, a
    duplicate) neither counts nor resets. Bounded LRU over processes.
    """

    def __init__(self, max_processes: int = 65536):
        self._last: OrderedDict[tuple, int] = OrderedDict()
        self.max_processes = max_processes

    def observe(self, process: tuple, seqs: np.ndarray) -> tuple[int, int]:
        """Returns (records lost, number of jumps) for this batch of sequence numbers."""
        seqs = seqs[seqs > 0]
        if len(seqs) == 0:
            return 0, 0
        last = self._last.get(process)
        if last is None:
            last = int(seqs[0]) - 1
        prev = np.maximum.accumulate(np.r_[np.uint64(last), seqs[:-1]].astype(np.uint64))
        jump = seqs.astype(np.int64) - prev.astype(np.int64) - 1
        pos = jump > 0
        lost = int(jump[pos].sum())
        newlast = max(last, int(seqs.max()))
        self._last[process] = newlast
        self._last.move_to_end(process)
        while len(self._last) > self.max_processes:
            self._last.popitem(last=False)
        return lost, int(pos.sum())


def split_frames(buf: memoryview | bytes, max_records: int = MAX_RECORDS_PER_FRAME) -> tuple[np.ndarray | None, int]:
    """The records of every complete frame at the start of ``buf`` (one array, EVENT_DTYPE-shaped
    128-byte records of any kind, a copy) and the bytes those frames use; (None, used) when they hold no
    record. A partial frame stays unconsumed. The one frame parser: the collector's decoder and the
    simulator's sink both call it.

    Raises ProtocolError for a bad header (magic, version, record size, count)."""
    pos, end = 0, len(buf)
    spans: list[tuple[int, int]] = []
    while end - pos >= HEADER_SIZE:
        magic, version, rsize, count, _flags = _HEADER.unpack_from(buf, pos)
        if magic != MAGIC:
            raise ProtocolError("bad_magic", f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})")
        if version != VERSION:
            raise ProtocolError("bad_version", f"unsupported wire version {version} (expected {VERSION})")
        if rsize != RECORD_SIZE:
            raise ProtocolError("bad_record_size", f"record size {rsize} (expected {RECORD_SIZE})")
        if count > max_records:
            raise ProtocolError("too_many_records", f"frame of {count} records (max {max_records})")
        size = HEADER_SIZE + count * RECORD_SIZE
        if end - pos < size:
            break
        if count:
            spans.append((pos + HEADER_SIZE, count))
        pos += size
    if not spans:
        return None, pos
    if len(spans) == 1:
        off, cnt = spans[0]
        return np.frombuffer(buf, EVENT_DTYPE, cnt, off).copy(), pos
    # joined as raw bytes: concatenating structured arrays promotes their dtype field by field (slow)
    return np.concatenate([np.frombuffer(buf, np.uint8, cnt * RECORD_SIZE, off) for off, cnt in spans]
                          ).view(EVENT_DTYPE), pos


def read_frames(conn, chunk_bytes: int = 1 << 20):
    """``(records, used)`` per received chunk of a blocking socket, as :func:`split_frames` gives them
    (None when the chunk finished no record), until the peer closes or the socket fails. A bad header
    raises ProtocolError. For test and harness sinks; the collector's receivers bound their buffers."""
    buf = bytearray()
    while True:
        try:
            chunk = conn.recv(chunk_bytes)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        rec, used = split_frames(buf)
        del buf[:used]
        yield rec, used


class StreamDecoder:
    """Per-connection decoder. Raises :class:`ProtocolError` on bad input."""

    def __init__(self, max_records_per_frame: int = MAX_RECORDS_PER_FRAME):
        self.max_records = max_records_per_frame
        self.host: str | None = None
        self.job_id: str | None = None
        self.pid: int | None = None
        self.start_ns: int = 0
        self.comm_names: dict[int, str] = {}  # snapshot replaced (never mutated) on change

    @property
    def process_key(self) -> tuple:
        return (self.host, self.pid, self.start_ns)

    def feed(self, buf: memoryview | bytes) -> DecodeResult:
        """Decode every complete frame at the start of ``buf``; a partial frame stays unconsumed.

        Raises ProtocolError for a bad header (magic, version, record size, count)."""
        rec, pos = split_frames(buf, self.max_records)
        if rec is None:
            return DecodeResult(None, pos, 0)
        return self._records(rec, pos)

    def _records(self, rec: np.ndarray, consumed: int) -> DecodeResult:
        kind = rec["kind"]
        is_event = (kind == Kind.COLL) | (kind == Kind.P2P)
        all_events = bool(is_event.all())
        result = DecodeResult(None, consumed, len(rec),
                              seqs=rec["record_seq"] if all_events else self.record_seqs(rec))
        if all_events:
            if self.host is None:
                raise ProtocolError("no_process", "COLL/P2P records before the PROCESS record")
            result.events = rec
            return result
        rare = np.flatnonzero(~is_event)
        for i in rare.tolist():
            k = int(kind[i])
            one = rec[i:i + 1]
            if k == Kind.PROCESS:
                self._process(one.view(PROCESS_DTYPE)[0])
            elif k == Kind.COMM:
                c = one.view(COMM_DTYPE)[0]
                names = dict(self.comm_names)
                names[int(c["comm_hash"])] = decode_str(bytes(c["comm_name"]))
                self.comm_names = names
            elif k == Kind.STATS:
                result.stats.append(one.view(STATS_DTYPE)[0].copy())
            elif k == Kind.PEER:
                result.peers.append(one.view(PEER_DTYPE)[0].copy())
            else:
                result.n_invalid_kind += 1
        if self.host is None:
            raise ProtocolError("no_process", "records before the PROCESS record")
        if len(rare) < len(rec):
            result.events = rec[is_event]
        return result

    def _process(self, p) -> None:
        """A connection speaks for one process: a repeated PROCESS record must not change it
        (else a peer could re-attribute what it already sent, or a whole read, to another host)."""
        ident = (decode_str(bytes(p["host"])) or "unknown", decode_str(bytes(p["job_id"])) or "unknown",
                 int(p["pid"]), int(p["start_ns"]))
        if self.host is not None and ident != (self.host, self.job_id, self.pid, self.start_ns):
            raise ProtocolError("process_changed", f"PROCESS record for {ident[0]}/{ident[1]} pid {ident[2]} "
                                f"on a connection of {self.host}/{self.job_id} pid {self.pid}")
        self.host, self.job_id, self.pid, self.start_ns = ident

    @staticmethod
    def record_seqs(rec: np.ndarray) -> np.ndarray:
        """record_seq of every record in stream order (offset depends on the kind)."""
        kind = rec["kind"]
        if ((kind == Kind.COLL) | (kind == Kind.P2P)).all():
            return rec["record_seq"]
        raw = rec.view(np.uint8).reshape(len(rec), RECORD_SIZE)
        out = np.zeros(len(rec), np.uint64)
        for k, off in _SEQ_OFFSET.items():
            m = kind == k
            if m.any():
                out[m] = np.ascontiguousarray(raw[m, off:off + 8]).view("<u8").ravel()
        return out
