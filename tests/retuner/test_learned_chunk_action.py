"""Chunk size in the learned policy's action (the design's numThreads): a candidate's chunk reaches the tuner file,
a chunk below the protocol's grain (or off it, or above the plugin's cap) is never proposed, and chunk choices stay
off unless configured."""
from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.nccl_tuner_plugin.config import read_configs
from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.retuner.learned.actions import CELLS, CK_FACTORS_ON, GRID, GRID_CHUNK, chunk_of, grid_for
from dynamiccl.retuner.learned.policy import DEFAULT_WEIGHTS, LearnedPolicy
from dynamiccl.retuner.push import ConfigPusher
from dynamiccl.retuner.types import CHUNK_GRAIN, CHUNK_MAX, Candidate, Target


def test_a_candidates_chunk_reaches_the_tuner_file(tmp_path):
    t = Target(0x1F, "AllReduce", 22, nranks=16, nnodes=2)
    c = Candidate("RING", "SIMPLE", 8, 65536)
    assert c.name == "RING/SIMPLE/8/c65536" and Candidate.parse(c.name) == c
    p = ConfigPusher(tmp_path / "tuner.conf", dry_run=False)
    p.push([c.rule(t), Candidate("TREE", "LL128", 0).rule(t)])
    rules = read_configs(tmp_path / "tuner.conf")[-1].rules
    assert [r.chunk_bytes for r in rules] == [65536, 0]
    assert "RING SIMPLE 8 65536 0x000000000000001f" in (tmp_path / "tuner.conf").read_text()


@pytest.mark.parametrize("proto,chunk", [("SIMPLE", 256), ("SIMPLE", 1000), ("LL128", 1024), ("LL", 8),
                                         ("LL", CHUNK_MAX + 16), ("SIMPLE", -512)])
def test_a_chunk_below_or_off_the_grain_or_over_the_cap_is_refused(proto, chunk):
    with pytest.raises(ValueError, match="chunk size"):
        Candidate("RING", proto, 0, chunk)


def test_chunk_choices_round_down_to_the_grain_and_mask_below_one_grain():
    assert chunk_of("SIMPLE", 131072, 1.0) == 0                       # NCCL's own: written as 0
    assert chunk_of("SIMPLE", 131072, 0.5) == 65536
    assert chunk_of("LL128", 1920 * 10, 0.25) == 1920 * 2              # 2.5 grains -> 2
    assert chunk_of("LL128", 1920 * 3, 0.25) is None                   # below one grain: masked
    assert all(f <= 1.0 for f in CK_FACTORS_ON)                        # never above NCCL's chunk (clamped anyway)


def test_the_grid_follows_the_weights_file():
    assert LearnedPolicy.load().grid == GRID                           # the shipped file keeps NCCL's chunk
    assert grid_for(GRID_CHUNK.n) == GRID_CHUNK and GRID_CHUNK.n == 3 * GRID.n
    with pytest.raises(ValueError, match="actions"):
        grid_for(GRID.n + 1)
    for i in range(GRID.n):                                            # the shipped indices are unchanged
        cell, ch, ck = GRID.action_of(i)
        assert ck == 1.0 and GRID.index(cell, ch) == i


def _chunk_weights(path) -> str:
    """The shipped weights on the chunk grid, every half-chunk action predicted 40 % faster than its cell."""
    with np.load(DEFAULT_WEIGHTS) as z:
        w = {k: z[k] for k in z.files if not k.startswith("meta_")}
    w["w3"] = np.repeat(w["w3"], len(CK_FACTORS_ON), axis=0)
    w["b3"] = np.repeat(w["b3"], len(CK_FACTORS_ON)) + np.tile([0.0, -0.5, 0.0], GRID.n)
    np.savez(path, **w)
    return str(path)


def _run(tmp_path, **policy):
    from dynamiccl.harness.retuner_eval.runner import run
    from dynamiccl.harness.retuner_eval.suite import QUICK, WORKLOADS
    from dynamiccl.harness.retuner_eval.truth import Truth
    from dynamiccl.harness.simulator.scenario import load_yaml
    from dynamiccl.harness.simulator.workload import load
    w, sc = load(WORKLOADS[2]), load_yaml(QUICK[1])
    cfg = RetunerConfig().replace(policy={"ranker": "learned", **policy})
    tmp_path.mkdir()
    res = run(w, sc, "ours", truth=Truth(w, sc, sc.duration_s), retuner_cfg=cfg, tuner_mode="python",
              workdir=str(tmp_path))
    return [c for a in res.audit if a.get("action") == "probe" and "learned" in a for c in a["candidates"]]


def test_the_learned_seam_proposes_chunks_only_when_configured_and_only_whole_grains(tmp_path):
    weights = _chunk_weights(tmp_path / "chunk.npz")
    on = _run(tmp_path / "on", learned_weights=weights, learned_chunk_choices=True)
    chunked = [Candidate.parse(c) for c in on if "/c" in c]
    assert chunked, on
    assert all(c.chunk_bytes >= CHUNK_GRAIN[c.proto] and c.chunk_bytes % CHUNK_GRAIN[c.proto] == 0 for c in chunked)
    off = _run(tmp_path / "off", learned_weights=weights)
    assert off and not any("/c" in c for c in off)


def test_train_quick_with_chunk_choices_writes_a_chunk_grid_policy(tmp_path):
    pytest.importorskip("torch")
    from dynamiccl.cli import main
    out = tmp_path / "p.npz"
    assert main(["retuner", "train", "--quick", "--chunk", "--out", str(out)]) == 0
    pol = LearnedPolicy.load(out)
    assert pol.grid == GRID_CHUNK and pol.meta["chunk_choices"] == "True"


def test_training_targets_mask_chunk_choices_below_one_grain():
    from dynamiccl.retuner.learned import train as T
    _, ys = T.dataset(12, 2, seed=3, grid=GRID_CHUNK)
    assert ys.shape == (12, GRID_CHUNK.n)
    full = ys[:, [GRID_CHUNK.index(c, 0.0, 1.0) for c in CELLS]]
    # a cell NCCL enabled always has its NCCL-chunk action; a smaller chunk may be masked (nan), never the reverse
    for i in range(GRID_CHUNK.n):
        cell, ch, ck = GRID_CHUNK.action_of(i)
        base = GRID_CHUNK.index(cell, ch, 1.0)
        assert not (np.isfinite(ys[:, i]) & ~np.isfinite(ys[:, base])).any()
    assert np.isfinite(full).any()
