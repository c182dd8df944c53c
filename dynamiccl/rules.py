"""The alert and recording rules of ``deploy/prometheus/rules/`` with site-specific base URLs.

The rule files are the single source: compose mounts them, the native stack and the Kubernetes
``PrometheusRule`` are rendered from them here. Only two annotation prefixes change:
``runbook_url`` values start with :data:`RUNBOOK_PREFIX` (a path in this repository) and
``dashboard_url`` values with :data:`GRAFANA_PREFIX` (the stack's own Grafana); a base URL replaces
the prefix. Everything else (expressions, labels, ``for``) is copied unchanged.

>>> doc = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0", "annotations": {
...     "runbook_url": "docs/runbooks/a.md", "dashboard_url": "http://localhost:3000/d/x?var-job_id=1"}}]}]}
>>> a = rebase(doc, runbook_url="https://wiki.example.org/dynamiccl/", grafana_url="https://grafana.example.org")
>>> a["groups"][0]["rules"][0]["annotations"]
{'runbook_url': 'https://wiki.example.org/dynamiccl/a.md', 'dashboard_url': 'https://grafana.example.org/d/x?var-job_id=1'}
>>> rebase(doc, runbook_url="ftp://x")
Traceback (most recent call last):
...
ValueError: runbook URL: expected http(s):// or file://, got 'ftp://x'
"""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

from dynamiccl.contracts.atomic import atomic_write

__all__ = ["RUNBOOK_PREFIX", "GRAFANA_PREFIX", "rebase", "render_rule_files", "prometheus_rule",
           "PROMETHEUSRULE_HEADER", "dump"]

RUNBOOK_PREFIX = "docs/runbooks/"
GRAFANA_PREFIX = "http://localhost:3000/"
_SCHEMES = ("http://", "https://", "file://")
PROMETHEUSRULE_HEADER = ("# Generated from deploy/prometheus/rules/*.yml by `dynamiccl stack rules --format "
                         "prometheusrule`;\n# do not edit: edit the rule files and regenerate (a test checks "
                         "this file is current).\n")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL expressions) as ``|`` blocks, so rendered rules stay readable."""


_Dumper.add_representer(str, lambda d, v: d.represent_scalar(
    "tag:yaml.org,2002:str", v, style="|" if "\n" in v else None))


def dump(doc: dict) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120)


def _base(url: str | None, what: str) -> str | None:
    if url is None:
        return None
    if not url.startswith(_SCHEMES):
        raise ValueError(f"{what} URL: expected http(s):// or file://, got {url!r}")
    return url.rstrip("/") + "/"


def rebase(doc: dict, *, runbook_url: str | None = None, grafana_url: str | None = None) -> dict:
    """A copy of one rule file's document with the two annotation prefixes replaced (None: keep)."""
    swaps = {k: (prefix, base) for k, prefix, base in (
        ("runbook_url", RUNBOOK_PREFIX, _base(runbook_url, "runbook")),
        ("dashboard_url", GRAFANA_PREFIX, _base(grafana_url, "Grafana"))) if base}
    out = copy.deepcopy(doc)
    for group in out.get("groups", []):
        for rule in group.get("rules", []):
            ann = rule.get("annotations") or {}
            for key, (prefix, base) in swaps.items():
                if str(ann.get(key, "")).startswith(prefix):
                    ann[key] = base + ann[key][len(prefix):]
    return out


def _sources(rules_dir: Path) -> list[Path]:
    files = sorted(Path(rules_dir).glob("*.yml"))
    if not files:
        raise FileNotFoundError(f"no rule files (*.yml) in {rules_dir}")
    return files


def render_rule_files(rules_dir: Path, out_dir: Path, **urls: str | None) -> list[Path]:
    """Write every ``rules_dir/*.yml`` rebased into ``out_dir`` (atomically); return the written paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for src in _sources(rules_dir):
        doc = rebase(yaml.safe_load(src.read_text()), **urls)
        dst = out_dir / src.name
        atomic_write(dst, f"# rendered from {src.name}; edit the source, not this copy\n" + dump(doc))
        written.append(dst)
    return written


def prometheus_rule(rules_dir: Path, *, name: str = "dynamiccl", **urls: str | None) -> dict:
    """One prometheus-operator ``PrometheusRule`` holding every group of ``rules_dir/*.yml``."""
    groups = []
    for src in _sources(rules_dir):
        groups += rebase(yaml.safe_load(src.read_text()), **urls)["groups"]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "dynamiccl"}},
            "spec": {"groups": groups}}
