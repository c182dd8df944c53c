"""Who may publish what on the bus: one NATS user per node collector and per central shard, each
with publish permissions on its own subjects only, enforced by ``nats-server`` (docs/scale-out.md).

A node ``<node>`` of job ``<job>`` may publish its partials on ``dynamiccl.partials.<job>.<node>`` (and
``.<p>`` below it, a job split by communicator) and
its heartbeat on ``$KV.DYNAMICCL_LIVE.node.<job>.<node>``, read the bucket's stream info, and receive
replies on its own inbox ``_INBOX.node.<job>.<node>.>``, and read its own job's tuner file
(``dynamiccl.tunerlive.<job>``, the stream's republish, and a direct get of ``dynamiccl.tuner.<job>``); nothing else (no stream or
consumer API, so it can neither create, read nor delete what others published, nor publish a tuner
file). A shard may use the JetStream API of the three streams, acknowledge partials, write its own
heartbeat and the jobs' (and partitions') checkpoints, publish the jobs' tuner files and the partitions'
regime changes to their job's combiner (``dynamiccl.changes.<job>``); it may publish no partial. The server rejects anything else (``Permissions Violation``) and a connection
without a known user (``Authorization Violation``); the clients count both.

Secrets never travel on the command line nor into logs: each client reads its user and password
from a file given by path (mode 0600, refused otherwise), and :func:`write_auth` writes the server's
``authorization`` block and one such file per user, keeping the passwords of users it already wrote
(adding a node does not invalidate the others; reload the server with ``nats-server --signal reload``).
"""
from __future__ import annotations

import json
import secrets
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import yaml

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.scaleout.bus import subject
from dynamiccl.scaleout.liveness import LIVE_BUCKET, ckpt_key, comb_key, node_key, shard_key

__all__ = ["NatsCredentials", "load_credentials", "node_user", "shard_user", "inbox_of", "node_permissions",
           "shard_permissions", "server_authorization", "write_auth", "classify_refusal", "AUTH_CONF"]

AUTH_CONF = "nats-auth.conf"
_STREAM = "DYNAMICCL_PARTIALS"            # nats_bus.STREAM (not imported: nats-py stays optional here)
_KV_STREAM = f"KV_{LIVE_BUCKET}"
# tuner_bus's stream, publish subjects and the stream's republish of what it stored (nats-py stays optional here)
_TUNER_STREAM, _TUNER_PREFIX, _TUNER_LIVE = "DYNAMICCL_TUNER", "dynamiccl.tuner", "dynamiccl.tunerlive"
_CHANGES = "dynamiccl.changes"            # combiner.CHANGES_PREFIX: partitions' changes to their job's combiner


@dataclass(frozen=True)
class NatsCredentials:
    """A user and its password, read from a file; the password never appears in a repr or a log."""
    user: str
    password: str

    def __repr__(self) -> str:
        return f"NatsCredentials(user={self.user!r}, password=<hidden>)"

    def connect_kwargs(self) -> dict:
        """nats-py ``connect`` arguments: the user's own inbox, the only one it may subscribe to."""
        return {"user": self.user, "password": self.password, "inbox_prefix": inbox_of(self.user)}


def node_user(job: str, node: str) -> str:
    """>>> node_user("j1", "n0")
    'node.j1.n0'"""
    subject(job, node)                    # both are subject tokens (ValueError naming the bad one)
    return f"node.{job}.{node}"


def shard_user(shard: str) -> str:
    subject(shard, "x")
    return f"shard.{shard}"


def inbox_of(user: str) -> str:
    """A user's reply subjects; user names are dot-joined subject tokens, so this is a subject."""
    return f"_INBOX.{user}"


def node_permissions(job: str, node: str) -> dict:
    """Its own subjects; of the tuner stream only a direct get of its own job's file and the live
    subject of it (another job's file stays unreadable; nothing of it is writable)."""
    return {"publish": {"allow": [subject(job, node), f"{subject(job, node)}.*",    # whole, or per partition
                                  f"$KV.{LIVE_BUCKET}.{node_key(job, node)}",
                                  f"$JS.API.STREAM.INFO.{_KV_STREAM}",
                                  f"$JS.API.DIRECT.GET.{_TUNER_STREAM}.{_TUNER_PREFIX}.{job}"]},
            "subscribe": {"allow": [f"{inbox_of(node_user(job, node))}.>", f"{_TUNER_LIVE}.{job}"]}}


