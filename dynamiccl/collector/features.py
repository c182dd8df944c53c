"""The feature stream (collector → detector), per docs/architecture.md "Feature stream".

In process: :class:`WindowFeatures`. Across processes: one JSON object per line,
``{"v":1,"window_start":…,"window_s":…,"keys":{col:[…]},"ranks":{col:[…]},"counters":{…}}``, plus
``"waits":{col:[…]}`` in a window with wait stand-ins (below);
:func:`subscribe` connects to a collector's feature server and yields WindowFeatures.

>>> wf = WindowFeatures(10.0, 1.0, empty_keys(), empty_ranks(), {"records": 0})
>>> back = decode_line(encode_line(wf))
>>> back.window_start, back.keys.schema == wf.keys.schema, back.counters
(10.0, True, {'records': 0})
"""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Iterator

import polars as pl

__all__ = ["WindowFeatures", "KEYS_SCHEMA", "KEYS_DEFAULTS", "RANKS_SCHEMA", "RANKS_OPTIONAL", "empty_keys", "empty_ranks",
           "encode_line", "decode_line", "subscribe", "connect"]

KEYS_SCHEMA: dict[str, pl.DataType] = {
    "job_id": pl.String, "comm_name": pl.String, "func": pl.String, "algo": pl.String,
    "proto": pl.String, "comm_hash": pl.UInt64, "size_bucket": pl.Int32, "nranks": pl.Int32,
    "nnodes": pl.Int32, "records": pl.Int64, "instances": pl.Int64, "bytes_total": pl.Int64,
    "lat_mean_s": pl.Float64, "lat_p50_s": pl.Float64, "lat_p90_s": pl.Float64,
    "lat_p99_s": pl.Float64, "lat_max_s": pl.Float64, "algbw_Bps": pl.Float64,
    "busbw_Bps": pl.Float64, "spread_p50_s": pl.Float64, "spread_max_s": pl.Float64,
    "tuner_config_version": pl.UInt32,
}
# columns added after v1 lines were first written: a line without one decodes with this value
KEYS_DEFAULTS: dict[str, object] = {"tuner_config_version": 0}
RANKS_SCHEMA: dict[str, pl.DataType] = {
    "job_id": pl.String, "comm_hash": pl.UInt64, "rank": pl.Int32, "host": pl.String,
    "records": pl.Int64, "lat_mean_s": pl.Float64, "rel_lat_mean": pl.Float64,
    "shortest_count": pl.Int64, "instances_complete": pl.Int64,
}
# ranks columns a window may carry beyond RANKS_SCHEMA (lines and partials without them still
# decode): per (communicator, rank), the mean offset of the rank's enqueue / finish from its
# complete instances' mean over ranks, in seconds, within one host's clock per instance (a
# constant per-host clock offset cancels in their changes: `dynamiccl.detector.where`)
RANKS_OPTIONAL: dict[str, pl.DataType] = {"arr_off_s": pl.Float64, "fin_off_s": pl.Float64}


def empty_keys() -> pl.DataFrame:
    return pl.DataFrame(schema=KEYS_SCHEMA)


def empty_ranks() -> pl.DataFrame:
    return pl.DataFrame(schema=RANKS_SCHEMA)


@dataclass(frozen=True)
class WindowFeatures:
    """One closed event-time window. ``window_start`` is in seconds since the epoch (event time)."""
    window_start: float
    window_s: float
    keys: pl.DataFrame
    ranks: pl.DataFrame
    counters: dict = field(default_factory=dict)
    # Wait streams (collector/processors/wait.py): rows with KEYS_SCHEMA's columns for the untimed records of
    # complete collective instances, whose "latency" columns hold each record's wait for the last rank to
    # enqueue (not a duration: the bandwidth columns are null). Never mixed into ``keys``, whose rows keep
    # counting those records as untimed; None when the window has none.
    waits: pl.DataFrame | None = None


def _columns(df: pl.DataFrame) -> dict[str, list]:
    # NaN is not JSON; the frames use null for "no value", but map any NaN to null defensively
    out = {}
    for name in df.columns:
        s = df.get_column(name)
        if s.dtype.is_float():
            s = s.fill_nan(None)
        out[name] = s.to_list()
    return out


def encode_line(wf: WindowFeatures) -> bytes:
    """The NDJSON line (with trailing newline) for one window."""
    msg = {"v": 1, "window_start": wf.window_start, "window_s": wf.window_s,
           "keys": _columns(wf.keys), "ranks": _columns(wf.ranks), "counters": wf.counters}
    if wf.waits is not None and wf.waits.height:
        msg["waits"] = _columns(wf.waits)
    return (json.dumps(msg, separators=(",", ":"), allow_nan=False) + "\n").encode()


def decode_line(line: bytes | str) -> WindowFeatures:
    msg = json.loads(line)
    if msg.get("v") != 1:
        raise ValueError(f"unsupported feature stream version {msg.get('v')!r}")
    keys = pl.DataFrame(_with_defaults(msg["keys"]), schema=KEYS_SCHEMA) if msg["keys"] else empty_keys()
    ranks = _ranks(msg["ranks"]) if msg["ranks"] else empty_ranks()
    waits = pl.DataFrame(_with_defaults(msg["waits"]), schema=KEYS_SCHEMA) if msg.get("waits") else None
    return WindowFeatures(float(msg["window_start"]), float(msg["window_s"]), keys, ranks,
                          dict(msg.get("counters", {})), waits)


def _ranks(cols: dict) -> pl.DataFrame:
    """The ranks frame: RANKS_SCHEMA's columns, then whichever of RANKS_OPTIONAL the line has."""
    extra = {c: t for c, t in RANKS_OPTIONAL.items() if c in cols}
    unknown = set(cols) - set(RANKS_SCHEMA) - set(extra)
    if unknown:
        raise ValueError(f"ranks: unexpected columns {sorted(unknown)}")
    return pl.DataFrame({c: cols[c] for c in [*RANKS_SCHEMA, *extra]}, schema={**RANKS_SCHEMA, **extra})


def _with_defaults(cols: dict) -> dict:
    """Fill columns that older lines lack (``KEYS_DEFAULTS``) so they keep decoding."""
    missing = [c for c in KEYS_DEFAULTS if c not in cols]
    if not missing or not cols:
        return cols
    n = len(next(iter(cols.values())))
    return {**cols, **{c: [KEYS_DEFAULTS[c]] * n for c in missing}}


def connect(address: str, *, timeout: float | None = 10.0) -> socket.socket:
    """Open a client socket to ``unix:PATH`` or ``tcp:HOST:PORT``."""
    from dynamiccl.collector.config import parse_address
    kind, target = parse_address(address, key="address")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in target[0] else socket.AF_INET,
                             socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(target)
    return sock


def subscribe(address: str, *, timeout: float | None = None,
              connect_timeout: float = 10.0) -> Iterator[WindowFeatures]:
    """Connect now to a collector's feature server; the returned iterator yields
    :class:`WindowFeatures` until the server closes (``.close()`` disconnects).

    ``timeout``: seconds to wait for the next window (``TimeoutError`` when exceeded);
    None waits forever.
    """
    sock = connect(address, timeout=connect_timeout)
    sock.settimeout(timeout)
    return _lines(sock)


def _lines(sock: socket.socket) -> Iterator[WindowFeatures]:
    from dynamiccl.contracts.lines import client_lines
    for line in client_lines(sock):
        yield decode_line(line)
