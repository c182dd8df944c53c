"""A partial on the wire: ``[u32 header length][header JSON][zlib of the column buffers]``.

A partial larger than the bus's message limit travels as ``parts`` messages (``part`` 0..parts-1 in
the header): each frame's rows are cut into ``parts`` contiguous slices, so every row is in exactly one
part, and merging the parts (the merger waits for all of a node's parts) gives the partial back exactly.

The header names the node, job, window, window length and each frame's row count; the body holds every
column of every frame, in the fixed order of ``FRAMES``, as little-endian arrays of the wire dtype
(narrow where the values are small: a node has few ranks). Job and host are not repeated per row:
they are the header's job and node. Decoding checks the sizes against the header, the values against
the wire dtypes, and caps the inflated size (a clear ``ValueError`` naming what is wrong).
"""
from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import polars as pl

from dynamiccl.collector.processors.wait import MAX_LOSSY_COMMS
from dynamiccl.contracts.partition import MAX_PARTITIONS
from dynamiccl.scaleout.partials import NodePartial
from dynamiccl.scaleout.waits import check_waitq

__all__ = ["encode_partial", "encode_messages", "raw_size", "decode_partial", "read_partial", "peek_header", "frames_of", "RawPartial", "FRAMES", "MAX_MESSAGE_BYTES", "MAX_INFLATED_BYTES"]

# frame -> (column, wire dtype, canonical polars dtype); job_id (and ranks.host) come from the header
FRAMES: dict[str, list[tuple[str, str, pl.DataType]]] = {
    "keys": [("comm_hash", "<u8", pl.UInt64), ("func", "u1", pl.Int32), ("algo", "u1", pl.Int32),
             ("proto", "u1", pl.Int32), ("size_bucket", "i1", pl.Int32), ("records", "<i8", pl.UInt32),
             ("bytes_sum", "<i8", pl.Int64), ("timed", "<i8", pl.Int64), ("dur_sum_ns", "<i8", pl.Int64),
             ("dur_max_ns", "<i8", pl.Int64), ("tcv", "<i8", pl.Int64), ("nranks", "<i4", pl.Int32),
             ("nnodes", "<i4", pl.Int32)],
    "hist": [("comm_hash", "<u8", pl.UInt64), ("func", "u1", pl.Int32), ("algo", "u1", pl.Int32),
             ("proto", "u1", pl.Int32), ("size_bucket", "i1", pl.Int32), ("bucket", "u1", pl.Int32),
             ("count", "<u4", pl.UInt32)],
    "inst": [("comm_hash", "<u8", pl.UInt64), ("func", "u1", pl.Int32), ("seq", "<i8", pl.Int64),
             ("algo", "u1", pl.Int32), ("proto", "u1", pl.Int32), ("size_bucket", "i1", pl.Int32),
             ("nranks", "<i4", pl.Int32), ("n", "<u4", pl.UInt32), ("n_t", "<i4", pl.Int64),
             ("dmin_ns", "<i8", pl.Int64), ("dmax_ns", "<i8", pl.Int64), ("n_at_min", "<i4", pl.Int64),
             ("min_rank", "<i4", pl.Int32)],
    "ranks": [("comm_hash", "<u8", pl.UInt64), ("rank", "<i4", pl.Int32), ("records", "<u4", pl.UInt32),
              ("timed", "<i4", pl.Int64), ("dur_sum_ns", "<i8", pl.Int64)],
    # version 2 only (a node with waits on): its untimed collective records (scaleout/waits.py), last in the body
    "waitq": [("comm_hash", "<u8", pl.UInt64), ("func", "u1", pl.Int64), ("seq_number", "<i8", pl.Int64),
              ("rank", "<i4", pl.Int64), ("nranks", "<i4", pl.Int64), ("algo", "u1", pl.Int64),
              ("proto", "u1", pl.Int64), ("bytes", "<i8", pl.Int64), ("nnodes", "<i4", pl.Int64),
              ("tuner_config_version", "<i8", pl.Int64), ("t", "<i8", pl.Int64)],
}
#: the frames of a version-1 partial (and of every partial); version 2 adds WAIT_FRAME
BASE_FRAMES = ("keys", "hist", "inst", "ranks")
WAIT_FRAME = "waitq"
#: bytes of one row of each frame on the wire (read once per message: computed once here)
_ROW_BYTES = {n: sum(np.dtype(dt).itemsize for _, dt, _ in cols) for n, cols in FRAMES.items()}
_NULL = -1                      # dmin/dmax/dur_max of an untimed group (durations are >= 0)
#: JetStream's default max_payload is 1 MiB
MAX_MESSAGE_BYTES = 1 << 20
MAX_INFLATED_BYTES = 64 << 20
#: at most this many messages for one node-window (a 1 MiB limit then carries a 256 MiB partial)
MAX_PARTS = 256
#: level 1: 7x faster than 6 on a node's window (the node collector's largest cost at 2 M records/s)
#: for about 9 % more bytes
ZLIB_LEVEL = 1
_U32 = struct.Struct("<I")


