"""Per-peer network timing: PEER records in, one table per closed window out (Prometheus, parquet).

The profiler plugin (opt-in: ProxyOp|ProxyStep in DYNAMICCL_EVENT_MASK) sends, after an operation's
own record, one PEER record per (peer, direction) its proxy worked on: bytes, proxy ops, steps and
the time the steps spent in each of three states (send: gpu_wait, peer_wait, net_wait; recv:
net_wait, flush_wait, gpu_wait). A slow link or NIC shows as one peer's net_wait; a slow rank as
every peer's gpu_wait.

Rules (each bounded, each refusal counted in ``dynamiccl_collector_records_dropped_total{reason}``):

* windows: event time = the operation's ``enqueue_ns``; windows of ``window.window_s``, closed once
  the newest event time seen is ``allowed_lateness_s`` past their end, or all of them after
  ``idle_flush_s`` without a PEER record (processing clock), or the oldest when more than
  ``max_open_windows`` are open. A record for a closed window: ``peer_late``. An event time more
  than ``max_clock_ahead_s`` past the wall clock (it would close everyone's windows): ``peer_clock_range``.
* a window holds at most ``peers.max_pairs`` rows (job, host, comm, rank, peer, direction); beyond
  that the rows with the least proxy-state time go, their records counted as ``peer_pairs_full``.
* Prometheus: the ``peers.top_k`` rows of the last closed window with the most proxy-state time
  (``dynamiccl_peer_bytes``, ``dynamiccl_peer_state_seconds``); the other rows are counted in
  ``dynamiccl_collector_peer_series_dropped_total``. The gauges expire ``prometheus.gauge_ttl_s``
  after the last closed window.
* parquet: every row of every closed window, one file per job every ``peers.parquet_flush_s`` and
  at shutdown, under ``<parquet.directory>/peers/job_id=<job>/`` (written to a temporary name,
  then renamed).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import polars as pl

from dynamiccl.collector.config import PeerConfig, WindowConfig
from dynamiccl.collector.exporters.parquet import safe_partition_value
from dynamiccl.collector.exporters.prom_text import Part, to_family
from dynamiccl.collector.metrics import BY_NAME, SelfMetrics
from dynamiccl.collector.wire_format import Kind

__all__ = ["PeerBatch", "PeerWindows", "PeerMetrics", "PeerParquet", "PeerStage", "STATE_NAMES", "peer_valid"]

log = logging.getLogger(__name__)

#: the three ProxyStep state buckets of a PEER record, per direction (wire_format.PEER_DTYPE)
STATE_NAMES = {"send": ("gpu_wait", "peer_wait", "net_wait"), "recv": ("net_wait", "flush_wait", "gpu_wait")}
KEY = ("job_id", "host", "comm_hash", "rank", "peer", "is_send")
SUMS = ("records", "proxy_ops", "steps", "bytes", "s0_ns", "s1_ns", "s2_ns")


@dataclass(slots=True)
class PeerBatch:
    """PEER records (``wire_format.PEER_DTYPE``) of one plugin process; ``comm_names``: comm_hash → name
    as known for this process so far (as in RecordBatch)."""
    peers: np.ndarray
    host: str
    job_id: str
    comm_names: Mapping[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.peers)


def peer_valid(p: np.ndarray) -> np.ndarray:
    """Records a well-behaved plugin can produce."""
    return ((p["kind"] == Kind.PEER) & (p["is_send"] <= 1) & (p["rank"] >= 0) & (p["peer"] >= 0)
            & (p["enqueue_ns"] > 0))


def _partial(batch: PeerBatch, window_ns: int) -> pl.DataFrame:
    """One batch summed per (window, key)."""
    p = batch.peers
    st = p["state_ns"]
    df = pl.DataFrame({"window": (p["enqueue_ns"] // np.uint64(window_ns)).astype(np.int64),
                       "comm_hash": p["comm_hash"], "rank": p["rank"], "peer": p["peer"],
                       "is_send": p["is_send"], "records": np.ones(len(p), np.int64),
                       "proxy_ops": p["proxy_ops"].astype(np.int64), "steps": p["steps"].astype(np.int64),
                       "bytes": p["bytes"], "s0_ns": st[:, 0], "s1_ns": st[:, 1], "s2_ns": st[:, 2]})
    return (df.group_by("window", *KEY[2:]).agg(pl.col(c).sum() for c in SUMS)
            .with_columns(job_id=pl.lit(batch.job_id), host=pl.lit(batch.host)).select("window", *KEY, *SUMS))


def _busy_first(df: pl.DataFrame, states: tuple[str, ...] = ("s0_ns", "s1_ns", "s2_ns"),
                keys: tuple[str, ...] = KEY) -> pl.DataFrame:
    """Rows by proxy-state time, most first (ties: bytes, then the key), a stable order for the cut."""
    return df.sort(pl.sum_horizontal(states), "bytes", *keys, descending=True)


class _Window:
    __slots__ = ("parts", "rows")

    def __init__(self):
        self.parts: list[pl.DataFrame] = []
        self.rows = 0


class PeerWindows:
    """Consumer of :class:`PeerBatch` (run behind a QueuedConsumer: one thread calls consume/tick).

    ``on_window(window_start_s, frame)`` gets every closed window: columns ``window_start_s``, job_id,
    host, comm_hash, comm (its name, else the hex hash), rank, peer, direction and the sums (records, proxy_ops, steps, bytes,
    state0_s..state2_s)."""

    def __init__(self, config: PeerConfig, window: WindowConfig, *, metrics: SelfMetrics,
                 on_window: list[Callable[[float, pl.DataFrame], None]],
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        self.config, self.window = config, window
        self.metrics = metrics
        self.on_window = list(on_window)
        self._clock, self._wall = clock, wall_clock
        self._window_ns = int(round(window.window_s * 1e9))
        self._lateness_ns = int(round(window.allowed_lateness_s * 1e9))
        self._open: dict[int, _Window] = {}
        self._closed_below = -1  # every window < this is closed
        self._newest_ns = 0
        self._last_arrival: float | None = None
        # (job_id, comm_hash) -> name, as the other collector metrics label `comm` (name, else the hex
        # hash); the most recently seen peers.max_pairs communicators
        self._names: OrderedDict[tuple[str, int], str] = OrderedDict()

    def start(self) -> None:
        pass

    def consume(self, batch: PeerBatch) -> None:
        p = batch.peers
        ok = peer_valid(p)
        self.metrics.drop("peer_invalid", int((~ok).sum()))
        ahead = p["enqueue_ns"].astype(np.float64) * 1e-9 > self._wall() + self.window.max_clock_ahead_s
        self.metrics.drop("peer_clock_range", int((ok & ahead).sum()))
        ok &= ~ahead
        win = (p["enqueue_ns"] // np.uint64(self._window_ns)).astype(np.int64)
        late = ok & (win < self._closed_below)
        self.metrics.drop("peer_late", int(late.sum()))
        ok &= ~late
        if not ok.any():
            return
        self._last_arrival = self._clock()
        self._learn_names(batch.job_id, batch.comm_names, np.unique(p["comm_hash"][ok]))
        part = _partial(PeerBatch(p[ok], batch.host, batch.job_id), self._window_ns)
        for (w,), frame in part.partition_by("window", as_dict=True, include_key=False).items():
            self._add(int(w), frame)
        self._newest_ns = max(self._newest_ns, int(p["enqueue_ns"][ok].max()))
        self._close_ready()

    def _learn_names(self, job_id: str, names: Mapping[int, str], hashes: np.ndarray) -> None:
        for h in hashes.tolist():
            name = names.get(h)
            if name:
                self._names[(job_id, h)] = name
                self._names.move_to_end((job_id, h))
        while len(self._names) > self.config.max_pairs:
            self._names.popitem(last=False)

    def _comm(self, job_id: str, comm_hash: int) -> str:
        return self._names.get((job_id, comm_hash)) or f"{comm_hash:016x}"

    def _add(self, w: int, frame: pl.DataFrame) -> None:
        win = self._open.setdefault(w, _Window())
        win.parts.append(frame)
        win.rows += frame.height
        if win.rows > 2 * self.config.max_pairs:  # compact (and cut) so a window stays bounded
            merged = self._merge(win)
            win.parts, win.rows = [merged], merged.height

    def _merge(self, win: _Window) -> pl.DataFrame:
        df = pl.concat(win.parts).group_by(*KEY).agg(pl.col(c).sum() for c in SUMS).select(*KEY, *SUMS)
        if df.height > self.config.max_pairs:
            df = _busy_first(df)
            self.metrics.drop("peer_pairs_full", int(df["records"][self.config.max_pairs:].sum()))
            df = df.head(self.config.max_pairs)
        return df

    def _close_ready(self) -> None:
        for w in sorted(self._open):
            too_many = len(self._open) > self.window.max_open_windows
            if too_many or (w + 1) * self._window_ns + self._lateness_ns <= self._newest_ns:
                self._close(w)

    def _close(self, w: int) -> None:
        win = self._open.pop(w)
        self._closed_below = max(self._closed_below, w + 1)
        df = self._merge(win)
        self.metrics.add("peer_records", int(df["records"].sum()) if df.height else 0)
        start_s = w * self.window.window_s
        comm = [self._comm(j, h) for j, h in zip(df["job_id"].to_list(), df["comm_hash"].to_list())]
        out = (df.with_columns(window_start_s=pl.lit(start_s), comm=pl.Series(comm, dtype=pl.String),
                               direction=pl.when(pl.col("is_send") == 1).then(pl.lit("send")).otherwise(pl.lit("recv")),
                               state0_s=pl.col("s0_ns") * 1e-9, state1_s=pl.col("s1_ns") * 1e-9,
                               state2_s=pl.col("s2_ns") * 1e-9)
               .select("window_start_s", "job_id", "host", "comm_hash", "comm", "rank", "peer", "direction", "records",
                       "proxy_ops", "steps", "bytes", "state0_s", "state1_s", "state2_s"))
        for fn in self.on_window:
            fn(start_s, out)

    def tick(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        if self._open and self._last_arrival is not None and now - self._last_arrival >= self.window.idle_flush_s:
            for w in sorted(self._open):
                self._close(w)

    def shutdown(self) -> None:
        for w in sorted(self._open):
            self._close(w)


class PeerMetrics:
    """prometheus_client collector: the top_k rows of the last closed window, and the counters."""

    def __init__(self, config: PeerConfig, metrics: SelfMetrics, *, gauge_ttl_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.config, self.metrics = config, metrics
        self.gauge_ttl_s = gauge_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: list[tuple] = []
        self._at: float | None = None

    def update(self, start_s: float, frame: pl.DataFrame) -> None:
        # one series per label set: rows of the same (job, comm, rank, peer, direction) from two hosts
        # (a forged or restarted process) are summed, never exported twice (a scrape would fail)
        labels = ("job_id", "comm", "rank", "peer", "direction")
        frame = frame.group_by(labels).agg(pl.col("bytes", "state0_s", "state1_s", "state2_s").sum())
        top = _busy_first(frame, ("state0_s", "state1_s", "state2_s"), labels)
        self.metrics.add("peer_series_dropped", max(0, frame.height - self.config.top_k))
        rows = [(r["job_id"], r["comm"], str(r["rank"]), str(r["peer"]), r["direction"],
                 r["bytes"], (r["state0_s"], r["state1_s"], r["state2_s"]))
                for r in top.head(self.config.top_k).iter_rows(named=True)]
        with self._lock:
            self._rows, self._at = rows, self._clock()

    def parts(self) -> list[Part]:
        with self._lock:
            fresh = self._at is not None and self._clock() - self._at <= self.gauge_ttl_s
            rows = self._rows if fresh else []
        with self.metrics._lock:
            records, dropped = self.metrics.peer_records, self.metrics.peer_series_dropped
        return [Part(BY_NAME["dynamiccl_peer_bytes"], [(r[:5], r[5]) for r in rows]),
                Part(BY_NAME["dynamiccl_peer_state_seconds"],
                     [(r[:5] + (name,), sec) for r in rows for name, sec in zip(STATE_NAMES[r[4]], r[6])]),
                Part(BY_NAME["dynamiccl_collector_peer_records_total"], [((), records)]),
                Part(BY_NAME["dynamiccl_collector_peer_series_dropped_total"], [((), dropped)])]

    def collect(self):
        for part in self.parts():
            yield to_family(part)


class PeerParquet:
    """Every closed window's rows, one parquet file per job per flush (temporary name, then renamed)."""

    def __init__(self, directory: str, config: PeerConfig, metrics: SelfMetrics,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        self.root = os.path.join(directory, "peers")
        self.config, self.metrics = config, metrics
        self._clock, self._wall = clock, wall_clock
        self._frames: list[pl.DataFrame] = []
        self._since: float | None = None
        self._seq = 0
        self.files = self.rows = 0

    def add(self, start_s: float, frame: pl.DataFrame) -> None:
        if frame.height:
            self._frames.append(frame)
            self._since = self._since if self._since is not None else self._clock()

    def tick(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        if self._since is not None and now - self._since >= self.config.parquet_flush_s:
            self.flush()

    def flush(self) -> None:
        if not self._frames:
            return
        df, self._frames, self._since = pl.concat(self._frames), [], None
        for (job,), part in df.partition_by("job_id", as_dict=True).items():
            self._seq += 1
            d = os.path.join(self.root, f"job_id={safe_partition_value(job)}")
            path = os.path.join(d, f"peers-{int(self._wall() * 1e3)}-{os.getpid()}-{self._seq}.parquet")
            try:
                os.makedirs(d, exist_ok=True)
                part.write_parquet(path + ".tmp")
                os.replace(path + ".tmp", path)
                self.files += 1
                self.rows += part.height
            except OSError as exc:
                self.metrics.drop("parquet_write_failed", int(part["records"].sum()))
                log.warning("peers parquet %s: %s; %d rows lost (counted)", path, exc, part.height)


class PeerStage:
    """The collector's PEER path in one consumer (behind the pipeline's "peers" queue): windows, then
    the Prometheus rows and, with a parquet directory, the peers table."""

    def __init__(self, config: PeerConfig, window: WindowConfig, *, metrics: SelfMetrics, gauge_ttl_s: float,
                 parquet_dir: str | None, registry=None, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        self.prometheus = PeerMetrics(config, metrics, gauge_ttl_s=gauge_ttl_s, clock=clock)
        self.parquet = PeerParquet(parquet_dir, config, metrics, clock, wall_clock) if parquet_dir else None
        sinks = [self.prometheus.update] + ([self.parquet.add] if self.parquet else [])
        self.windows = PeerWindows(config, window, metrics=metrics, on_window=sinks, clock=clock,
                                   wall_clock=wall_clock)
        if registry is not None:
            registry.register(self.prometheus)

    def start(self) -> None:
        pass

    def consume(self, batch: PeerBatch) -> None:
        self.windows.consume(batch)

    def tick(self, now: float | None = None) -> None:
        self.windows.tick(now)
        if self.parquet is not None:
            self.parquet.tick(now)

    def shutdown(self) -> None:
        self.windows.shutdown()
        if self.parquet is not None:
            self.parquet.flush()
