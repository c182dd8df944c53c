"""Per-job tokens on the record stream.

A sender that has a token starts its connection with an auth preamble, before the first frame
(the frame and record layout of dynamiccl/collector/wire_format.py is unchanged)::

    u32 magic "DCAU" (0x55414344, little endian) | u16 version (1) | u16 length | token (length bytes)

The collector's tokens file has one entry a line, ``TOKEN`` (any job) or ``JOB_ID TOKEN`` (that
job only; its PROCESS record must name it); ``#`` starts a comment. The file must belong to the
collector's user and not be readable by group or others (like an ssh key). With a tokens file,
every connection must authenticate (Unix-socket peers too unless ``auth_unix`` is off): a missing,
wrong or misused token closes the connection, is counted
(``connections_refused_total{reason="auth"}``) and logged at most once a minute. Without one,
no peer is authenticated and a preamble, if sent, is skipped.

Senders read their token from the file named by ``DYNAMICCL_TOKEN_FILE`` or from
``DYNAMICCL_TOKEN`` (never from a command line: argv is visible to every user).
"""
from __future__ import annotations

import hmac
import os
import stat
import struct

__all__ = ["AUTH_MAGIC", "encode_preamble", "parse_preamble", "TokenTable", "sender_token", "NeedMore"]

AUTH_MAGIC = 0x55414344
AUTH_VERSION = 1
_PRE = struct.Struct("<IHH")
MAX_TOKEN = 512


class NeedMore(Exception):
    """The preamble is not complete yet."""


def encode_preamble(token: str) -> bytes:
    raw = token.encode()
    if not 0 < len(raw) <= MAX_TOKEN:
        raise ValueError(f"token must be 1..{MAX_TOKEN} bytes")
    return _PRE.pack(AUTH_MAGIC, AUTH_VERSION, len(raw)) + raw


def parse_preamble(buf) -> tuple[int, bytes | None]:
    """(bytes consumed, token) if ``buf`` starts with a preamble, (0, None) if it starts with
    something else; raises NeedMore if it is incomplete, ValueError if it is malformed."""
    if len(buf) < 4:
        raise NeedMore
    if struct.unpack_from("<I", buf, 0)[0] != AUTH_MAGIC:
        return 0, None
    if len(buf) < _PRE.size:
        raise NeedMore
    _magic, version, length = _PRE.unpack_from(buf, 0)
    if version != AUTH_VERSION or not 0 < length <= MAX_TOKEN:
        raise ValueError(f"bad auth preamble (version {version}, token length {length})")
    if len(buf) < _PRE.size + length:
        raise NeedMore
    return _PRE.size + length, bytes(buf[_PRE.size:_PRE.size + length])


def _check_private(path: str, what: str) -> None:
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise PermissionError(f"{what} {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(f"{what} {path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                              "chmod 600 it")


class TokenTable:
    """Accepted tokens → the job each may speak for (None: any job)."""

    def __init__(self, entries: dict[bytes, str | None]):
        if not entries:
            raise ValueError("a tokens file must hold at least one token")
        self._entries = list(entries.items())

    @classmethod
    def load(cls, path: str) -> "TokenTable":
        _check_private(path, "tokens file")
        entries: dict[bytes, str | None] = {}
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                parts = line.split("#", 1)[0].split()
                if not parts:
                    continue
                if len(parts) > 2 or len(parts[-1].encode()) > MAX_TOKEN:
                    raise ValueError(f"{path}:{n}: expected TOKEN or JOB_ID TOKEN")
                entries[parts[-1].encode()] = parts[0] if len(parts) == 2 else None
        return cls(entries)

    def check(self, token: bytes | None) -> tuple[bool, str | None]:
        """(accepted, job the token is bound to); compares against every entry in constant time."""
        ok, job = False, None
        for known, bound in self._entries:
            if token is not None and hmac.compare_digest(known, token):
                ok, job = True, bound
        return ok, job


def sender_token(env=os.environ) -> str | None:
    """A sender's token: the file named by DYNAMICCL_TOKEN_FILE (checked private), else DYNAMICCL_TOKEN."""
    path = env.get("DYNAMICCL_TOKEN_FILE")
    if path:
        _check_private(path, "DYNAMICCL_TOKEN_FILE")
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise ValueError(f"DYNAMICCL_TOKEN_FILE {path} is empty")
        return token
    return env.get("DYNAMICCL_TOKEN") or None