def _column(df: pl.DataFrame, name: str, dtype: str) -> bytes:
    s = df[name]
    a = (s.fill_null(_NULL) if s.null_count() else s).to_numpy()
    w = a.astype(dtype)
    if not np.array_equal(w, a):
        raise ValueError(f"partial: column {name} does not fit the wire dtype {dtype}")
    return w.tobytes()


def _body(frames: dict[str, pl.DataFrame], head: dict) -> bytes:
    h = json.dumps({**head, "rows": {n: len(f) for n, f in frames.items()}}).encode()
    body = b"".join(_column(frames[n], c, dt) for n, cols in FRAMES.items() if n in frames for c, dt, _ in cols)
    return _U32.pack(len(h)) + h + zlib.compress(body, ZLIB_LEVEL)


def _names(p: NodePartial) -> tuple[str, ...]:
    return BASE_FRAMES + (WAIT_FRAME,) if p.get(WAIT_FRAME) is not None else BASE_FRAMES


def _sorted_frames(p: NodePartial) -> dict[str, pl.DataFrame]:
    return {name: p[name].sort([c for c, _, _ in FRAMES[name][:3]]) for name in _names(p)}


def _head(p: NodePartial, job_id: str, authenticated: bool) -> dict:
    # auth: every peer of the node's receiver had to present a token (the collector's
    # inputs_authenticated); the central tier applies tuning only where every node's partial says so
    head = {"v": 1, "node": p["node"], "job": job_id, "window": p["window"], "window_s": p["window_s"],
            "auth": int(authenticated)}
    if p.get(WAIT_FRAME) is not None:    # version 2: the waits' records, and whether the node lost some
        head.update(v=2, waits_lossy=int(p.get("waits_lossy", 0)))
        if p.get("waits_lossy_comms"):   # the communicators that lost records (scaleout/waits.py)
            head["lossy_comms"] = [int(c) for c in p["waits_lossy_comms"]]
    if p.get("partition") is not None:   # one communicator partition of the job (absent: the whole job)
        head["partition"] = int(p["partition"])
    return head


def encode_partial(p: NodePartial, job_id: str, authenticated: bool = False) -> bytes:
    """One message holding the whole partial (whatever its size: see :func:`encode_messages`)."""
    return _body(_sorted_frames(p), _head(p, job_id, authenticated))


