"""Upload dashboards and regime-change annotations to an existing Grafana (a small stdlib HTTP client).

Calls (Grafana HTTP API): ``GET /api/folders/:uid`` then ``POST /api/folders`` if it is missing,
``POST /api/dashboards/db`` per dashboard (``overwrite: true``, ``folderUid``), and
``POST /api/annotations`` per regime change (organisation annotation tagged :data:`REGIME_TAG`, which
every generated dashboard's "Regime changes (pushed)" annotation query shows).

Every failure becomes one :class:`GrafanaError` whose message says what to fix (unreachable URL, bad
token, missing permission, rejected payload). :class:`Annotator` turns the detector's regime-change
stream into annotations and never stops on a Grafana error: it logs, counts and goes on.

The client is ``urllib.request``: four JSON calls need no third-party package, and the maintained Grafana
client library pulls an HTTP stack (niquests, urllib3-future) whose ``.pth`` hook replaces ``urllib3`` in the
environment it is installed into — a training environment must never get that.
"""
from __future__ import annotations

import base64
import functools
import json
import os
import logging
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from dynamiccl.dashboards.names import FOLDER_TITLE, FOLDER_UID, REGIME_TAG

__all__ = ["GrafanaError", "connect", "push_dashboards", "regime_annotation", "add_annotation", "annotation_sink",
           "Annotator"]

log = logging.getLogger(__name__)


class GrafanaError(RuntimeError):
    """A Grafana call failed; the message is meant for the user."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status          # the HTTP status Grafana answered, None when it did not answer


def _message(body: bytes) -> str:
    try:
        d = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace")
    return str(d.get("message", d)) if isinstance(d, dict) else str(d)


def _explain_status(code: int, message: str, url: str, what: str) -> GrafanaError:
    if code == 401:
        return GrafanaError(f"{what}: Grafana at {url} rejected the token (401 Unauthorized): check --token "
                            f"(a service-account token, `glsa_...`)", code)
    if code == 403:
        return GrafanaError(f"{what}: the token has no permission (403 Forbidden): give its service account "
                            f"the Editor role", code)
    if code < 500:
        return GrafanaError(f"{what}: Grafana at {url} rejected the request ({code}): {message}", code)
    return GrafanaError(f"{what}: Grafana at {url} failed ({code}): {message}", code)


@dataclass
class Grafana:
    url: str                       # base URL without credentials, no trailing slash
    authorization: str | None      # the Authorization header value
    timeout: float

    def request(self, what: str, method: str, path: str, body: Any = None) -> Any:
        """One JSON call; any failure is a :class:`GrafanaError` naming ``what``."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Accept": "application/json"})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.authorization:
            req.add_header("Authorization", self.authorization)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise _explain_status(exc.code, _message(exc.read()), self.url, what) from None
        except (TimeoutError, socket.timeout):
            raise GrafanaError(f"{what}: Grafana at {self.url} did not answer in time") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise GrafanaError(f"{what}: Grafana at {self.url} did not answer in time") from None
            raise GrafanaError(f"{what}: cannot reach Grafana at {self.url}: {reason}") from None
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise GrafanaError(f"{what}: Grafana at {self.url} answered something that is not JSON") from None


