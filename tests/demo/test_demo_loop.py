"""`dynamiccl demo --fast` end to end: the same events detected, a kept config with a measured gain in the
latency regime, its revert, no unmatched change, every rank on the same config (tests/demo/demo_runs.py). One run
(~10 s) in the default tier; three seeds with and without torch in the e2e tier, in --fast mode and in real time
(110 s each; real time needs a machine where the pipeline keeps up with the job's clock, which the failure names)."""
from __future__ import annotations

import pytest

from demo_runs import problems, run_demo

KINDS = ["pause", "bw_drop", "recovery", "latency", "latency ends", "straggler", "straggler ends"]


def _check(s: dict, torch: bool) -> None:
    assert problems(s) == []
    assert s["run"]["autoencoder_available"] is torch
    assert [e["kind"] for e in s["events"]] == KINDS


def test_fast_demo_shows_the_whole_loop(tmp_path, built_plugins):
    _check(run_demo(tmp_path / "run", 0, torch=False), torch=False)


@pytest.mark.e2e
@pytest.mark.parametrize("torch", [True, False], ids=["torch", "no-torch"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_demo_shows_the_whole_loop_for_every_seed(tmp_path, built_plugins, seed, torch):
    _check(run_demo(tmp_path / "run", seed, torch=torch), torch=torch)


@pytest.mark.e2e
@pytest.mark.parametrize("torch", [True, False], ids=["torch", "no-torch"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_realtime_demo_shows_the_whole_loop_for_every_seed(tmp_path, built_plugins, seed, torch):
    _check(run_demo(tmp_path / "run", seed, torch=torch, fast=False), torch=torch)
