"""dynamiccl.harness.testbed.analyse: the delay decomposition on a small synthetic run directory (no root needed)."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from dynamiccl.harness.testbed.analyse import decompose, load_windows
from dynamiccl.harness.testbed.controller import TruthEvent
from dynamiccl.harness.testbed.score import Detection, score

T0 = 1_800_000_000.0  # onset of the throttle (epoch s)


def _run_dir(tmp_path):
    ev = [TruthEvent(0, "throttle", [2], False, True, 0.0, T0, T0, 50, 20, "throttle rank 2"),
          TruthEvent(1, "release", [2], False, False, 7.0, T0 + 7, T0 + 7, 20, 50, "release rank 2")]
    (tmp_path / "truth.json").write_text(json.dumps({"events": [vars(e) for e in ev]}))
    # a step every 0.1 s; 100 ms collectives before the onset and after the release, 250 ms between
    starts = np.arange(T0 - 5, T0 + 10, 0.1) + 0.013
    slow = (starts >= T0 + 0.05) & (starts < T0 + 7.05)
    dur = np.where(slow, 0.25, 0.1)
    n = len(starts)
    rec = pl.DataFrame({"bytes": np.full(n, 131072, np.uint64), "timing_source": np.full(n, 2, np.uint8),
                        "enqueue_ns": (starts * 1e9).astype(np.uint64),
                        "cpu_end_ns": ((starts + dur) * 1e9).astype(np.uint64),
                        "rank": np.zeros(n, np.int32)})
    (tmp_path / "records" / "job_id=x").mkdir(parents=True)
    rec.write_parquet(tmp_path / "records" / "job_id=x" / "part.parquet")
    ws = np.arange(T0 - 5, T0 + 10, 0.5)
    pl.DataFrame({"window_start": ws, "window_s": np.full(len(ws), 0.5), "received_wall_s": ws + 0.9,
                  "lat_p50_s": np.full(len(ws), 0.1)}).write_parquet(tmp_path / "windows_keys.parquet")
    # detected on the window ending 1.0 s after the onset, emitted 0.6 s later; release: 1.5 s / 2.2 s
    det = [Detection("a", "straggler", T0 + 1.6, T0, T0 + 1.0, ranks=[2]),
           Detection("b", "recovery", T0 + 7 + 2.2, T0 + 7, T0 + 8.5, ranks=[2])]
    sc = score(ev, det)
    (tmp_path / "summary.json").write_text(json.dumps({"score": sc.as_dict(), "detect_from": T0 - 5}))
    return tmp_path


def test_decomposition_stages(tmp_path):
    run = _run_dir(tmp_path)
    assert len(load_windows(run)) == 30
    rows = decompose(run)
    assert [r["kind"] for r in rows] == ["straggler", "recovery"]
    t, r = rows
    # the first 250 ms collective started at onset + 0.113 s, ended at + 0.363 s, in the window
    # [T0, T0 + 0.5) that reached the detector 0.4 s after its end
    assert t["first_affected_start_s"] == pytest.approx(0.113, abs=1e-3)
    assert t["first_affected_end_s"] == pytest.approx(0.363, abs=1e-3)
    assert (t["its_window_end_s"], t["its_window_closed_s"]) == (pytest.approx(0.5), pytest.approx(0.9))
    assert t["detector_window_end_s"] == pytest.approx(1.0)
    assert t["detector_window_closed_s"] == pytest.approx(1.4)   # that window's arrival
    assert t["delay_s"] == pytest.approx(1.6)
    # the release: the first fast (100 ms) collective started 0.113 s after it
    assert r["first_affected_start_s"] == pytest.approx(0.113, abs=1e-3)
    assert r["detector_window_end_s"] == pytest.approx(1.5) and r["delay_s"] == pytest.approx(2.2)
