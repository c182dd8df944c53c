"""The applied tuner config, from the central tier to every node of the job over the bus.

The tuner plugin reads a local file; a job past one machine often has no shared file system. So the
central retuner's file travels over NATS: after each version it applies (or rolls back to, which is a
new version too) the shard publishes the whole file (:func:`~dynamiccl.nccl_tuner_plugin.config.format_configs`
of the pusher's history: its last versions, format 2 with its CRC trailer) on ``dynamiccl.tuner.<job>``.
The stream ``DYNAMICCL_TUNER`` keeps one message per subject (the latest version of each job), so a
node that starts or reconnects after the apply reads it (a direct get of the subject's last message).
The stream republishes each message it *stored* on ``dynamiccl.tunerlive.<job>``, where nodes listen
for the versions published while they run: a publish the stream refused (below) reaches no node, as
it would on the publish subject itself. Publishes are compare-and-set on the subject's last stream
sequence (``Nats-Expected-Last-Subject-Sequence``), so two shards that both believe they own a job
for a moment cannot both store a version N with different rules: one is refused, and that shard's
retuner is rebuilt from the bus's file (scaleout/tuner_publish.py).

Each node (:class:`TunerSink`) writes the file atomically where its ranks' tuner plugin reads it, after
checking what it received: size (``MAX_FILE_BYTES``), the subject and the ``Dynamiccl-Job`` header
name its job, the text parses with the plugin's own parser, the header's version is the file's newest,
that version is newer than the one the node last wrote, and no version number is reused with other
rules. The payload is written only whole and only when all of that holds; every refusal is counted
by reason (``tuner_refused_<reason>``) and the file stays as it was. Since every node writes the same
bytes, the plugin's agreement step (the MIN over ranks of the staged versions; a file keeps the last
8) switches every rank of the job consistently, as with a shared file.

Who may do what is the server's to enforce (scaleout/auth.py): only shard users publish on
``dynamiccl.tuner.*``; nobody publishes on ``dynamiccl.tunerlive.*`` (the server's republish does); a
node user may read (subscribe to the live subject, direct get) only its own job's file.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

from dynamiccl.contracts.tuner_file import HEADER, MAX_FILE_BYTES
from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.nccl_tuner_plugin.config import parse_configs, read_configs
from dynamiccl.scaleout.bus import token

__all__ = ["TUNER_STREAM", "TUNER_PREFIX", "LIVE_PREFIX", "H_JOB", "H_VERSION", "REFUSALS", "Refused",
           "tuner_subject", "live_subject", "stored_subject", "tuner_headers", "parse_payload", "TunerSink",
           "ensure_tuner_stream", "fetch_latest"]

log = logging.getLogger(__name__)

TUNER_STREAM = "DYNAMICCL_TUNER"
TUNER_PREFIX = "dynamiccl.tuner"
LIVE_PREFIX = "dynamiccl.tunerlive"      # the stream's republish of what it stored (not in its subjects)
H_JOB = "Dynamiccl-Job"
H_VERSION = "Dynamiccl-Tuner-Version"
STREAM_EXISTS_OTHERWISE = 10058          # JetStream: "stream name already in use with a different configuration"
# why a node refuses a payload (each counted as ``tuner_refused_<reason>``)
REFUSALS = ("oversize", "wrong_job", "malformed", "older_version", "version_reused", "write_failed")


def tuner_subject(job: str) -> str:
    """>>> tuner_subject("j1")
    'dynamiccl.tuner.j1'"""
    return f"{TUNER_PREFIX}.{token('job', job)}"


def live_subject(job: str) -> str:
    return f"{LIVE_PREFIX}.{token('job', job)}"


def stored_subject(subject: str, headers: Mapping[str, str] | None) -> tuple[str, int | None]:
    """The subject a message was stored under, and its stream sequence: a republished message (on
    ``dynamiccl.tunerlive.*``, which only the server publishes) carries both in its headers."""
    h = headers or {}
    if not subject.startswith(LIVE_PREFIX + "."):
        return subject, None
    seq = h.get("Nats-Sequence", "")
    return h.get("Nats-Subject", ""), int(seq) if seq.isdigit() else None


def tuner_headers(job: str, version: int) -> dict[str, str]:
    return {H_JOB: job, H_VERSION: str(version), "Nats-Msg-Id": f"{job}/tuner/{version}"}


class Refused(Exception):
    """A payload not written, and why (one of :data:`REFUSALS`)."""
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def parse_payload(job: str, subject: str, headers: Mapping[str, str] | None, data: bytes) -> list:
    """The versions of a tuner file received for ``job``, or :class:`Refused` naming why not: larger
    than a tuner file may be, on another job's subject or naming another job, not a file the plugin's
    parser accepts as format 2 (the CRC trailer: nothing cut short), or a version header that is not the
    file's newest."""
    headers = headers or {}
    if len(data) > MAX_FILE_BYTES:
        raise Refused("oversize", f"{len(data)} bytes, a tuner file holds at most {MAX_FILE_BYTES}")
    if subject != tuner_subject(job) or headers.get(H_JOB) != job:
        raise Refused("wrong_job", f"subject {subject!r}, job header {headers.get(H_JOB)!r}")
    if not data.startswith(HEADER.encode() + b"\n"):
        raise Refused("malformed", "not a format-2 tuner file (its header and CRC trailer are required)")
    try:
        configs = parse_configs(data.decode("utf-8"), f"bus:{subject}")
    except (UnicodeDecodeError, ValueError) as e:
        raise Refused("malformed", str(e)[:200]) from None
    if not configs or headers.get(H_VERSION) != str(configs[-1].version):
        raise Refused("malformed", f"version header {headers.get(H_VERSION)!r} is not the file's newest "
                                   f"({configs[-1].version if configs else 'none'})")
    return configs


