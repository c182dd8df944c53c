"""End to end on a real recorded run: `dynamiccl demo --fast` (simulated job through the real
plugin and collector) → `dynamiccl replay` (detector + retuner dry run) → `dynamiccl report` →
chromium. Slow: builds and runs the plugin and a 90 s scenario."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from report_browser import Browser, chromium_path
from report_helpers import read_tables

pytestmark = pytest.mark.e2e


def _cli(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynamiccl", *args], capture_output=True, text=True, timeout=timeout)


def test_demo_replay_report(tmp_path, built_profiler):
    run = tmp_path / "demo"
    p = _cli("demo", "--fast", "--no-live", "--out", str(run), "--metrics", "127.0.0.1:0")
    assert p.returncode == 0, p.stderr[-2000:]
    p = _cli("replay", str(run / "parquet"), "--warmup", "20", "--out", str(run / "changes.jsonl"),
             "--audit-out", str(run / "retuner-audit.jsonl"))
    assert p.returncode == 0, p.stderr[-2000:]
    last = dict(kv.split("=", 1) for kv in p.stdout.strip().splitlines()[-1].split())
    assert int(last["records"]) > 700_000 and last["skipped_files"] == "0"
    p = _cli("report", str(run / "parquet"))
    assert p.returncode == 0, p.stderr[-2000:]
    html = (run / "report.html").read_text()
    tables = read_tables(html)
    truth = [json.loads(x) for x in (run / "sim" / "truth.jsonl").read_text().splitlines()]
    assert len(tables["truth"]) == len(truth)
    assert len(tables["changes"]) == int(last["changes"])
    assert sum(float(r["records"][1]) for r in tables["mix"]) == int(last["records"])
    # the demo's straggler (rank 5, 70-85 s) is in the straggler table
    assert any("rank 5" in r["communicator rank (host:pid)"][0] for r in tables["stragglers"])
    if chromium_path() is None:
        pytest.skip("Debian chromium (/usr/bin/chromium) is not installed")
    with Browser() as b:
        b.load((run / "report.html").as_uri())
        assert b.evaluate("""new Promise(r => { const t0 = Date.now(); (function poll() {
            const d = [...document.querySelectorAll('.js-plotly-plot')];
            if (d.length === 4 && d.every(x => x.querySelector('.main-svg'))) r(true);
            else if (Date.now() - t0 > 30000) r(false); else setTimeout(poll, 100); })(); })""")
        assert b.errors() == []
