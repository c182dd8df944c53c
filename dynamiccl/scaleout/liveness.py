"""Heartbeats and checkpoints in a JetStream key-value bucket (``DYNAMICCL_LIVE``).

Keys: ``shard.<name>`` (each shard, every TTL/3), ``node.<job>.<node>`` (each node collector, every
second), ``ckpt.<job>`` (the last window the job's owner ran), ``comb.<job>`` (a partitioned job's
combiner state, kept as bytes in ``combiners`` for the next owner of its partition 0). A watcher hands every update to
:class:`Liveness`, which times it on the *observer's* clock (no clock is compared across machines):
a shard heard from feeds the :class:`~.merger.ShardTable` (so shards in different processes share
ownership), a node not heard from for ``node_ttl_s`` is silent (its windows do not wait for it: it is
reported missing at once, never as a change), a checkpoint moves the shared checkpoints forward.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, MutableMapping

from dynamiccl.scaleout.merger import ShardTable

__all__ = ["LIVE_BUCKET", "Liveness", "BucketClock", "live_bucket", "watch", "shard_key", "node_key", "ckpt_key",
           "comb_key"]

LIVE_BUCKET = "DYNAMICCL_LIVE"
MAX_COMBINER_BYTES = 1 << 20
log = logging.getLogger(__name__)


def shard_key(shard: str) -> str:
    return f"shard.{shard}"


def node_key(job: str, node: str) -> str:
    return f"node.{job}.{node}"


def ckpt_key(job: str) -> str:
    return f"ckpt.{job}"


def comb_key(job: str) -> str:
    """The saved state of a partitioned job's combiner (scaleout/change_bus.py), for the next owner of ``<job>.0``."""
    return f"comb.{job}"


class BucketClock:
    """The time by which a shard judges the bucket's heartbeats: it stops while the shard's own writes
    to the bucket fail and goes on from where it stopped when one succeeds. While the bucket has no
    leader (seconds after a NATS server died) no shard's or node's beat lands, so every peer would
    expire at once and every shard would take every job; and a shard cut off from the bucket, unable
    to share its checkpoints, must not take over jobs by it.

    >>> t = [0.0]; c = BucketClock(lambda: t[0])
    >>> c.failed(); t[0] = 5.0; c()                    # 5 s of failed writes: time stands
    0.0
    >>> c.ok(); t[0] = 6.0; c()
    1.0

    It stands still for at most ``max_stall_s`` per blackout, then runs again: a shard that stays cut
    off (or whose watcher stays deaf) still expires a dead peer, ``max_stall_s`` later.
    """

    def __init__(self, clock: Callable[[], float], max_stall_s: float = 10.0):
        if not max_stall_s > 0:
            raise ValueError(f"max_stall_s must be > 0 (got {max_stall_s})")
        self._clock, self.max_stall_s = clock, max_stall_s
        self._stopped_at: float | None = None
        self._paused = 0.0
        self._last_echo = self._resumed = clock()
        self._unheard = 0                   # writes that succeeded since the watcher last delivered
        self.blackouts = 0

    def echo(self) -> None:
        """The watcher delivered an update (the shard's own beats come back this way)."""
        self._last_echo = self._clock()
        self._unheard = 0

    def written(self) -> None:
        self._unheard += 1

    def deaf(self, limit_s: float, writes: int = 3) -> bool:
        """No update delivered for ``limit_s`` though ``writes`` of the shard's own writes succeeded
        meanwhile: the watcher is down (its consumer being recreated after a server died), so the
        peers' beats cannot be read either. (Time alone is not enough: after a long merge the
        process's tasks run in turn, and the heartbeat may run before the watcher catches up.)"""
        return self._unheard >= writes and self._clock() - self._last_echo > limit_s

    def _stall(self, now: float) -> float:
        return 0.0 if self._stopped_at is None else min(max(0.0, now - self._stopped_at), self.max_stall_s)

    def __call__(self) -> float:
        now = self._clock()
        return now - self._paused - self._stall(now)

    def failed(self, since_last_echo: bool = False) -> None:
        """Stop the time now, or (a deaf watcher, found out late) back when it last heard anything."""
        if self._stopped_at is None:
            at = self._clock()
            self._stopped_at = max(self._last_echo, self._resumed) if since_last_echo else at
            self.blackouts += 1

    def ok(self) -> None:
        if self._stopped_at is not None:
            self._resumed = self._clock()
            self._paused += self._stall(self._resumed)
            self._stopped_at = None