class TunerSink:
    """One node's tuner file: validated payloads in, atomic writes out, refusals counted in ``counters``.

    ``offer`` returns ``"written"``, ``"current"`` (the version it already wrote: a repeated delivery,
    not a refusal) or the refusal's reason. The version it compares with is the newest in the file at
    start-up (0 when absent or unreadable), then the newest it wrote."""

    def __init__(self, job: str, path: str, counters: dict[str, Any]):
        self.job, self.path, self.counters = job, path, counters
        self.subject, self.live = tuner_subject(job), live_subject(job)
        self.fetched_seq: int | None = None     # the stream sequence of the last message read by a direct get
        for k in ("received", "written", "current", "fetch_errors", *(f"refused_{r}" for r in REFUSALS)):
            counters.setdefault(f"tuner_{k}", 0)
        try:
            self.configs = read_configs(path)
        except (OSError, ValueError, UnicodeDecodeError):
            self.configs = []            # absent or unreadable: any valid version replaces it
        counters["tuner_version"] = self.version

    @property
    def version(self) -> int:
        return self.configs[-1].version if self.configs else 0

    def offer(self, subject: str, headers: Mapping[str, str] | None, data: bytes) -> str:
        self.counters["tuner_received"] += 1
        try:
            configs = self._check(subject, headers or {}, data)
            if self.configs and configs[-1] == self.configs[-1]:
                self.counters["tuner_current"] += 1
                return "current"
            self._write(data)
        except Refused as e:
            self.counters[f"tuner_refused_{e.reason}"] += 1
            n = sum(self.counters[f"tuner_refused_{r}"] for r in REFUSALS)
            if n & (n - 1) == 0:                  # logged at 1, 2, 4, 8, ... refusals: never a flood
                log.warning("tuner config for job %s refused (%s): %s; %s keeps version %d (%d refused so far)",
                            self.job, e.reason, e, self.path, self.version, n)
            return e.reason
        self.configs = configs
        self.counters["tuner_written"] += 1
        self.counters["tuner_version"] = self.version
        log.info("tuner config version %d of job %s written to %s", self.version, self.job, self.path)
        return "written"

    def _check(self, subject: str, headers: Mapping[str, str], data: bytes) -> list:
        """The payload's versions, refused when older than the file's newest or when a version number
        the file holds comes with other rules (ranks that read the old file would apply other rules
        under the same number: the rule of ``write_configs``)."""
        configs = parse_payload(self.job, subject, headers, data)
        if configs[-1].version < self.version:
            raise Refused("older_version", f"version {configs[-1].version} is older than {self.version}")
        held = {c.version: c for c in self.configs}
        reused = [c.version for c in configs if held.get(c.version, c) != c]
        if reused:
            raise Refused("version_reused", f"version {reused[0]} again, with other rules")
        return configs

    def _write(self, data: bytes) -> None:
        """The bytes received, checked above (format 2: the plugin refuses a torn copy by its trailer)."""
        try:
            atomic_write(self.path, data)
        except OSError as e:
            raise Refused("write_failed", f"{self.path}: {e.strerror or e}") from None


async def fetch_latest(js, sink: TunerSink, timeout_s: float = 1.0) -> str | None:
    """The job's last published file (a direct get: the one request a node user may make of the
    stream), offered to ``sink``; None when there is none yet or the bus did not answer (counted)."""
    import nats.js.errors
    try:
        m = await asyncio.wait_for(js.get_last_msg(TUNER_STREAM, sink.subject, direct=True), timeout_s)
    except nats.js.errors.NotFoundError:
        return None                       # nothing applied yet
    except Exception as e:  # noqa: BLE001 - no stream yet, no responders, timeout: retried next round
        sink.counters["tuner_fetch_errors"] += 1
        log.debug("tuner config of job %s: %r", sink.job, e)
        return None
    if m.seq is not None and m.seq == sink.fetched_seq:
        return None                       # the stored message already offered (counted once, not per read)
    sink.fetched_seq = m.seq
    return sink.offer(m.subject or "", m.headers, m.data or b"")


async def ensure_tuner_stream(js, replicas: int = 1):
    """The last-value stream of the jobs' tuner files: one message per subject, direct gets allowed,
    each stored message republished on ``dynamiccl.tunerlive.<job>``."""
    from nats.js.api import StreamConfig
    from nats.js.api import RePublish
    cfg = StreamConfig(name=TUNER_STREAM, subjects=[f"{TUNER_PREFIX}.*"], num_replicas=replicas,
                       max_msgs_per_subject=1, allow_direct=True, max_msg_size=MAX_FILE_BYTES + 4096,
                       duplicate_window=120.0,
                       republish=RePublish(src=f"{TUNER_PREFIX}.*", dest=f"{LIVE_PREFIX}.{{{{wildcard(1)}}}}"))
    for _ in range(60):                  # the cluster elects a meta leader first
        try:
            return await js.add_stream(cfg)
        except Exception as e:  # noqa: BLE001 - not ready yet: retry, bounded
            if getattr(e, "err_code", None) == STREAM_EXISTS_OTHERWISE:
                return await js.update_stream(cfg)     # an older release's or other replicas: brought to this one
            await asyncio.sleep(0.5)
    return await js.add_stream(cfg)