def _slices(frames: dict[str, pl.DataFrame], k: int, i: int) -> dict[str, pl.DataFrame]:
    return {n: f.slice(len(f) * i // k, len(f) * (i + 1) // k - len(f) * i // k) for n, f in frames.items()}


def raw_size(p: NodePartial) -> int:
    """The bytes of a partial's columns before compression."""
    return sum(len(p[n]) * _ROW_BYTES[n] for n in _names(p))


def encode_messages(p: NodePartial, job_id: str, max_bytes: int = MAX_MESSAGE_BYTES,
                    ratio: float | None = None, authenticated: bool = False) -> list[bytes]:
    """The partial as few messages of at most ``max_bytes`` each: one when it fits, else its rows
    cut into ``parts`` slices (more slices until every part fits). ``ratio`` (compressed / raw bytes
    of the sender's last partial) lets a partial that will not fit skip compressing it whole first;
    a wrong ratio costs messages or a retry, never correctness. ValueError past ``MAX_PARTS``."""
    frames, head = _sorted_frames(p), _head(p, job_id, authenticated)
    k = 1 if ratio is None else -(-int(raw_size(p) * ratio * 5) // (4 * max_bytes))
    if k <= 1:
        whole = _body(frames, head)
        if len(whole) <= max_bytes:
            return [whole]
        k = -(-len(whole) * 5 // (4 * max_bytes))      # a quarter to spare: compression varies by slice
    while k <= MAX_PARTS:
        out = [_body(_slices(frames, k, i), {**head, "part": i, "parts": k}) for i in range(k)]
        if max(map(len, out)) <= max_bytes:
            return out
        k *= 2
    raise ValueError(f"partial: {raw_size(p)} raw bytes do not fit {MAX_PARTS} messages of {max_bytes} bytes")


def _header(data: bytes) -> tuple[dict, int]:
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"partial: {len(data)} bytes > {MAX_MESSAGE_BYTES}")
    if len(data) < 4 or 4 + _U32.unpack_from(data)[0] > len(data):
        raise ValueError("partial: truncated header (claims more bytes than the message has)")
    n = _U32.unpack_from(data)[0]
    try:
        head = json.loads(data[4:4 + n])
        names = BASE_FRAMES + (WAIT_FRAME,) if head.get("v") == 2 else BASE_FRAMES
        rows = {k: int(head["rows"][k]) for k in names}
        head = {"node": str(head["node"]), "job": str(head["job"]), "window": int(head["window"]),
                "window_s": float(head["window_s"]), "v": head.get("v"), "rows": rows,
                "part": int(head.get("part", 0)), "parts": int(head.get("parts", 1)),
                "auth": head.get("auth", 0) == 1,
                "partition": None if head.get("partition") is None else int(head["partition"]),
                "waits_lossy": head.get("waits_lossy", 0), "lossy_comms": head.get("lossy_comms", [])}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"partial: bad header ({type(e).__name__}: {e})") from None
    if head["v"] not in (1, 2) or not head["window_s"] > 0 or min(rows.values()) < 0:
        raise ValueError(f"partial: unsupported version {head['v']!r}, window_s or row count")
    if head["waits_lossy"] not in (0, 1) or (head["v"] == 1 and head["waits_lossy"]):
        raise ValueError(f"partial: waits_lossy {head['waits_lossy']!r} (0 or 1, version 2 only)")
    _check_lossy_comms(head)
    if head["partition"] is not None and not 0 <= head["partition"] < MAX_PARTITIONS:
        raise ValueError(f"partial: partition {head['partition']} (at most {MAX_PARTITIONS} partitions)")
    if not 0 <= head["part"] < head["parts"] <= MAX_PARTS:
        raise ValueError(f"partial: part {head['part']} of {head['parts']} (at most {MAX_PARTS} parts)")
    return head, 4 + n


def _check_lossy_comms(head: dict) -> None:
    """The communicators a node marks lossy: version 2 only, at most MAX_LOSSY_COMMS 64-bit hashes."""
    lc = head["lossy_comms"]
    if not isinstance(lc, list) or len(lc) > MAX_LOSSY_COMMS or (lc and head["v"] != 2) or not all(
            type(c) is int and 0 <= c < 1 << 64 for c in lc):
        raise ValueError(f"partial: lossy_comms (a list of at most {MAX_LOSSY_COMMS} 64-bit communicator "
                         "hashes, version 2 only)")


class RawPartial:
    """A checked, inflated partial whose frames are built later, together with the rest of its
    window's (:func:`frames_of`): one polars frame per window instead of one per node."""
    __slots__ = ("job", "node", "window", "window_s", "rows", "body", "part", "parts", "auth", "partition",
                 "waits_lossy", "waits_lossy_comms")

    def __init__(self, head: dict, body: bytes):
        self.job, self.node, self.window = head["job"], head["node"], head["window"]
        self.window_s, self.rows, self.body = head["window_s"], head["rows"], body
        self.part, self.parts, self.auth = head["part"], head["parts"], head["auth"]
        self.partition, self.waits_lossy = head["partition"], head["waits_lossy"]
        self.waits_lossy_comms = head["lossy_comms"]

    def __getitem__(self, key: str):          # the merger reads node / window like a NodePartial's
        return getattr(self, key)

    def get(self, key: str, default=None):
        return getattr(self, key, default)


def peek_header(data: bytes) -> dict:
    """The checked header alone (job, node, window, window_s, rows): no inflating."""
    return _header(data)[0]


def read_partial(data: bytes) -> RawPartial:
    """Check and inflate one message (header, sizes, zlib); ValueError naming the defect otherwise."""
    head, pos = _header(data)
    rows = head["rows"]
    need = sum(rows[n] * _ROW_BYTES[n] for n in rows)
    if need > MAX_INFLATED_BYTES:
        raise ValueError(f"partial: {need} bytes of columns > {MAX_INFLATED_BYTES}")
    try:
        d = zlib.decompressobj()
        body = d.decompress(data[pos:], need + 1)
    except zlib.error as e:
        raise ValueError(f"partial: body is not zlib ({e})") from None
    if len(body) != need or not d.eof or d.unused_data:
        raise ValueError(f"partial: body holds {len(body)}+ bytes, the header's row counts need {need}")
    if rows.get(WAIT_FRAME):
        _check_waitq(rows, body)
    return RawPartial(head, body)


def _check_waitq(rows: dict[str, int], body: bytes) -> None:
    """A hostile node's wait records (the last frame of the body): ValueError naming the defect."""
    pos = sum(rows[n] * _ROW_BYTES[n] for n in BASE_FRAMES)
    n, cols = rows[WAIT_FRAME], {}
    for c, dt, _ in FRAMES[WAIT_FRAME]:
        cols[c] = np.frombuffer(body, dt, n, pos).astype(np.int64) if c != "comm_hash" else None
        pos += n * np.dtype(dt).itemsize
    check_waitq(cols)


def _frame(raws: list[RawPartial], name: str, offsets: list[int]) -> pl.DataFrame:
    n = [r.rows.get(name, 0) for r in raws]
    out = {"job_id": pl.Series(np.repeat(np.array([r.job for r in raws], dtype=object), n), dtype=pl.String)}
    for c, dt, pdt in FRAMES[name]:
        parts = []
        for i, r in enumerate(raws):
            parts.append(np.frombuffer(r.body, dt, n[i], offsets[i]))
            offsets[i] += n[i] * parts[-1].itemsize
        s = pl.Series(c, np.concatenate(parts) if parts else np.empty(0, dt)).cast(pdt)
        out[c] = s.replace(_NULL, None) if c in ("dmin_ns", "dmax_ns", "dur_max_ns") else s
    if name == "ranks":
        out["host"] = pl.Series(np.repeat(np.array([r.node for r in raws], dtype=object), n), dtype=pl.String)
    return pl.DataFrame(out)


def frames_of(raws: list[RawPartial]) -> NodePartial:
    """The partials of one window as one partial whose frames hold every node's rows (not yet
    aggregated: :func:`~dynamiccl.scaleout.partials.merge_partials` adds them up)."""
    if not raws or len({r.window for r in raws}) != 1:
        raise ValueError(f"frames_of: partials of one window needed (got {sorted({r.window for r in raws})})")
    offsets = [0] * len(raws)
    p: NodePartial = {"node": "+".join(sorted({r.node for r in raws})), "window": raws[0].window,
                      "window_s": raws[0].window_s}
    for name in BASE_FRAMES:
        p[name] = _frame(raws, name, offsets)
    if any(WAIT_FRAME in r.rows for r in raws):      # version 2: the nodes' wait records (scaleout/waits.py)
        p[WAIT_FRAME] = _frame(raws, WAIT_FRAME, offsets)
        p["waits_lossy"] = int(max(r.waits_lossy for r in raws))
        p["waits_lossy_comms"] = sorted({c for r in raws for c in r.waits_lossy_comms})
    return p


def decode_partial(data: bytes) -> tuple[str, NodePartial]:
    """(job_id, partial) of one message; ValueError naming the defect otherwise."""
    raw = read_partial(data)
    p = frames_of([raw])
    p.update(node=raw.node, part=raw.part, parts=raw.parts, partition=raw.partition)
    return raw.job, p
