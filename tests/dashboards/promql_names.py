"""Metric names (and label matchers) a PromQL expression uses; the declared metric lists of the services.

Shared by tests/dashboards and tests/stack (one source of truth: the services' ``metrics.py`` modules).
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
#: service → module declaring its metrics (``METRICS`` of ``MetricSpec(name, type, help, labels)``)
OWNERS = {"collector": "dynamiccl.collector.metrics", "detector": "dynamiccl.detector.metrics", "retuner": "dynamiccl.retuner.metrics"}
BUILTIN = {"up": ("job", "instance"), "ALERTS": None, "ALERTS_FOR_STATE": None}
TARGET_LABELS = ("job", "instance")      # added by Prometheus to every scraped series
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
             "unless", "inf", "nan"}


def owner(name: str) -> str:
    for svc in ("detector", "retuner"):
        if name.startswith(f"dynamiccl_{svc}_"):
            return svc
    return "collector"


def declared(service: str) -> dict[str, tuple[str, tuple[str, ...]]] | None:
    """name → (type, labels) for one service, or None when its metrics module does not exist yet."""
    mod = OWNERS[service]
    try:
        m = importlib.import_module(mod)
    except ModuleNotFoundError as exc:
        if exc.name in (mod, mod.split(".")[0]):
            return None
        raise
    out = {}
    for spec in m.METRICS:
        out[spec.name] = (spec.type, tuple(spec.labels))
    return out


def series_names(declared_map: dict) -> dict[str, tuple[str, ...]]:
    """Exposed series names → labels (histograms expose _bucket (+le), _sum, _count)."""
    out = {}
    for name, (typ, labels) in declared_map.items():
        if typ == "histogram":
            out[name + "_bucket"] = labels + ("le",)
            out[name + "_sum"] = labels
            out[name + "_count"] = labels
        else:
            out[name] = labels
    return out


def _strip(expr: str) -> str:
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    return s


def selectors(expr: str) -> list[tuple[str, list[str]]]:
    """(metric, [label names in its matcher]) for every ``metric{...}`` and bare ``metric``."""
    s = _strip(expr)
    out: list[tuple[str, list[str]]] = []
    for m in re.finditer(r'(?<![\w.$])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}', s):
        out.append((m.group(1), re.findall(r'(\w+)\s*(?:=~|!~|!=|=)', m.group(2))))
    return out


def metric_names(expr: str) -> set[str]:
    """Every metric name an expression reads.

    >>> sorted(metric_names('sum by (le) (rate(a_bucket{x=~"$v"}[$__rate_interval])) / on (j) b:c:d > 1e-9'))
    ['a_bucket', 'b:c:d']
    """
    s = _strip(expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    out = set()
    for m in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)\s*(\()?", s):
        name, call = m.groups()
        if call or name.lower() in _KEYWORDS:
            continue
        out.add(name)
    return out


def rule_files() -> list[Path]:
    return sorted((ROOT / "deploy/prometheus/rules").glob("*.yml"))


def rules() -> list[dict]:
    out = []
    for f in rule_files():
        for g in yaml.safe_load(f.read_text())["groups"]:
            out.extend(g["rules"])
    return out


def recorded() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def dashboard_queries(doc: dict) -> list[tuple[str, str]]:
    """(where, expr) for every panel target, annotation and variable query of a dashboard."""
    out = []
    for p in doc.get("panels", []):
        for t in p.get("targets", []) or []:
            if t.get("expr"):
                out.append((f"panel {p.get('id')} {p.get('title')!r} {t.get('refId')}", t["expr"]))
        for sub in p.get("panels", []) or []:
            for t in sub.get("targets", []) or []:
                if t.get("expr"):
                    out.append((f"panel {sub.get('id')} {sub.get('title')!r}", t["expr"]))
    for a in doc.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append((f"annotation {a['name']!r}", a["expr"]))
    for v in doc.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, str) and q.startswith("label_values("):
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
            out.append((f"variable {v['name']}", m.group(1)))
    return out
