"""The sparse job on the test bed, shortened (integration, ~4 min; root + iproute2).

`scenarios/sparse-stationary.yaml` (3 gloo ranks, one 2 MiB all-reduce per ~5 s step, the live
detector at ``DetectorConfig()`` on 1 s windows) for 150 s instead of an hour: no change may be
reported, live or by the replay of its records at defaults, the stream must be lossless and
nothing may be left behind. The full hour is a documented command (docs/testbed.md, "The sparse
job"), as are the throttled runs (`python -m dynamiccl.harness.testbed.sparse record`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from testbed_helpers import leftovers, require_testbed, start_run

from dynamiccl.harness.testbed import sparse

STATIONARY = Path(sparse.__file__).parent / "scenarios" / "sparse-stationary.yaml"


@pytest.mark.integration
def test_sparse_stationary_shortened(tmp_path):
    require_testbed()
    raw = yaml.safe_load(STATIONARY.read_text())
    raw.update(name="sparse-stationary-short", tail_s=150)
    scen = tmp_path / "short.yaml"
    scen.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    proc = start_run(tmp_path / "state", out, "--scenario", str(scen))
    try:
        text, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, text[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    prefix = summary["prefix"]
    assert leftovers(prefix) == []
    assert not any(summary["collector_dropped"].values()), summary["collector_dropped"]
    s = sparse.score_run(out)
    print(sparse.line(s))
    assert s["instances"] >= 25 and 4.5 <= s["step_s"] <= 5.5, s
    assert s["live"]["false_alarms"] == 0, s["live"]
    assert s["replay"]["false_alarms"] == 0, s["replay"]
