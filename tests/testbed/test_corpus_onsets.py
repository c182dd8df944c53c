"""`dynamiccl.harness.corpus_onsets`: the records' shift around a labelled onset, no detector."""
from __future__ import annotations

import json
import math

import numpy as np
import polars as pl

from dynamiccl.harness.corpus_onsets import BEFORE, onset_rows, profile

T0 = 1_800_000_000.0


def _run(tmp_path, begins_at: float, onset: float = 40.0):
    """A run of 100 records/s whose durations double from ``begins_at`` s; labelled at ``onset``."""
    rng = np.random.default_rng(1)
    ts = T0 + np.arange(0, 60, 0.01)
    dur = 0.01 * np.exp(0.05 * rng.standard_normal(ts.size)) * np.where(ts >= T0 + begins_at, 2.0, 1.0)
    (tmp_path / "records").mkdir()
    pl.DataFrame({"enqueue_ns": (ts * 1e9).astype(np.int64),
                  "cpu_end_ns": ((ts + dur) * 1e9).astype(np.int64)}).write_parquet(tmp_path / "records" / "p.parquet")
    events = [{"do": "throttle", "degrades": True, "onset_wall": T0 + onset},
              {"do": "release", "degrades": False, "onset_wall": T0 + onset + 10}]
    (tmp_path / "truth.json").write_text(json.dumps({"t0_wall": T0, "events": events}))
    return tmp_path


def test_a_change_on_time_moves_from_window_zero(tmp_path):
    rows = onset_rows(_run(tmp_path, begins_at=40.0))
    assert [do for do, _ in rows] == ["throttle"]          # degradations only
    p = profile(rows)["throttle"]
    assert np.nanmax(np.abs(p["median"][:BEFORE])) < 0.05
    assert abs(p["median"][BEFORE] - math.log(2)) < 0.05
    assert p["high"][BEFORE] == 1.0 and p["high"][:BEFORE].max() == 0.0


def test_a_change_that_began_before_its_stamp_shows_before_zero(tmp_path):
    p = profile(onset_rows(_run(tmp_path, begins_at=37.0)))["throttle"]
    assert abs(p["median"][BEFORE - 3] - math.log(2)) < 0.05 and abs(p["median"][BEFORE - 4]) < 0.05


def test_rate_shift_is_the_log_ratio_of_instances_per_second_around_the_onset():
    from dynamiccl.harness.corpus_onsets import rate_shift
    starts = np.r_[np.arange(0.0, 40.0, 0.1), np.arange(40.0, 60.0, 0.2)]   # 10/s, then 5/s from 40 s
    assert abs(rate_shift(starts, 40.0) - math.log(2)) < 0.05
    assert abs(rate_shift(starts, 20.0)) < 0.05                             # no change there
    assert math.isnan(rate_shift(starts, 100.0))                            # no instance after it