def shard_permissions(shard: str) -> dict:
    api = [f"$JS.API.{verb}.{s}" for s in (_STREAM, _KV_STREAM, _TUNER_STREAM) for verb in ("STREAM.CREATE", "STREAM.INFO")]
    api.append(f"$JS.API.STREAM.UPDATE.{_TUNER_STREAM}")      # its configuration moves with the release
    consumers = [f"$JS.API.CONSUMER.{pat}.{s}{tail}" for s in (_STREAM, _KV_STREAM) for pat in ("*", "*.*")
                 for tail in ("", ".>")]   # CREATE.<stream>[.<name>.<filter>], DURABLE.CREATE.<stream>.<name>, MSG.NEXT...
    return {"publish": {"allow": ["$JS.API.INFO", *api, *consumers, f"$JS.ACK.{_STREAM}.>", "$JS.FC.>",
                                  f"$KV.{LIVE_BUCKET}.{shard_key(shard)}", f"$KV.{LIVE_BUCKET}.{ckpt_key('*')}",
                                  f"$KV.{LIVE_BUCKET}.{ckpt_key('*.*')}",    # a communicator partition's
                                  f"$KV.{LIVE_BUCKET}.{comb_key('*')}",      # a partitioned job's combiner
                                  f"{_TUNER_PREFIX}.*", f"$JS.API.DIRECT.GET.{_TUNER_STREAM}.>", f"{_CHANGES}.*"]},
            "subscribe": {"allow": [f"{inbox_of(shard_user(shard))}.>", f"{_TUNER_LIVE}.*", f"{_CHANGES}.*"]}}


def server_authorization(jobs: Mapping[str, frozenset[str]], shards: list[str], passwords: Mapping[str, str]) -> str:
    """The ``authorization`` block of nats-server's configuration (its format reads JSON), one user per
    node of each job and per shard, with ``passwords[user]``."""
    users = [{"user": node_user(j, n), "password": passwords[node_user(j, n)], "permissions": node_permissions(j, n)}
             for j in sorted(jobs) for n in sorted(jobs[j])]
    users += [{"user": shard_user(s), "password": passwords[shard_user(s)], "permissions": shard_permissions(s)}
              for s in sorted(shards)]
    return "authorization: " + json.dumps({"users": users}, indent=1) + "\n"


def write_auth(out: Path, jobs: Mapping[str, frozenset[str]], shards: list[str],
               new_secret: Callable[[], str] = lambda: secrets.token_urlsafe(32)) -> dict[str, Path]:
    """``out/nats-auth.conf`` (include it in nats-server's configuration) and ``out/<user>.yaml`` per
    user (give each to its node or shard only); returns {user: its file}. A user whose file exists
    keeps its password."""
    if not shards or not jobs:
        raise ValueError("nats-auth: at least one --job and one --shard")
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    users = [node_user(j, n) for j in jobs for n in jobs[j]] + [shard_user(s) for s in shards]
    files = {u: out / f"{u}.yaml" for u in users}
    passwords = {u: load_credentials(p).password if p.exists() else new_secret() for u, p in files.items()}
    for u, p in files.items():
        atomic_write(p, yaml.safe_dump({"user": u, "password": passwords[u]}), mode=0o600)
    atomic_write(out / AUTH_CONF, server_authorization(jobs, shards, passwords), mode=0o600)
    return files


def load_credentials(path: str | Path) -> NatsCredentials:
    """The user and password of ``path`` (YAML: ``user``, ``password``); ValueError naming what is
    wrong: absent, readable by others, or not that mapping. The message never holds the secret."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise ValueError(f"nats.credentials {str(p)!r}: {e.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"nats.credentials {str(p)!r}: readable by group or others "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}): chmod 600")
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        raise ValueError(f"nats.credentials {str(p)!r}: not a readable YAML file") from None
    if (not isinstance(doc, dict) or set(doc) != {"user", "password"}
            or not all(isinstance(doc[k], str) and doc[k] for k in doc)):
        raise ValueError(f"nats.credentials {str(p)!r}: a mapping of exactly 'user' and 'password' (strings)")
    if not all(t and "*" not in t and ">" not in t for t in doc["user"].split(".")) or " " in doc["user"]:
        raise ValueError(f"nats.credentials {str(p)!r}: user {doc['user']!r} is not dot-joined subject tokens")
    return NatsCredentials(doc["user"], doc["password"])


# the server's two refusals, as nats-py reports them to the error callback (lower-cased)
_REFUSALS = {"authorization violation": "auth_refused", "permissions violation for subscription": "subscribe_refused",
             "permissions violation": "publish_refused"}


def classify_refusal(exc: BaseException) -> str | None:
    """``auth_refused``, ``subscribe_refused``, ``publish_refused``, ``tls_refused`` (the TLS handshake
    failed: a certificate not trusted, none presented, a peer that is not TLS) or None (another error)."""
    if isinstance(exc, ssl.SSLError):
        return "tls_refused"
    text = f"{type(exc).__name__} {exc}".lower()
    if type(exc).__name__ == "AuthorizationError":
        return "auth_refused"
    return next((k for s, k in _REFUSALS.items() if s in text), None)

