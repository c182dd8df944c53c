"""The central side of the tuner files on the bus (scaleout/tuner_bus.py): publishing each job's applied
versions, and knowing what the bus already holds.

:class:`TunerPublisher` publishes a job's file after each version its retuner writes (a failed publish is
retried next round; the message id ``<job>/tuner/<version>`` makes a retry of a stored one a no-op),
compare-and-set on the subject's last stream sequence as the mirror knows it: a shard that lost the
race (another shard stored a version meanwhile) is refused by the stream (``tuner_publish_conflicts``)
and its job's retuner is rebuilt from the bus's file (``on_conflict``), never storing a second
version N with other rules.
:class:`TunerMirror` keeps the latest file the bus holds per job (read at start, then every one published
by any shard): the job's version numbers belong to the job, not to the shard that wrote them. A shard that
takes a job over — after a failover, or from a shard on another machine — first writes the bus's file to
its own ``--tuner-config`` (``seed``), so its retuner continues above the nodes' version instead of
starting below it (the nodes would refuse every version until it caught up); a shard whose retuner is
behind the bus publishes nothing (``tuner_publish_stale``), since it would only roll the stream's last
value back for the nodes that start next.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Mapping

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.contracts.tuner_file import MAX_FILE_BYTES
from dynamiccl.nccl_tuner_plugin.config import format_configs, read_configs
from dynamiccl.scaleout.tuner_bus import (LIVE_PREFIX, TUNER_STREAM, Refused, parse_payload, stored_subject,
                                          tuner_headers, tuner_subject)

__all__ = ["TunerPublisher", "TunerMirror"]

log = logging.getLogger(__name__)

H_EXPECTED_SEQ = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = 10071          # JetStream's error code for a failed compare-and-set on the subject


class TunerMirror:
    """The newest tuner file the bus holds for each of ``jobs`` (validated as a node would)."""

    def __init__(self, jobs: Iterable[str], counters: dict[str, Any]):
        self.jobs, self.counters = frozenset(jobs), counters
        self.latest: dict[str, list] = {}
        self.seq: dict[str, int] = {}             # the stream sequence of each job's latest (0: none known)
        for k in ("mirror_refused", "seeded", "seed_errors"):
            counters.setdefault(f"tuner_{k}", 0)

    def version(self, job: str) -> int:
        return self.latest[job][-1].version if job in self.latest else 0

    def offer(self, subject: str, headers: Mapping[str, str] | None, data: bytes, seq: int | None = None) -> bool:
        """Keep the file if newer (``subject``: the one it was stored under; ``seq``: its stream sequence)."""
        job = subject.rpartition(".")[2]
        if job not in self.jobs:
            return False                          # another shard's jobs: not ours to continue
        try:
            configs = parse_payload(job, subject, headers, data)
        except Refused as e:
            self.counters["tuner_mirror_refused"] += 1
            log.warning("tuner file of job %s on the bus refused (%s): %s", job, e.reason, e)
            return False
        if seq is not None and seq >= self.seq.get(job, 0):
            self.seq[job] = seq
        if configs[-1].version < self.version(job) or configs == self.latest.get(job):
            return False
        self.latest[job] = configs
        return True

    async def start(self, nc, js, timeout_s: float = 1.0) -> None:
        """Every file published from now on, and the one each job already has (direct gets)."""
        async def deliver(m):                     # the stream's republish: only what it stored
            subject, seq = stored_subject(m.subject, m.headers)
            self.offer(subject, m.headers, m.data, seq)
        await nc.subscribe(f"{LIVE_PREFIX}.*", cb=deliver)
        for job in sorted(self.jobs):
            await self.refresh(js, job, timeout_s)

    async def refresh(self, js, job: str, timeout_s: float = 1.0) -> None:
        """The job's stored file, read now (a direct get)."""
        try:
            m = await asyncio.wait_for(js.get_last_msg(TUNER_STREAM, tuner_subject(job), direct=True), timeout_s)
        except Exception as e:  # noqa: BLE001 - none yet (not found) or not answered: the subscription follows
            log.debug("tuner file of job %s: %r", job, e)
            return
        self.offer(m.subject or "", m.headers, m.data or b"", m.seq)

    def seed(self, job: str, path: str) -> bool:
        """Write the bus's file for ``job`` to ``path`` when it is newer than what ``path`` holds; True if so."""
        configs = self.latest.get(job)
        if not configs:
            return False
        try:
            local = read_configs(path)
        except (OSError, ValueError, UnicodeDecodeError):
            local = []
        # the local copy stands only when it is ahead (applied here, not published yet) or the same file:
        # the same version with other rules is a race this shard lost at the stream, the bus's is the job's
        if local and (local[-1].version > configs[-1].version or local[-1] == configs[-1]):
            return False
        try:
            atomic_write(path, format_configs(configs))   # the nodes' file is the job's truth, not this copy
        except OSError as e:
            self.counters["tuner_seed_errors"] += 1
            log.error("tuner file of job %s not written to %s: %s", job, path, e)
            return False
        self.counters["tuner_seeded"] += 1
        log.info("job %s: continuing from the bus's tuner config version %d", job, configs[-1].version)
        return True


