"""`dynamiccl demo --fast` end to end, three seeds, with and without torch: the same events detected, a kept
config with a measured gain in the latency regime, no unmatched change (tests/demo/demo_runs.py)."""
from __future__ import annotations

import pytest

from demo_runs import problems, run_demo


@pytest.mark.slow
@pytest.mark.parametrize("torch", [True, False], ids=["torch", "no-torch"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_demo_shows_the_whole_loop(tmp_path, built_plugins, seed, torch):
    s = run_demo(tmp_path / "run", seed, torch=torch)
    assert problems(s) == []
    assert s["run"]["autoencoder_available"] is torch
    kinds = [e["kind"] for e in s["events"]]
    assert kinds == ["pause", "bw_drop", "recovery", "latency", "latency ends", "straggler", "straggler ends"]
