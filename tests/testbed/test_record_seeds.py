"""The test bed's one recording loop (corpus and sparse suites): skip what is recorded, keep an
unfinished run aside, go on after a failed run, stop at a signal."""
from __future__ import annotations

import types

import pytest

from dynamiccl.harness.testbed import generate, netns, run


@pytest.fixture
def fake_runs(monkeypatch):
    calls: list[str] = []
    outcome: dict[int, str] = {}

    def run_scenario(sc, out_dir, **kw):
        seed = int(out_dir.name.split("-")[1])
        calls.append(out_dir.name)
        what = outcome.get(seed, "ok")
        if what == "fail":
            raise RuntimeError("namespace setup failed")
        out_dir.mkdir(parents=True)
        (out_dir / "summary.json").write_text("{}")
        return types.SimpleNamespace(interrupted=what == "signal", score=types.SimpleNamespace(line=lambda: "ok"))

    monkeypatch.setattr(run, "run_scenario", run_scenario)
    monkeypatch.setattr(netns, "new_prefix", lambda p: p)
    return calls, outcome


def test_recorded_seeds_are_skipped_and_unfinished_ones_kept_aside(tmp_path, fake_runs):
    calls, _ = fake_runs
    (tmp_path / "seed-000").mkdir()
    (tmp_path / "seed-000" / "summary.json").write_text("{}")
    (tmp_path / "seed-001").mkdir()                     # a run that never finished
    assert generate.record([0, 1], tmp_path) == 0
    assert calls == ["seed-001"]
    assert [p.name.startswith("failed-001-") for p in tmp_path.iterdir()].count(True) == 1


def test_a_failed_run_is_counted_and_the_next_seed_still_runs(tmp_path, fake_runs):
    calls, outcome = fake_runs
    outcome[2] = "fail"
    assert generate.record([2, 3], tmp_path) == 1
    assert calls == ["seed-002", "seed-003"]


def test_a_signal_ends_the_recording(tmp_path, fake_runs):
    calls, outcome = fake_runs
    outcome[4] = "signal"
    assert generate.record([4, 5], tmp_path) == 1
    assert calls == ["seed-004"]
