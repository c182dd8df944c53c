"""Files a run directory may hold next to its parquet history, and their readers.

A *run directory* is the parent of the parquet directory (``dynamiccl demo --out RUN`` writes
``RUN/parquet``; the simulator writes ``RUN/sim/truth.jsonl``). The report looks for each file in
the parquet directory, then the run directory, then ``RUN/sim``:

============================  =========================================================
``changes.jsonl``             regime changes, one ``dynamiccl.detector.events.RegimeChange`` JSON per line
``retuner-audit.jsonl``       the retuner's audit log (``dynamiccl.retuner.audit.AuditLog``), one decision per line
``truth.jsonl``               the simulator's ground truth (``dynamiccl.harness.simulator.scenario.write_truth``)
============================  =========================================================

Malformed lines are counted and skipped; the count and the first reason are reported.

>>> import tempfile, os
>>> with tempfile.TemporaryDirectory() as d:
...     os.makedirs(d + "/parquet")
...     with open(d + "/changes.jsonl", "w") as f:
...         _ = f.write('{"v":1,"id":"rc-1","kind":"bandwidth","job_id":"j","start_s":1.0,"detected_s":3.0,"magnitude":2.0}\\n')
...         _ = f.write('not json\\n')
...     side = load_sidecars(d + "/parquet")
>>> [c.id for c in side.changes], side.problems
(['rc-1'], ['changes.jsonl: 1 malformed line(s) skipped (line 2: regime change: not JSON (Expecting value: line 1 column 1 (char 0)))'])
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dynamiccl.detector.events import RegimeChange
from dynamiccl.detector.where_refresh import WhereUpdate, is_where_update, with_where

__all__ = ["CHANGES_FILE", "AUDIT_FILE", "TRUTH_FILE", "Sidecars", "load_sidecars", "find_sidecar",
           "read_jsonl", "decision_rows", "MARKED_ACTIONS"]

CHANGES_FILE = "changes.jsonl"
AUDIT_FILE = "retuner-audit.jsonl"
TRUTH_FILE = "truth.jsonl"
MAX_LINES = 1_000_000  # per file; beyond it lines are counted, not kept (bounded memory)


@dataclass
class Sidecars:
    changes: list[RegimeChange] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    truth: list[dict] = field(default_factory=list)
    paths: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def find_sidecar(parquet_dir: str | os.PathLike, name: str) -> Path | None:
    p = Path(parquet_dir)
    base = p if p.is_dir() else p.parent
    for d in (base, base.parent, base.parent / "sim"):
        if (d / name).is_file():
            return d / name
    return None


def read_jsonl(path: str | os.PathLike, parse: Callable[[str], Any], label: str,
               problems: list[str]) -> list:
    out, bad, first = [], 0, ""
    with open(path, "r", encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = parse(line)
            except (ValueError, TypeError) as exc:
                bad += 1
                first = first or f"line {i}: {exc}"
                continue
            if len(out) < MAX_LINES:
                out.append(item)
            else:
                bad += 1
                first = first or f"more than {MAX_LINES} lines"
    if bad:
        problems.append(f"{label}: {bad} malformed line(s) skipped ({first})")
    return out


def _object(line: str) -> dict:
    d = json.loads(line)
    if not isinstance(d, dict):
        raise ValueError("expected a JSON object")
    return d


def _truth(line: str) -> dict:
    d = _object(line)
    for k in ("kind", "t_start", "t_end"):
        if k not in d:
            raise ValueError(f"missing {k}")
    return d


def _change_or_update(line: str):
    """A changes-file line: a `RegimeChange`, or a `WhereUpdate` (a newer ``where`` on an earlier change)."""
    return WhereUpdate.from_json(line) if is_where_update(line) else RegimeChange.from_json(line)


def _apply_where_updates(items: list) -> list:
    """The changes, each with the newest ``where`` its updates gave it (the verdict users saw last)."""
    newest = {u.id: u.where for u in items if isinstance(u, WhereUpdate)}
    return [with_where(c, newest[c.id]) if c.id in newest else c for c in items if not isinstance(c, WhereUpdate)]


def load_sidecars(parquet_dir: str | os.PathLike, *, changes: str | None = None, audit: str | None = None,
                  truth: str | None = None) -> Sidecars:
    """Read what exists; explicit paths override the search (and must exist)."""
    s = Sidecars()
    for name, explicit, attr, parse in ((CHANGES_FILE, changes, "changes", _change_or_update),
                                        (AUDIT_FILE, audit, "decisions", _object),
                                        (TRUTH_FILE, truth, "truth", _truth)):
        if explicit is not None:
            path = Path(explicit)
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {explicit}")
        else:
            path = find_sidecar(parquet_dir, name)
        if path is None:
            continue
        s.paths[attr] = str(path)
        try:
            items = read_jsonl(path, parse, name, s.problems)
            setattr(s, attr, _apply_where_updates(items) if attr == "changes" else items)
        except OSError as exc:
            s.problems.append(f"{name}: cannot read ({exc})")
    return s


# ---------------------------------------------------------------------------------------------
_CONFIG_KEYS = ("candidate", "config", "active", "now", "candidates", "incumbent")
_SHOWN = {"ts", "t", "action", "dry_run", "target", "comm_name", "func", "size_bucket", "version",
          "config_version", "reason", "note", "gain", "measured_gain", "expected_gain", "rollback", *_CONFIG_KEYS}
MARKED_ACTIONS = ("commit", "rollback", "revert", "reuse", "push")  # drawn on the timeline


def _fmt(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return " ".join(_fmt(x) for x in v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def decision_rows(decisions: list[dict]) -> list[dict]:
    """Normalise retuner audit records (``dynamiccl.retuner.audit.AuditLog``: ``{"ts", "t", "action",
    "dry_run", …}``) for the table: event time (wall time ``ts`` if ``t`` is missing), action,
    target, config, measured gain (``gain``; else ``expected_gain``, flagged), rollback, details."""
    rows = []
    for d in decisions:
        t = d.get("t") if isinstance(d.get("t"), (int, float)) else None
        target = d.get("target")
        if target is None and ("func" in d or "comm_name" in d):
            target = "/".join(str(d.get(k, "")) for k in ("comm_name", "func", "size_bucket"))
        config = next((d[k] for k in _CONFIG_KEYS if d.get(k) not in (None, "", [])), None)
        gain, expected = d.get("gain", d.get("measured_gain")), False
        if not isinstance(gain, (int, float)):
            gain = d.get("expected_gain")
            expected = isinstance(gain, (int, float))
            gain = gain if expected else None
        action = str(d.get("action", ""))
        rows.append({
            "t": float(t) if t is not None else None, "action": action,
            "target": "" if target is None else _fmt(target), "config": "" if config is None else _fmt(config),
            "version": d.get("version", d.get("config_version")), "gain": gain, "gain_expected": expected,
            "rollback": action == "rollback" or d.get("rollback") is True,
            "dry_run": bool(d.get("dry_run", False)), "reason": _fmt(d.get("reason", d.get("note", ""))),
            "details": "; ".join(f"{k}={_fmt(v)}" for k, v in d.items() if k not in _SHOWN)[:400],
        })
    return rows
