"""Upload dashboards and regime-change annotations to an existing Grafana (grafana-client).

Calls (Grafana HTTP API): ``GET /api/folders/:uid`` then ``POST /api/folders`` if it is missing,
``POST /api/dashboards/db`` per dashboard (``overwrite: true``, ``folderUid``), and
``POST /api/annotations`` per regime change (organisation annotation tagged :data:`REGIME_TAG`, which
every generated dashboard's "Regime changes (pushed)" annotation query shows).

Every failure becomes one :class:`GrafanaError` whose message says what to fix (unreachable URL, bad
token, missing permission, rejected payload). :class:`Annotator` turns the detector's regime-change
stream into annotations and never stops on a Grafana error: it logs, counts and goes on.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import niquests
from grafana_client import GrafanaApi
from grafana_client.client import (GrafanaClientError, GrafanaException, GrafanaServerError, GrafanaTimeoutError,
                                   GrafanaUnauthorizedError)

from dashboards.names import FOLDER_TITLE, FOLDER_UID, REGIME_TAG

__all__ = ["GrafanaError", "connect", "push_dashboards", "regime_annotation", "add_annotation", "Annotator"]

log = logging.getLogger(__name__)


class GrafanaError(RuntimeError):
    """A Grafana call failed; the message is meant for the user."""


def _explain(exc: BaseException, url: str, what: str) -> GrafanaError:
    if isinstance(exc, GrafanaUnauthorizedError):
        return GrafanaError(f"{what}: Grafana at {url} rejected the token (401 Unauthorized): check --token "
                            f"(a service-account token, `glsa_...`)")
    if isinstance(exc, GrafanaClientError) and exc.status_code == 403:
        return GrafanaError(f"{what}: the token has no permission (403 Forbidden): give its service account "
                            f"the Editor role")
    if isinstance(exc, GrafanaClientError):
        return GrafanaError(f"{what}: Grafana at {url} rejected the request ({exc.status_code}): {exc.message}")
    if isinstance(exc, GrafanaServerError):
        return GrafanaError(f"{what}: Grafana at {url} failed ({exc.status_code}): {exc.message}")
    if isinstance(exc, GrafanaTimeoutError):
        return GrafanaError(f"{what}: Grafana at {url} did not answer in time")
    if isinstance(exc, (GrafanaException, niquests.exceptions.RequestException, OSError)):
        return GrafanaError(f"{what}: cannot reach Grafana at {url}: {exc}")
    return GrafanaError(f"{what}: {exc}")


@dataclass
class Grafana:
    api: GrafanaApi
    url: str

    def call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (GrafanaException, niquests.exceptions.RequestException, OSError) as exc:
            raise _explain(exc, self.url, what) from None


def connect(url: str, token: str | None, *, timeout: float = 10.0) -> Grafana:
    """A client for ``url`` (``http(s)://host:port[/prefix]``) with a bearer token (or user:pass in the URL)."""
    if not url or "://" not in url:
        raise GrafanaError(f"--url: expected http(s)://HOST:PORT, got {url!r}")
    if token is not None and not token.strip():
        raise GrafanaError("--token is empty")
    return Grafana(GrafanaApi.from_url(url, credential=token, timeout=timeout), url)


def ensure_folder(g: Grafana, uid: str = FOLDER_UID, title: str = FOLDER_TITLE) -> dict:
    try:
        return g.api.folder.get_folder(uid)
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise _explain(exc, g.url, f"folder {uid}") from None
    except (GrafanaException, niquests.exceptions.RequestException, OSError) as exc:
        raise _explain(exc, g.url, f"folder {uid}") from None
    return g.call(f"create folder {uid}", g.api.folder.create_folder, title, uid=uid)


def push_dashboards(g: Grafana, dashboards: Mapping[str, dict], *, folder_uid: str = FOLDER_UID,
                    folder_title: str = FOLDER_TITLE, message: str = "dynamiccl dashboards push") -> list[dict]:
    """Create the folder if needed and upload every dashboard (by uid, overwriting). Returns Grafana's answers."""
    ensure_folder(g, folder_uid, folder_title)
    out = []
    for name, dash in dashboards.items():
        body = {"dashboard": {**dash, "id": None}, "folderUid": folder_uid, "overwrite": True, "message": message}
        out.append(g.call(f"dashboard {name}", g.api.dashboard.update_dashboard, body))
    return out


def regime_annotation(rc: Any) -> dict:
    """Annotation fields for a ``detector.events.RegimeChange`` (or its dict): a region from the estimated
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
    res = g.call("annotation", g.api.annotations.add_annotation, **a)
    return int(res.get("id", 0)) if isinstance(res, dict) else 0


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
        import json
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
