"""Typed, validated configuration of the collector. ``default_config()`` is the one source of
defaults (docs/architecture.md "Defaults"); ``dynamiccl/collector/README.md`` mirrors it (a test checks).

User-facing structs end in ``Config``; runtime objects (clock, registry, logger) are passed
separately as keyword arguments, never stored in a config.
"""
from __future__ import annotations

import dataclasses
import numbers
import re
from dataclasses import dataclass, field

from dynamiccl.contracts.addresses import COLLECTOR_LISTEN

__all__ = [
    "ReceiverConfig", "WindowConfig", "ParquetConfig", "PrometheusConfig", "FeaturesConfig",
    "TelemetryConfig", "PeerConfig", "CollectorConfig", "default_config", "parse_address", "parse_host_port", "flatten",
]

DEFAULT_LISTEN = COLLECTOR_LISTEN   # per-user, per-job socket (dynamiccl/contracts/runtime_paths.py)
DEFAULT_METRICS = "127.0.0.1:9464"
DEFAULT_FEATURES = "tcp:127.0.0.1:9465"
DEFAULT_PARQUET_DIR = "./runs/parquet"


def parse_host_port(value: str, *, key: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` allowed) → (host, port); raises ValueError naming ``key``."""
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]*):(\d+)", value or "")
    if not m:
        raise ValueError(f"{key}: expected HOST:PORT, got {value!r}")
    host = m.group(1) if m.group(1) is not None else m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        raise ValueError(f"{key}: port {port} out of range 0..65535")
    return host or "0.0.0.0", port


def parse_address(value: str, *, key: str) -> tuple[str, object]:
    """``unix:PATH`` → ("unix", path); ``tcp:HOST:PORT`` → ("tcp", (host, port))."""
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected unix:PATH or tcp:HOST:PORT, got {value!r}")
    if value.startswith("unix:"):
        path = value[5:]
        if not path:
            raise ValueError(f"{key}: empty unix socket path in {value!r}")
        if len(path.encode()) > 107:
            raise ValueError(f"{key}: unix socket path longer than 107 bytes: {path!r}")
        return "unix", path
    if value.startswith("tcp:"):
        return "tcp", parse_host_port(value[4:], key=key)
    raise ValueError(f"{key}: expected unix:PATH or tcp:HOST:PORT, got {value!r}")


def _positive(obj, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be > 0, got {v!r}")


@dataclass(frozen=True)
class ReceiverConfig:
    """Plugin stream receivers (Unix socket / TCP)."""
    listen: tuple[str, ...] = (DEFAULT_LISTEN,)
    max_connections: int = 1024
    reserved_local_connections: int = 64  # of max_connections, only Unix-socket peers may use these
    recv_chunk_bytes: int = 1 << 20
    max_records_per_s_per_connection: int = 2_000_000  # above this for a full second = flood
    gap_tracker_max_processes: int = 65536
    handshake_timeout_s: float = 5.0   # no PROCESS record by then: closed
    idle_timeout_s: float = 120.0      # nothing received for this long (plugins send STATS each second)
    frame_timeout_s: float = 10.0      # a frame incomplete this long (slow loris): closed
    max_pending_bytes: int = 256 << 20  # partial frames held by all connections together
    tokens_file: str | None = None     # per-job tokens (dynamiccl/collector/auth.py); None: no peer is authenticated
    auth_unix: bool = True             # with tokens_file, Unix-socket peers must authenticate too

    def validate(self) -> None:
        _positive(self, "max_connections", "recv_chunk_bytes", "max_records_per_s_per_connection",
                  "gap_tracker_max_processes", "handshake_timeout_s", "idle_timeout_s",
                  "frame_timeout_s", "max_pending_bytes")
        if self.recv_chunk_bytes < 16 + 128:
            raise ValueError("recv_chunk_bytes must be >= 144")
        if not 0 <= self.reserved_local_connections < self.max_connections:
            raise ValueError(f"reserved_local_connections must be in 0..max_connections-1, "
                             f"got {self.reserved_local_connections!r}")
        for addr in self.listen:
            parse_address(addr, key="listen")


@dataclass(frozen=True)
class WindowConfig:
    """Event-time window aggregation."""
    window_s: float = 1.0
    allowed_lateness_s: float = 2.0
    idle_flush_s: float = 3.0
    queue_max_records: int = 2_000_000  # records waiting for the aggregator; overflow dropped
    max_open_windows: int = 64          # a wider event-time spread is dropped as "too_early"
    # Watermark = the slowest active source's (host's) newest event time, but never more than
    # max_skew_s behind the fastest: a lagging node delays window close instead of losing records
    # as "late"; a node further behind than max_skew_s (or silent for idle_flush_s) stops holding
    # windows open. Effective skew is at most (max_open_windows - 2) windows.
    max_skew_s: float = 10.0
    # Event time is held per host to +-max_event_spread_s around where its clock should be
    # (dynamiccl/collector/processors/time_gate.py): one frame cannot span hours of partitions and windows.
    max_event_spread_s: float = 300.0
    # A host whose event time runs more than this ahead of the collector's wall clock does not
    # advance the watermark (a clock 30 s ahead would otherwise make other hosts' records late).
    max_clock_ahead_s: float = 1.0
    # Bounds on the records open windows buffer (~59 bytes each): beyond them records are dropped
    # and counted (reason="window_full"), never blocked. Sized for the 2 M records/s target with the
    # default 1 s window and 2 s lateness: one window then holds ~2 M records (4x headroom) and all
    # open windows together ~6 M (window + lateness; 2.7x headroom, ~0.95 GB at the bound).
    max_window_records: int = 8_000_000     # per open window
    max_buffered_records: int = 16_000_000  # all open windows together
    # Untimed records of complete collective instances (NCCL 2.31+ after a send/recv: TIMING_SUSPECT) get
    # their wait for the last rank to enqueue as a stand-in, emitted as streams of their own (the window's
    # ``waits`` frame, processors/wait.py); an instance whose waits span more than max_wait_s is refused.
    wait_streams: bool = True
    max_wait_s: float = 1.0
    # A host whose collective finish times sit more than this from its peers' (the median of each
    # instance's ranks, on >= 3 hosts) on its last 4 sampled instances has stepped its clock: its
    # later records' times are corrected by the step before windowing (processors/clock_align.py).
    # Smaller offsets move records by less than a window and are left; 0 turns the correction off.
    clock_align_s: float = 1.0
    # A record whose duration is negative or longer than this (a broken timer or clock) counts as an
    # untimed record, and is counted (dynamiccl_collector_durations_refused_total).
    max_duration_s: float = 3600.0

    def validate(self) -> None:
        _positive(self, "window_s", "max_wait_s", "max_duration_s", "idle_flush_s", "queue_max_records", "max_open_windows",
                  "max_window_records", "max_buffered_records", "max_event_spread_s", "max_clock_ahead_s")
        for name in ("max_window_records", "max_buffered_records"):
            if not isinstance(getattr(self, name), numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.max_window_records > self.max_buffered_records:
            raise ValueError(f"max_window_records ({self.max_window_records}) must be <= "
                             f"max_buffered_records ({self.max_buffered_records})")
        if not isinstance(self.max_skew_s, (int, float)) or self.max_skew_s < 0:
            raise ValueError(f"max_skew_s must be >= 0, got {self.max_skew_s!r}")

        if not isinstance(self.clock_align_s, (int, float)) or not 0 <= self.clock_align_s < float("inf"):
            raise ValueError(f"clock_align_s must be >= 0 (0: off), got {self.clock_align_s!r}")
        if not isinstance(self.allowed_lateness_s, (int, float)) or self.allowed_lateness_s < 0:
            raise ValueError(f"allowed_lateness_s must be >= 0, got {self.allowed_lateness_s!r}")


@dataclass(frozen=True)
class ParquetConfig:
    """Rolling parquet history of raw records. ``directory=None`` disables it."""
    directory: str | None = DEFAULT_PARQUET_DIR
    flush_rows: int = 1_000_000       # a part file is finished once it holds this many rows
    flush_interval_s: float = 60.0    # ... or once its first row is this old (wall time)
    max_open_files: int = 64          # part files open at once; one more finishes the least recently used
    # Shared memory between the queue thread and the writer: slabs of row_group_rows raw records
    # (128 B each; a full slab becomes one row group), max_buffered_rows in all (at most 64 slabs).
    max_buffered_rows: int = 1_048_576
    row_group_rows: int = 131_072
    queue_max_records: int = 2_000_000  # records waiting in front of the slabs; overflow dropped
    compression: str = "lz4"
    writer: str = "process"           # "process": a child process encodes and writes; "thread": in process
    writer_timeout_s: float = 30.0    # a writer that returns no slab for this long is killed and restarted

    def validate(self) -> None:
        _positive(self, "flush_rows", "flush_interval_s", "max_buffered_rows", "row_group_rows",
                  "queue_max_records", "writer_timeout_s", "max_open_files")
        for name in ("flush_rows", "max_buffered_rows", "row_group_rows", "queue_max_records",
                     "max_open_files"):
            if not isinstance(getattr(self, name), numbers.Integral):
                raise ValueError(f"parquet.{name} must be an integer, got {getattr(self, name)!r}")
        if self.compression not in ("zstd", "snappy", "lz4", "gzip", "none"):
            raise ValueError(f"compression must be zstd, snappy, lz4, gzip or none, got {self.compression!r}")
        if self.writer not in ("process", "thread"):
            raise ValueError(f"parquet.writer must be process or thread, got {self.writer!r}")


@dataclass(frozen=True)
class PrometheusConfig:
    """``/metrics`` over HTTP. ``address=None`` disables the server (the Collector still works)."""
    address: str | None = DEFAULT_METRICS
    # exposed series of the cumulative tables together (a histogram label set is 24); when full
    # the least recently updated label set idle for series_min_idle_s is evicted, else the new one
    # is not tracked (about 170 bytes a series: ~3.4 MB of /metrics at the bound)
    max_series: int = 20000
    series_min_idle_s: float = 15.0
    max_window_series: int = 1000  # rows per last-window gauge (bandwidth, spread, skew)
    gauge_ttl_s: float = 15.0      # last-window gauges are not exported once no window closed this long
    max_clients: int = 16          # /metrics requests served at once; more are closed and counted
    request_timeout_s: float = 5.0 # from accept to the end of the response
    # while /metrics was scraped within this long, the collective text is rendered as each window
    # closes (on the window thread), so a scrape only sends bytes; 0: rendered by the scrape itself
    render_ahead_s: float = 30.0

    def validate(self) -> None:
        if self.address is not None:
            parse_host_port(self.address, key="metrics")
        _positive(self, "max_series", "series_min_idle_s", "max_window_series", "gauge_ttl_s",
                  "max_clients", "request_timeout_s")
        if not isinstance(self.render_ahead_s, (int, float)) or self.render_ahead_s < 0:
            raise ValueError(f"prometheus.render_ahead_s must be >= 0, got {self.render_ahead_s!r}")


@dataclass(frozen=True)
class FeaturesConfig:
    """Feature stream server (NDJSON). ``address=None`` disables the server (in-process
    ``Pipeline.subscribe()`` still works)."""
    address: str | None = DEFAULT_FEATURES
    queue_max_windows: int = 64  # per subscriber; overflow drops the oldest window
    max_subscribers: int = 64
    stall_timeout_s: float = 30.0  # at max_subscribers, a client with windows unread this long is dropped

    def validate(self) -> None:
        if self.address is not None:
            parse_address(self.address, key="features")
        _positive(self, "queue_max_windows", "max_subscribers", "stall_timeout_s")


@dataclass(frozen=True)
class TelemetryConfig:
    """GPU telemetry via NVML (dynamiccl/collector/telemetry/gpu.py); without a driver it logs once and stays off."""
    gpu: bool = True
    interval_s: float = 5.0

    def validate(self) -> None:
        _positive(self, "interval_s")


@dataclass(frozen=True)
class PeerConfig:
    """Per-peer network timing (PEER records; dynamiccl/collector/processors/peers.py). Windows follow
    ``window.window_s`` / ``allowed_lateness_s`` / ``idle_flush_s``."""
    top_k: int = 32                  # Prometheus series per window: the (comm, rank, peer, direction) rows
    #                                  with the most proxy-state time; the rest counted in series_dropped
    max_pairs: int = 65536           # rows one open window holds; the least busy beyond it are dropped, counted
    queue_max_records: int = 1_000_000  # PEER records waiting for the aggregation; overflow dropped
    parquet_flush_s: float = 60.0    # the peers table is written (per job) at least this often

    def validate(self) -> None:
        _positive(self, "top_k", "max_pairs", "queue_max_records", "parquet_flush_s")
        for name in ("top_k", "max_pairs", "queue_max_records"):
            if not isinstance(getattr(self, name), numbers.Integral):
                raise ValueError(f"peers.{name} must be an integer, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class CollectorConfig:
    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)
    window: WindowConfig = field(default_factory=WindowConfig)
    parquet: ParquetConfig = field(default_factory=ParquetConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    peers: PeerConfig = field(default_factory=PeerConfig)
    replay: tuple[str, ...] = ()  # parquet files/directories replayed into the pipeline at start

    def validate(self) -> "CollectorConfig":
        self.receiver.validate()
        self.window.validate()
        self.parquet.validate()
        self.prometheus.validate()
        self.features.validate()
        self.telemetry.validate()
        self.peers.validate()
        return self

    def replace(self, **sections) -> "CollectorConfig":
        """``cfg.replace(window={"window_s": 0.5}, parquet={"directory": None})``."""
        changes = {}
        for name, value in sections.items():
            current = getattr(self, name)
            changes[name] = dataclasses.replace(current, **value) if isinstance(value, dict) else value
        return dataclasses.replace(self, **changes)


def default_config() -> CollectorConfig:
    return CollectorConfig()


def flatten(cfg: CollectorConfig) -> dict[str, object]:
    """``{"window.window_s": 1.0, ..., "replay": ()}`` — the README table's keys."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            for sub in dataclasses.fields(value):
                out[f"{f.name}.{sub.name}"] = getattr(value, sub.name)
        else:
            out[f.name] = value
    return out