class Liveness:
    def __init__(self, table: ShardTable, checkpoints: MutableMapping[str, int], node_ttl_s: float,
                 clock: Callable[[], float]):
        if not node_ttl_s > 0:
            raise ValueError("node_ttl_s must be > 0")
        self.table, self.checkpoints, self.node_ttl_s, self.clock = table, checkpoints, node_ttl_s, clock
        self._nodes: dict[tuple[str, str], float] = {}
        self.combiners: dict[str, bytes] = {}
        self.counters = {"heard": 0, "malformed": 0}

    def heard(self, key: str, value: bytes = b"") -> None:
        """One bucket update (put); anything else under the bucket is counted malformed and ignored."""
        kind, _, rest = key.partition(".")
        try:
            if kind == "shard" and rest:
                self.table.beat(rest)
            elif kind == "node" and rest.count(".") == 1:
                self._nodes[tuple(rest.split("."))] = self.clock()
            elif kind == "ckpt" and rest:
                w = int(value)
                self.checkpoints[rest] = max(w, self.checkpoints.get(rest, w))
            elif kind == "comb" and rest and "." not in rest and 0 < len(value) <= MAX_COMBINER_BYTES:
                self.combiners[rest] = bytes(value)     # checked whole when a combiner restores it
            else:
                raise ValueError(key)
        except ValueError:
            self.counters["malformed"] += 1
            return
        self.counters["heard"] += 1

    def silent(self, job: str, nodes) -> frozenset[str]:
        """The nodes of ``job`` not heard from within ``node_ttl_s`` (never heard: not silent yet, a
        node that has not started is waited for as before)."""
        now = self.clock()
        return frozenset(n for n in nodes if now - self._nodes.get((job, n), now) > self.node_ttl_s)


async def live_bucket(js, replicas: int = 1, ttl_s: float = 60.0):
    """The bucket (created when absent; its entries expire after ``ttl_s``)."""
    from nats.js.api import KeyValueConfig
    for attempt in range(40):                  # retried, bounded, while the cluster elects a leader
        try:
            return await js.create_key_value(KeyValueConfig(bucket=LIVE_BUCKET, ttl=ttl_s, history=1,
                                                            replicas=replicas))
        except Exception:  # noqa: BLE001 - exists with another config, or no leader yet
            try:
                return await js.key_value(LIVE_BUCKET)
            except Exception:  # noqa: BLE001
                if attempt == 39:
                    raise
                await asyncio.sleep(0.5)


async def watch(kv, live: Liveness, stop: Callable[[], bool], on_update: Callable[[], None] | None = None,
                stale_s: float = 1.0) -> None:
    """Feed every put of the bucket to ``live`` until ``stop()`` (and call ``on_update`` for each).
    A watcher that delivered nothing for ``stale_s`` (the shards' own beats come every 0.5 s) is
    recreated: after a server died its consumer is otherwise recreated by the client only when its
    idle heartbeats are missed, seconds later; a new watcher starts with every key's last value, of
    which only those newer than what was heard are fed (a dead shard's last beat must not revive it)."""
    watcher = await kv.watchall()
    heard = asyncio.get_running_loop().time()
    revisions: dict[str, int] = {}
    while not stop():
        if asyncio.get_running_loop().time() - heard > stale_s:
            heard = asyncio.get_running_loop().time()
            live.counters["rewatch"] = live.counters.get("rewatch", 0) + 1
            try:
                await asyncio.gather(watcher.stop(), return_exceptions=True)
                watcher = await asyncio.wait_for(kv.watchall(), max(5.0, stale_s))   # a loaded server is slow
            except Exception as ex:  # noqa: BLE001 - no leader yet: keep the old one, try again
                log.debug("liveness watcher: recreate: %r", ex)
        try:
            e = await watcher.updates(timeout=min(0.5, stale_s))
        except asyncio.TimeoutError:
            continue
        except Exception as ex:  # noqa: BLE001 - the watcher's server went away: keep trying
            log.warning("liveness watcher: %s", ex)
            await asyncio.sleep(0.5)
            continue
        if e is not None:
            heard = asyncio.get_running_loop().time()
        if e is not None and e.operation is None and e.key and (e.revision or 0) > revisions.get(e.key, 0):
            revisions[e.key] = e.revision or 0
            live.heard(e.key, e.value or b"")
            if on_update is not None:
                on_update()
    await watcher.stop()