class TunerPublisher:
    """Each job's newest applied version, published once. ``pushers``: {job: the retuner's
    ``ConfigPusher``} (``dry_run``, ``version``, ``history``); ``mirror``: what the bus holds."""

    def __init__(self, js, counters: dict[str, Any], mirror: TunerMirror | None = None, timeout_s: float = 1.0,
                 on_conflict: Callable[[str], Any] | None = None):
        self.js, self.counters, self.mirror, self.timeout_s = js, counters, mirror, timeout_s
        self.on_conflict = on_conflict
        self.published: dict[str, int] = {}
        for k in ("published", "publish_errors", "publish_stale", "publish_conflicts", "oversize"):
            counters.setdefault(f"tuner_{k}", 0)

    def _behind(self, job: str, p) -> str | None:
        """"same" (the bus holds this version already), "stale" (the bus holds this version number or a
        later one from another shard) or None (publish)."""
        if self.mirror is None or self.mirror.version(job) < p.version:
            return None
        return "same" if self.mirror.latest[job][-1] == p.history[-1] else "stale"

    async def publish_due(self, pushers: Mapping[str, Any]) -> int:
        n = 0
        for job, p in sorted(pushers.items()):
            if p.dry_run or not p.history or p.version <= self.published.get(job, 0):
                continue
            data = format_configs(list(p.history)).encode()
            if len(data) > MAX_FILE_BYTES:            # the pusher's limits keep it below: never send what nodes refuse
                self.counters["tuner_oversize"] += 1
                self.published[job] = p.version
                continue
            behind = self._behind(job, p)
            if behind is not None:
                self.published[job] = p.version
                if behind == "stale":
                    await self._lost(job, p.version, "tuner_publish_stale")
                continue
            headers = tuner_headers(job, p.version)
            if self.mirror is not None:               # compare-and-set: stored only on the latest we know
                headers[H_EXPECTED_SEQ] = str(self.mirror.seq.get(job, 0))
            try:
                ack = await asyncio.wait_for(self.js.publish(tuner_subject(job), data, timeout=self.timeout_s,
                                                             headers=headers), self.timeout_s)
            except Exception as e:  # noqa: BLE001 - bus unavailable or refused: retried next round, counted
                if getattr(e, "err_code", None) == WRONG_LAST_SEQUENCE:
                    await self._lost(job, p.version)
                    continue
                self.counters["tuner_publish_errors"] += 1
                errors = self.counters["tuner_publish_errors"]
                if errors & (errors - 1) == 0:        # logged at 1, 2, 4, ... errors: retried every round
                    log.warning("tuner config version %d of job %s not published (%d errors): %r", p.version,
                                job, errors, e)
                continue
            self.published[job] = p.version
            self.counters["tuner_published"] += 1
            if self.mirror is not None:
                self.mirror.offer(tuner_subject(job), headers, data, getattr(ack, "seq", None))
            n += 1
        return n

    async def _lost(self, job: str, version: int, counter: str = "tuner_publish_conflicts") -> None:
        """Another shard stored a version of the job (known before publishing: ``stale``; refused by the
        stream's compare-and-set: ``conflicts``): read it, and let the job's retuner continue from it
        (``on_conflict``) instead of this shard's diverged versions."""
        self.counters[counter] += 1
        self.published[job] = version
        log.warning("job %s: another shard stored tuner config version %d first (%s); this shard's is not "
                    "published, the job's retuner continues from the bus's", job, version, counter)
        if self.mirror is not None:
            await self.mirror.refresh(self.js, job, self.timeout_s)
        if self.on_conflict is not None:
            self.on_conflict(job)
