"""Nested typed configuration of the ``dynamiccl node`` and ``dynamiccl central`` services, validated
at start-up (``validate()`` raises ``ValueError`` naming the field)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from dynamiccl.collector.config import ReceiverConfig
from dynamiccl.scaleout.auth import load_credentials
from dynamiccl.scaleout.bus import subject
from dynamiccl.scaleout.merger import MergerConfig, units
from dynamiccl.scaleout.node import NodeConfig
from dynamiccl.scaleout.tls import TlsConfig

__all__ = ["NatsConfig", "NodeServiceConfig", "CentralServiceConfig", "parse_jobs", "parse_partitions"]


@dataclass(frozen=True)
class NatsConfig:
    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    replicas: int = 1                    # the partials stream's replication (3 on a 3-server cluster)
    publish_timeout_s: float = 5.0
    ack_wait_s: float = 3.0              # a dead shard's unacknowledged partials come back after this
    credentials: str | None = None       # path of this client's user/password file (scaleout/auth.py); None: none
    connect_timeout_s: float = 10.0      # one connection attempt round; the service retries after it
    tls: TlsConfig | None = None         # scaleout/tls.py; None: TLS only where a server is tls:// (system CAs)

    def validate(self) -> None:
        if not self.servers or not all(s.startswith(("nats://", "tls://")) for s in self.servers):
            raise ValueError(f"nats.servers: nats://HOST:PORT or tls://HOST:PORT each (got {self.servers!r})")
        if not 1 <= self.replicas <= 5 or not self.publish_timeout_s > 0 or not self.ack_wait_s > 0:
            raise ValueError(f"nats: replicas in 1..5, publish_timeout_s > 0, ack_wait_s > 0 (got {self.replicas}, "
                             f"{self.publish_timeout_s}, {self.ack_wait_s})")
        if not self.connect_timeout_s > 0:
            raise ValueError(f"nats.connect_timeout_s must be > 0 (got {self.connect_timeout_s})")
        if self.credentials is not None:
            load_credentials(self.credentials)      # present, private, well-formed: refused at start-up otherwise
        if self.tls is not None:
            plain = [s for s in self.servers if not s.startswith("tls://")]
            if plain:
                raise ValueError(f"nats.servers: with TLS configured every server is tls://HOST:PORT (got {plain!r})")
            self.tls.validate()

    @property
    def effective_tls(self) -> TlsConfig | None:
        """The TLS a connection uses: the configured one, or the system's CAs where the servers are
        tls:// (never a plain connection to a tls:// server)."""
        if self.tls is None and any(s.startswith("tls://") for s in self.servers):
            return TlsConfig()
        return self.tls


@dataclass(frozen=True)
class NodeServiceConfig:
    node: NodeConfig
    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)
    nats: NatsConfig = field(default_factory=NatsConfig)
    metrics: str | None = None           # HOST:PORT of /metrics, None: off
    max_queued_records: int = 1 << 20    # between the socket and the aggregation (dropped and counted past it)
    # messages kept while the bus is unreachable (oldest dropped, counted); the outbox's 16 MiB bounds the
    # memory: a window's partial may go in up to 256 parts, and the last windows close together at stop
    outbox_messages: int = 1024
    # where this node's ranks' tuner plugin reads its file (DYNAMICCL_TUNER_CONFIG): the central tier's
    # applied versions arrive over the bus and are written there (scaleout/tuner_bus.py); None: not fetched
    tuner_config: str | None = None
    tuner_poll_s: float = 5.0            # the job's last file is read again this often (missed while disconnected)

    @property
    def peers_authenticated(self) -> bool:
        """Every peer of the receiver must present a token (the collector's ``inputs_authenticated``
        rule): a tokens file, and Unix-socket peers too unless none listens there."""
        rc = self.receiver
        return rc.tokens_file is not None and (rc.auth_unix or not any(a.startswith("unix:") for a in rc.listen))

    def validate(self) -> "NodeServiceConfig":
        self.node.validate()
        self.receiver.validate()
        self.nats.validate()
        _address(self.metrics)
        if self.max_queued_records < 1 or self.outbox_messages < 1:
            raise ValueError("node: max_queued_records and outbox_messages must be >= 1")
        if not self.tuner_poll_s > 0:
            raise ValueError(f"node.tuner_poll_s must be > 0 (got {self.tuner_poll_s})")
        if self.tuner_config is not None and not os.path.isdir(os.path.dirname(os.path.abspath(self.tuner_config))):
            raise ValueError(f"node.tuner_config {self.tuner_config!r}: its directory does not exist")
        return self


@dataclass(frozen=True)
class CentralServiceConfig:
    shard: str
    merger: MergerConfig
    nats: NatsConfig = field(default_factory=NatsConfig)
    metrics: str | None = None
    changes_path: str | None = None      # regime changes, one JSON line each (None: log only)
    warmup: int = 60                     # the detector's baseline windows per stream
    heartbeat_ttl_s: float = 1.5         # a shard silent this long loses its jobs (takeover)
    node_ttl_s: float = 5.0              # a node silent this long: its windows stop waiting for it
    # job -> communicator partitions (its nodes' --partitions); absent: 1, the whole job one unit
    partitions: dict[str, int] = field(default_factory=dict)

    def validate(self) -> "CentralServiceConfig":
        subject(self.shard, "x")         # a subject token
        self.merger.validate()
        self.nats.validate()
        _address(self.metrics)
        if not self.merger.expected_nodes:
            raise ValueError("central: no job (--job JOB=NODE,NODE,...)")
        for job, nodes in self.merger.expected_nodes.items():
            for n in nodes:
                subject(job, n)
        units(self.merger.expected_nodes, self.partitions)    # known jobs, 1..MAX_PARTITIONS each
        if self.warmup < 1 or not self.heartbeat_ttl_s > 0 or not self.node_ttl_s > 0:
            raise ValueError("central: warmup >= 1, heartbeat_ttl_s > 0 and node_ttl_s > 0")
        return self


def _address(addr: str | None) -> None:
    if addr is None:
        return
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"metrics address {addr!r}: HOST:PORT")


def parse_partitions(specs: list[str] | None) -> dict[str, int]:
    """``["j1=4"]`` → {job: partitions}.

    >>> parse_partitions(["j1=4"])
    {'j1': 4}
    """
    out: dict[str, int] = {}
    for spec in specs or []:
        job, sep, k = spec.partition("=")
        if not sep or not job or not k.isdigit():
            raise ValueError(f"--partitions {spec!r}: JOB=P")
        if job in out:
            raise ValueError(f"--partitions {job!r} given twice")
        out[job] = int(k)
    return out


def parse_jobs(specs: list[str]) -> dict[str, frozenset[str]]:
    """``["j1=n0,n1", "j2=n2"]`` → {job: nodes}.

    >>> sorted(parse_jobs(["j1=n0,n1"])["j1"])
    ['n0', 'n1']
    """
    out: dict[str, frozenset[str]] = {}
    for spec in specs:
        job, sep, nodes = spec.partition("=")
        names = frozenset(n for n in nodes.split(",") if n)
        if not sep or not job or not names:
            raise ValueError(f"--job {spec!r}: JOB=NODE[,NODE...]")
        if job in out:
            raise ValueError(f"--job {job!r} given twice")
        out[job] = names
    return out