def redact(url: str | None) -> str | None:
    """``url`` with any password replaced by ``***``: what may be printed or logged."""
    if not url or "@" not in url:
        return url
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urllib.parse.urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def read_token_file(path: str) -> str:
    """A token from a file that is this user's and not readable by group or others (like an ssh key)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise GrafanaError(f"token file {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise GrafanaError(f"token file {path} must belong to this user and not be readable by group or "
                               f"others (chmod 600); mode {st.st_mode & 0o777:o}, uid {st.st_uid}")
        token = f.read(4096).strip()
    if not token:
        raise GrafanaError(f"token file {path} is empty")
    return token


def connect(url: str, token: str | None, *, timeout: float = 10.0) -> Grafana:
    """A client for ``url`` (``http(s)://host:port[/prefix]``) with a bearer token (or user:pass in the URL)."""
    if not url or "://" not in url:
        raise GrafanaError(f"--url: expected http(s)://HOST:PORT, got {redact(url)!r}")
    if token is not None and not token.strip():
        raise GrafanaError("--token is empty")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GrafanaError(f"--url: expected http(s)://HOST:PORT, got {redact(url)!r}")
    auth = None
    if token is not None:
        auth = f"Bearer {token}"
    elif parts.username is not None:
        user_pass = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(user_pass.encode()).decode()
    netloc = parts.netloc.rpartition("@")[2]
    base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return Grafana(base, auth, timeout)


def ensure_folder(g: Grafana, uid: str = FOLDER_UID, title: str = FOLDER_TITLE) -> dict:
    path = f"/api/folders/{urllib.parse.quote(uid, safe='')}"
    try:
        return g.request(f"folder {uid}", "GET", path)
    except GrafanaError as exc:
        if exc.status != 404:
            raise
    return g.request(f"create folder {uid}", "POST", "/api/folders", {"title": title, "uid": uid})


def push_dashboards(g: Grafana, dashboards: Mapping[str, dict], *, folder_uid: str = FOLDER_UID,
                    folder_title: str = FOLDER_TITLE, message: str = "dynamiccl dashboards push") -> list[dict]:
    """Create the folder if needed and upload every dashboard (by uid, overwriting). Returns Grafana's answers."""
    ensure_folder(g, folder_uid, folder_title)
    out = []
    for name, dash in dashboards.items():
        body = {"dashboard": {**dash, "id": None}, "folderUid": folder_uid, "overwrite": True, "message": message}
        out.append(g.request(f"dashboard {name}", "POST", "/api/dashboards/db", body))
    return out


def regime_annotation(rc: Any) -> dict:
    """Annotation fields for a ``dynamiccl.detector.events.RegimeChange`` (or its dict): a region from the estimated
    onset to the detection, tagged ``regime-change``, the kind, the job and the communicators.

    >>> a = regime_annotation({"id": "rc-j-1", "kind": "bandwidth", "job_id": "j", "start_s": 10.0,
    ...                        "detected_s": 11.5, "magnitude": 2.0, "comm_names": ["dp0"], "hosts": ["n1"]})
    >>> a["time_from"], a["time_to"], a["tags"]
    (10000, 11500, ['regime-change', 'bandwidth', 'job:j', 'comm:dp0'])
    >>> a["text"]
    'bandwidth regime change rc-j-1 in job j: latency x2.00 on dp0; hosts n1'
    """
    d = rc if isinstance(rc, Mapping) else rc.__dict__
    try:
        kind, job, start, det, mag = d["kind"], d["job_id"], float(d["start_s"]), float(d["detected_s"]), \
            float(d["magnitude"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"regime change: missing or invalid field ({exc})") from None
    comms = list(d.get("comm_names") or d.get("comms") or [])
    where = []
    if d.get("ranks"):
        where.append("ranks " + ",".join(map(str, d["ranks"][:8])))
    if d.get("hosts"):
        where.append("hosts " + ",".join(map(str, d["hosts"][:8])))
    text = f"{kind} regime change {d.get('id', '')} in job {job}: latency x{mag:.2f}"
    if comms:
        text += f" on {','.join(comms[:8])}"
    if where:
        text += "; " + "; ".join(where)
    if d.get("recovers"):
        text += f" (ends {d['recovers']})"
    return {"time_from": int(round(start * 1000)), "time_to": int(round(max(det, start) * 1000)),
            "tags": [REGIME_TAG, kind, f"job:{job}", *(f"comm:{c}" for c in comms[:8])], "text": text}


def add_annotation(g: Grafana, rc: Any) -> int:
    """POST one regime change as an organisation annotation; returns its id."""
    a = regime_annotation(rc)
    body = {"time": a["time_from"], "timeEnd": a["time_to"], "tags": a["tags"], "text": a["text"]}
    res = g.request("annotation", "POST", "/api/annotations", body)
    return int(res.get("id", 0)) if isinstance(res, dict) else 0


def annotation_sink(url: str, token: str | None, *, timeout: float = 10.0):
    """``sink(rc)`` posts one regime change as an annotation on ``url``'s Grafana (raises on failure: the caller
    counts). What ``dynamiccl detector run --grafana-url`` hands the detector service. GrafanaError for a bad URL."""
    return functools.partial(add_annotation, connect(url, token, timeout=timeout))


class Annotator:
    """Regime changes → Grafana annotations, never raising: errors are logged (first of a kind at WARNING)
    and counted. ``handle(line)`` takes one NDJSON line of the detector's stream."""

    def __init__(self, g: Grafana):
        self.g = g
        self.posted = 0
        self.failed = 0
        self.malformed = 0
        self._lock = threading.Lock()
        self._last_error: str | None = None

    def handle(self, line: str | bytes) -> bool:
        try:
            rc = json.loads(line)
            if not isinstance(rc, dict):
                raise ValueError("not a JSON object")
            regime_annotation(rc)
        except ValueError as exc:
            with self._lock:
                self.malformed += 1
            log.warning("annotate: skipped a malformed regime change: %s", exc)
            return False
        try:
            add_annotation(self.g, rc)
        except GrafanaError as exc:
            with self._lock:
                self.failed += 1
                first = str(exc) != self._last_error
                self._last_error = str(exc)
            (log.warning if first else log.debug)("annotate: %s (the stream keeps going)", exc)
            return False
        with self._lock:
            self.posted += 1
        return True

    def run(self, lines: Iterable[str | bytes]) -> None:
        for line in lines:
            if line.strip():
                self.handle(line)
