"""The numbers in the report's HTML tables against the parquet data, recomputed independently
(pyarrow → numpy → the collector's own definitions in dynamiccl/collector/records.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dynamiccl.collector.records import busbw_factor, duration_s, size_bucket, traffic_bytes, valid_mask
from dynamiccl.collector.wire_format import FUNCS
from dynamiccl.detector.events import RegimeChange
from dynamiccl.cli import main
from report_helpers import make_run, num, part_files, raw_events, read_tables

START = 1_767_225_600.0  # dynamiccl.harness.synthetic_run.START_NS in seconds


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    d = make_run(root)
    changes = [
        RegimeChange(id="rc-a", kind="bandwidth", job_id="synthetic-job", start_s=START + 36.0, detected_s=START + 38.5,
                     magnitude=2.4, comm_names=["dp0", "dp1"], funcs=["AllReduce"], size_buckets=[24, 25]),
        RegimeChange(id="rc-b", kind="recovery", job_id="synthetic-job", start_s=START + 54.0, detected_s=START + 56.0,
                     magnitude=0.41, recovers="rc-a"),
        RegimeChange(id="rc-c", kind="latency", job_id="synthetic-job", start_s=START + 5.0, detected_s=START + 6.0,
                     magnitude=1.3, ranks=[3], hosts=["node0"]),
    ]
    with open(root / "changes.jsonl", "w") as f:
        f.write("".join(c.to_json() + "\n" for c in changes))
    audit = [
        {"ts": 1.0, "t": START + 40.0, "action": "commit", "dry_run": False, "target": "dp0/AllReduce/24",
         "candidate": "RING/LL128/0", "incumbent": "NCCL-default", "expected_gain": 1.21, "p_value": 0.001},
        {"ts": 2.0, "t": START + 45.0, "action": "rollback", "dry_run": False, "target": "dp0/AllReduce/24",
         "candidate": "RING/LL128/0", "gain": 0.93, "mean_s": 0.01},
        {"ts": 3.0, "t": START + 46.0, "action": "push", "dry_run": False, "version": 2, "rules": 1},
    ]
    with open(root / "retuner-audit.jsonl", "w") as f:
        f.write("".join(json.dumps(a) + "\n" for a in audit))
    out = root / "report.html"
    assert main(["report", d, "-o", str(out), "--bin", "4"]) == 0
    return {"dir": d, "root": root, "tables": read_tables(out.read_text()), "changes": changes, "audit": audit,
            "html": out.read_text()}


def test_mix_table_matches_parquet(run):
    ev = raw_events(part_files(run["dir"]))
    ev = ev[valid_mask(ev)]
    dur = duration_s(ev)
    timed = ~np.isnan(dur)
    sb = size_bucket(ev["bytes"])
    bus = traffic_bytes(ev["func"], ev["bytes"], ev["nranks"]) * busbw_factor(ev["func"], ev["nranks"])
    rows = run["tables"]["mix"]
    seen = set()
    total_time = dur[timed].sum()
    for r in rows:
        func, bucket = r["collective"][1], int(num(r["size bucket"]))
        seen.add((func, bucket))
        m = (ev["func"] == FUNCS.index(func)) & (sb == bucket)
        mt = m & timed
        assert num(r["records"]) == m.sum()
        assert num(r["timed"]) == mt.sum()
        assert num(r["bytes"]) == ev["bytes"][m].astype(np.float64).sum()
        t = dur[mt].sum()
        assert num(r["time (rank·s)"]) == pytest.approx(t, rel=1e-9)
        assert num(r["time share"]) == pytest.approx(t / total_time, rel=1e-9)
        assert num(r["mean latency"]) == pytest.approx(t / mt.sum(), rel=1e-9)
        assert num(r["bus bandwidth"]) == pytest.approx(bus[mt].sum() / t, rel=1e-9)
    expected = {(FUNCS[f], int(b)) for f, b in set(zip(ev["func"].tolist(), sb.tolist()))}
    assert seen == expected
    assert sum(num(r["records"]) for r in rows) == len(ev) == 60_000


def test_config_versions_match_parquet(run):
    ev = raw_events(part_files(run["dir"]))
    versions = {int(num(r["tuner config version"])): num(r["records"]) for r in run["tables"]["versions"]}
    vals, counts = np.unique(ev["tuner_config_version"], return_counts=True)
    assert versions == dict(zip(vals.tolist(), counts.astype(float).tolist()))
    assert set(versions) == {0, 1}  # dynamiccl.harness.synthetic_run switches config at 55 % of the run
    # the switch of tp AllReduce 1-4 MiB to LL128 is listed, at the bin of the config change
    sw = [r for r in run["tables"]["switches"] if r["collective"][0] == "AllReduce" and r["to"][0] == "RING/LL128"]
    assert sw and all(abs(num(r["time"]) - (START + 0.55 * 120)) <= 4.0 for r in sw)


def test_changes_table_against_changes_file(run):
    rows = run["tables"]["changes"]
    by_id = {r["id"][0]: r for r in rows}
    assert [r["id"][0] for r in rows] == ["rc-c", "rc-a", "rc-b"]  # ordered by detection time
    for c in run["changes"]:
        r = by_id[c.id]
        assert r["kind"][1] == c.kind
        assert num(r["onset (UTC)"]) == c.start_s
        assert num(r["detected"]) == c.detected_s
        assert num(r["detection delay"]) == pytest.approx(c.detected_s - c.start_s)
        assert num(r["magnitude"]) == c.magnitude
    # ground truth (dynamiccl.harness.synthetic_run: bandwidth drop 36-54 s, straggler 84-96 s of 120 s)
    assert by_id["rc-a"]["ground truth"][0].startswith("bw_drop")
    assert num(by_id["rc-a"]["delay from true onset"]) == pytest.approx(2.5)
    assert by_id["rc-b"]["ground truth"][0].startswith("recovery")
    assert num(by_id["rc-b"]["delay from true onset"]) == pytest.approx(2.0)
    assert by_id["rc-c"]["ground truth"][0] == "-"  # a false alarm
    assert "ranks 3" in by_id["rc-c"]["where"][0] and "hosts node0" in by_id["rc-c"]["where"][0]
    truth = {r["event"][0]: r for r in run["tables"]["truth"]}
    assert truth["bw_drop"]["first detection"][0] == "rc-a"
    assert truth["straggler"]["first detection"][0] == "not detected"


def test_decisions_table_against_audit_log(run):
    rows = run["tables"]["decisions"]
    assert [r["action"][1] for r in rows] == ["commit", "rollback", "push"]
    commit, rollback, push = rows
    assert num(commit["time"]) == START + 40.0
    assert commit["config"][0] == "RING/LL128/0"
    assert num(commit["gain"]) == 1.21 and commit["gain"][0].endswith("expected")
    assert num(rollback["gain"]) == 0.93 and num(rollback["rollback"]) == 1 and num(commit["rollback"]) == 0
    assert num(push["version"]) == 2
    assert "3 decisions" in run["html"] and "1 rollback(s)" in run["html"]


def test_straggler_table_finds_the_injected_straggler(run):
    rows = run["tables"]["stragglers"]
    # global rank 5 is 2 ms late from 84 s to 96 s: world0 rank 5 and tp0 rank 5 (in the 2-rank dp5
    # the relative latency of the shorter rank is only ~0.6 of the pair's median: not flagged)
    hits = {r["communicator rank (host:pid)"][0].split(" (")[0] for r in rows}
    assert {"world0 rank 5", "tp0 rank 5"} <= hits
    assert not {h for h in hits if h.startswith(("world0", "tp"))} - {"world0 rank 5", "tp0 rank 5"}
    for r in rows:
        label = r["communicator rank (host:pid)"][0]
        if label.startswith(("world0 rank 5", "tp0 rank 5")):
            assert abs(num(r["from (UTC)"]) - (START + 84.0)) <= 4.0  # 4 s bins
            assert abs(num(r["to"]) - (START + 96.0)) <= 4.0
            assert num(r["relative latency"]) < 0.5
            assert num(r["arrival lag"]) == pytest.approx(2e-3, rel=0.2)


def test_overview_counts(run):
    assert "60,000 (" in run["html"]
    assert "communicators</td><td>11" in run["html"]
    assert "processes / hosts</td><td>16 / 2" in run["html"]


def test_interactive_html_is_self_contained(run):
    import html.parser

    class Refs(html.parser.HTMLParser):
        refs: list = []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            for k in ("src", "href"):
                if a.get(k) and not a[k].startswith(("#", "data:")):
                    self.refs.append((tag, a[k]))

    p = Refs()
    p.feed(run["html"])
    assert p.refs == []  # no external script, style sheet, image or link
    n_plots = run["html"].count('class="plotly-graph-div"')
    assert n_plots == 4
    assert os.path.getsize(run["root"] / "report.html") < 20 * 2**20
