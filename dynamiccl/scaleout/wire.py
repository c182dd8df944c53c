"""A partial on the wire: one JSON header line, then the four frames as Arrow IPC (zstd).

``[u32 header length][header JSON][u32 len][keys IPC][u32 len][hist IPC]...``; the header names the
node, job, window and window length. Decoding checks every length against the message and the
frames' columns against the ones a partial has (a clear ``ValueError`` naming what is wrong).
"""
from __future__ import annotations

import io
import json
import struct

import polars as pl

from dynamiccl.scaleout.partials import NodePartial

__all__ = ["encode_partial", "decode_partial", "FRAMES", "MAX_MESSAGE_BYTES"]

FRAMES = {
    "keys": {"job_id", "comm_hash", "func", "algo", "proto", "size_bucket", "records", "bytes_sum", "timed",
             "dur_sum_ns", "dur_max_ns", "tcv", "nranks", "nnodes"},
    "hist": {"job_id", "comm_hash", "func", "algo", "proto", "size_bucket", "bucket", "count"},
    "inst": {"job_id", "comm_hash", "func", "seq", "algo", "proto", "size_bucket", "nranks", "n", "n_t",
             "dsum_ns", "dmin_ns", "dmax_ns", "n_at_min", "min_rank", "last_start_ns", "last_rank"},
    "ranks": {"job_id", "comm_hash", "rank", "records", "timed", "dur_sum_ns", "host"},
}
#: JetStream's default max_payload is 1 MiB; a node's window is far below it at the demo's density
MAX_MESSAGE_BYTES = 1 << 20
_U32 = struct.Struct("<I")


def encode_partial(p: NodePartial, job_id: str) -> bytes:
    head = json.dumps({"v": 1, "node": p["node"], "job": job_id, "window": p["window"],
                       "window_s": p["window_s"]}).encode()
    out = [_U32.pack(len(head)), head]
    for name in FRAMES:
        buf = io.BytesIO()
        p[name].write_ipc(buf, compression="zstd")
        out += [_U32.pack(buf.tell()), buf.getvalue()]
    return b"".join(out)


def _chunk(data: bytes, pos: int, what: str) -> tuple[bytes, int]:
    if pos + 4 > len(data):
        raise ValueError(f"partial: truncated before the length of {what}")
    (n,) = _U32.unpack_from(data, pos)
    if pos + 4 + n > len(data):
        raise ValueError(f"partial: {what} claims {n} bytes, {len(data) - pos - 4} left")
    return data[pos + 4:pos + 4 + n], pos + 4 + n


def decode_partial(data: bytes) -> tuple[str, NodePartial]:
    """(job_id, partial) of one message; ValueError naming the defect otherwise."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"partial: {len(data)} bytes > {MAX_MESSAGE_BYTES}")
    raw, pos = _chunk(data, 0, "header")
    try:
        head = json.loads(raw)
        node, job, window, window_s = str(head["node"]), str(head["job"]), int(head["window"]), float(head["window_s"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"partial: bad header ({e})") from None
    if head.get("v") != 1 or not window_s > 0:
        raise ValueError(f"partial: unsupported version {head.get('v')!r} or window_s {window_s}")
    p: NodePartial = {"node": node, "window": window, "window_s": window_s}
    for name, cols in FRAMES.items():
        raw, pos = _chunk(data, pos, name)
        try:
            df = pl.read_ipc(io.BytesIO(raw))
        except Exception as e:  # polars raises several types for corrupt IPC
            raise ValueError(f"partial: frame {name} is not Arrow IPC ({type(e).__name__})") from None
        if set(df.columns) != cols:
            raise ValueError(f"partial: frame {name} has columns {sorted(df.columns)}")
        p[name] = df
    if pos != len(data):
        raise ValueError(f"partial: {len(data) - pos} trailing bytes")
    return job, p
