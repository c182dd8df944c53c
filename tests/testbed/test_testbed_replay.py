"""Replays of recorded test-bed runs through the test bed's detector (no root needed).

``tests/testbed/data/<run>/`` holds what a ``dynamiccl testbed run --scenario ci`` wrote that a
replay needs: ``truth.json``, ``windows_keys.parquet`` / ``windows_ranks.parquet`` (every window
the live detector saw, with the wall time it reached it) and ``summary.json`` (``detect_from``;
the live run's line and the machine's load, for reference). ``dynamiccl.harness.testbed.analyse.replay`` scores
a fresh detector on them as if live, so this is the detector (``dynamiccl/detector/``) with the test bed's
settings (``dynamiccl/harness/testbed/detect.py``) on real collectives over a real shaped network: every target
of the issue, on three runs (two on a quiet machine, one at load 6-9). The settings were chosen
on these runs (docs/testbed.md, "Measured"): a regression check, not an out-of-sample measure.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dynamiccl.harness.testbed.analyse import replay

DATA = Path(__file__).parent / "data"
RUNS = sorted(p.name for p in DATA.iterdir() if (p / "truth.json").exists())


def test_recorded_runs_present():
    assert len(RUNS) == 3


@pytest.mark.parametrize("run", RUNS)
def test_replay_meets_targets(run):
    sc = replay(DATA / run)
    line = sc.line()
    # every throttle and release detected, nothing else reported, each within 3 s, and each
    # one-rank throttle localised to its rank
    assert (sc.changes, sc.detected, sc.false_alarms) == (10, 10, 0), line
    assert sc.max_delay_s <= 3.0, line
    assert sc.localised == sc.localisable == 3, line


def test_machine_noise_separates_quiet_runs():
    from dynamiccl.harness.testbed.analyse import machine_noise
    noise = {run: machine_noise(DATA / run) for run in RUNS}
    # dtb3a8e / dtb8f9d: quiet machine (load < 1); h7a: load 6.4 -> 9.2
    assert noise["dtb3a8e"]["stall_share"] < 0.02 and noise["dtb8f9d"]["stall_share"] < 0.02, noise
    assert 0.05 < noise["h7a"]["stall_share"] < 0.2, noise
    assert all(n["windows"] > 100 for n in noise.values()), noise
