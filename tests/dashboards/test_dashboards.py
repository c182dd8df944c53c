"""The committed dashboard JSON: current, valid against the SDK's dashboard schema, variables, metric names."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from promql_names import (BUILTIN, ROOT, TARGET_LABELS, dashboard_queries, declared, metric_names, owner, recorded,
                          rules, selectors, series_names)

JSON_DIR = ROOT / "dynamiccl" / "dashboards" / "json"
SCHEMA = Path(__file__).with_name("schema") / "dashboard.jsonschema.json"


def _docs() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(JSON_DIR.glob("*.json"))}


def test_committed_json_is_current():
    from dynamiccl.dashboards.cli import stale
    assert stale(JSON_DIR) == [], "run `dynamiccl dashboards build` and commit dynamiccl/dashboards/json/"


def test_check_command_detects_a_stale_file(tmp_path, capsys):
    from dynamiccl.cli import main
    assert main(["dashboards", "build", "--out", str(tmp_path)]) == 0
    assert main(["dashboards", "check", "--dir", str(tmp_path)]) == 0
    p = tmp_path / "ranks.json"
    p.write_text(p.read_text().replace("Straggler", "Stragler"))
    (tmp_path / "old.json").write_text("{}")
    assert main(["dashboards", "check", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "ranks.json" in out.err and "old.json" in out.err and out.out.strip().endswith("stale=2")


def test_five_dashboards_with_the_issue_panels():
    docs = _docs()
    assert sorted(docs) == ["gpu.json", "overview.json", "ranks.json", "regimes.json", "retuner.json"]
    titles = {n: " | ".join(p["title"] for p in d["panels"]) for n, d in docs.items()}
    for name, words in {
        "overview.json": ["Bus bandwidth", "Latency p50", "heatmap", "Records/s", "Dropped"],
        "regimes.json": ["CUSUM", "Autoencoder", "Regime timeline"],
        "ranks.json": ["spread", "Straggler", "by host"],
        "retuner.json": ["Active configuration", "Pushes and rollbacks", "Measured gain"],
        "gpu.json": ["NVLink", "PCIe", "SM clock", "Power", "Temperature", "XID"],
    }.items():
        for w in words:
            assert w in titles[name], (name, w)
    assert any(a["expr"].startswith('ALERTS{alertname="NcclRegimeChange"')
               for a in docs["regimes.json"]["annotations"]["list"] if "expr" in a)


@pytest.mark.parametrize("name", ["gpu.json", "overview.json", "ranks.json", "regimes.json", "retuner.json"])
def test_valid_against_sdk_schema_with_stable_ids_and_variables(name):
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    doc = _docs()[name]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, errors[:5]
    ids = [p["id"] for p in doc["panels"]]
    assert ids == list(range(1, len(ids) + 1))                   # stable, unique, in order
    variables = doc["templating"]["list"]
    assert [v["name"] for v in variables][:4] == ["datasource", "job_id", "comm", "collective"]
    assert variables[0]["type"] == "datasource" and variables[0]["query"] == "prometheus"
    for p in doc["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert [t["refId"] for t in p["targets"]] == [chr(65 + i) for i in range(len(p["targets"]))]


def test_schema_rejects_what_grafana_would():
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    doc = _docs()["overview.json"]
    doc["panels"][1]["gridPos"]["w"] = 25
    doc["templating"]["list"][0]["refresh"] = 7
    assert len(list(validator.iter_errors(doc))) == 2


def test_no_fixed_prometheus_uid_anywhere():
    """Every Prometheus reference (panel, target, variable, annotation) is the ``$datasource`` variable, so
    the dashboards work with any Prometheus data source, not only the provisioned uid."""
    def refs(node):
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and ds.get("type") == "prometheus":
                yield ds["uid"]
            for v in node.values():
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)
    for name, doc in _docs().items():
        uids = set(refs(doc))
        assert uids == {"${datasource}"}, (name, uids)
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/dynamiccl.yaml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus" and ds["datasources"][0]["isDefault"] is True


# ---- one source of truth for metric names -----------------------------------------------------------
def _uses() -> list[tuple[str, str, str]]:
    """(source, where, expr) for every dashboard query and rule expression."""
    out = [(f"dynamiccl/dashboards/json/{n}", w, e) for n, d in _docs().items() for w, e in dashboard_queries(d)]
    out += [("deploy/prometheus/rules", r.get("alert") or r.get("record"), r["expr"]) for r in rules()]
    return out


def test_extractor_finds_every_metric_of_a_query():
    assert metric_names('histogram_quantile(0.5, sum by (host, le) (rate(x_bucket{a="b"}[5m]))) '
                        '- ignoring(q) y offset 5m') == {"x_bucket", "y"}
    assert selectors('max by (h) (m{job_id=~"$job_id",comm="x"})') == [("m", ["job_id", "comm"])]


@pytest.mark.parametrize("service", ["collector", "detector", "retuner"])
def test_every_metric_named_is_declared_by_its_service(service):
    decl = declared(service)
    if decl is None:
        pytest.skip(f"{service}/metrics.py does not exist yet: its names cannot be checked until it lands")
    series = series_names(decl)
    rec = recorded()
    used = 0
    for src, where, expr in _uses():
        for name in metric_names(expr):
            if name in BUILTIN or name in rec or owner(name) != service:
                continue
            used += 1
            assert name in series, f"{src} {where}: {name} is not declared in {service}/metrics.py"
        for name, labels in selectors(expr):
            if name in series:
                unknown = set(labels) - set(series[name]) - set(TARGET_LABELS)
                assert not unknown, f"{src} {where}: {name} has no label(s) {sorted(unknown)}"
    assert used > 0, f"no dashboard or rule reads a {service} metric"


def test_recording_rules_are_used_and_read_declared_metrics():
    rec = recorded()
    text = " ".join(e for _, _, e in _uses())
    for r in rec:
        assert re.search(re.escape(r), text), f"recording rule {r} is not used by a dashboard or rule"
