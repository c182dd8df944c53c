"""The learned retuning policy: numpy inference = the trained torch net, the action mask, the reward, the
held-out families kept out of training, and the agent's seam (round 1 ranked by the policy, safety unchanged)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.retuner.learned.actions import CELLS, CH_FACTORS, N_ACTIONS, action_mask
from dynamiccl.retuner.learned.families import heldout
from dynamiccl.retuner.learned.policy import DEFAULT_WEIGHTS, LearnedPolicy
from dynamiccl.retuner.learned.reward import RewardConfig, reward
from dynamiccl.retuner.learned.state import N_STATIC, SEQ, Decision, encode

torch = pytest.importorskip("torch")
from dynamiccl.retuner.learned import train as T  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    """A net trained for a few seconds, its numpy policy and the validation data."""
    torch.manual_seed(0)
    net = T._Net(8)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    ds, ys = T.dataset(24, 2, seed=5)
    xs, ss, yy = T._tensors(ds, ys)
    T._fit(net, opt, xs, ss, yy, 2, 0)
    return net, LearnedPolicy(net.export()), ds, ys


def test_numpy_inference_matches_the_torch_net(tiny):
    net, pol, ds, _ = tiny
    xs, ss, _ = T._tensors(ds, np.zeros((len(ds), N_ACTIONS)))
    with torch.no_grad():
        want = net(xs, ss).numpy()
    got = np.stack([pol.predict(*encode(d)) for d in ds])
    assert np.allclose(got, want, atol=1e-4)


def test_ranking_is_masked_to_enabled_cells_and_ordered_by_value(tiny):
    _, pol, ds, _ = tiny
    for d in ds:
        r = pol.rank(d)
        assert {x.cell for x in r} <= set(d.enabled) and len(r) == len(d.enabled) * len(CH_FACTORS)
        assert all(a.value >= b.value for a, b in zip(r, r[1:]))


def test_state_encoding_shapes_and_padding():
    d = Decision("AllReduce", 22, 16, 2, "latency", ("RING", "LL128"), 16, 2.0,
                 frozenset({("RING", "LL128"), ("TREE", "SIMPLE")}), {("TREE", "SIMPLE"): 0.5},
                 history=((0.0, 0.02, 0.0),) * 3 + ((0.69, 0.02, 0.0),), comm_name="tp_group")
    x, s = encode(d)
    assert x.shape == (N_STATIC,) and s.shape == (SEQ, 3)
    assert not s[:SEQ - 4].any() and s[-1, 0] == pytest.approx(0.69)
    assert action_mask(set(d.enabled)).sum() == 2 * len(CH_FACTORS)
    assert x[11] == 1.0                                  # role tp, from the communicator's name
    assert x[16 + 2] == 1.0                              # kind latency
    assert x[20] == pytest.approx(math.log(2.0))         # CUSUM score: |log measured change|
    assert x[23 + CELLS.index(("RING", "LL128"))] == 1.0  # last action: the incumbent's cell


def test_reward_charges_switches_probes_and_congestion():
    r = reward([1.0, 0.9, 0.9], [0, 1, 1], [0, 0, 1], 0.0, RewardConfig(switch=0.05, probe=0.1))
    assert r[0] == pytest.approx(-1.0) and r[1] == pytest.approx(-0.95) and r[2] == pytest.approx(-1.05)
    assert reward([1.0], [0], [0], 0.5)[0] < reward([1.0], [0], [0], 0.0)[0]
    with pytest.raises(ValueError, match="reward.switch"):
        RewardConfig(switch=2.0).validate()


def test_heldout_families_never_reach_training():
    h = heldout()
    train_topos = {t for ts in T.TRAIN_TOPOLOGIES.values() for t in ts}
    assert not train_topos & set(h["topologies"])
    with pytest.raises(ValueError, match="held-out seed"):
        T.TrainConfig(seed=h["seeds"][0]).validate()
    rng = np.random.default_rng(0)
    cache: dict = {}
    for stage in range(3):
        for _ in range(5):
            T.sample(rng, stage, cache)
    assert {k[0] for k in cache} <= train_topos
    assert all(k[1] == 1 for k in cache if k[0] in T.TRAIN_TOPOLOGIES[0])


def test_weights_file_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="no weights file"):
        LearnedPolicy.load(tmp_path / "none.npz")
    np.savez(tmp_path / "bad.npz", w_ih=np.zeros((4, 3)))
    with pytest.raises(ValueError, match="missing"):
        LearnedPolicy.load(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="ranker"):
        RetunerConfig().replace(policy={"ranker": "magic"}).validate()


def test_shipped_policy_loads_small_and_fast():
    assert DEFAULT_WEIGHTS.stat().st_size < 4 << 20
    pol = LearnedPolicy.load()
    d = Decision("AllReduce", 22, 16, 2, "bandwidth", ("RING", "SIMPLE"), 16, 1.8,
                 frozenset({("RING", "SIMPLE"), ("TREE", "SIMPLE"), ("RING", "LL128")}), {})
    r = pol.rank(d)
    assert r and all(math.isfinite(x.value) for x in r)


def test_agent_seam_ranks_round1_by_the_policy_and_keeps_the_deny_list(tmp_path):
    from dynamiccl.harness.simulator.scenario import load_yaml
    from dynamiccl.harness.simulator.workload import load
    from dynamiccl.harness.retuner_eval.runner import run
    from dynamiccl.harness.retuner_eval.suite import QUICK, WORKLOADS
    from dynamiccl.harness.retuner_eval.truth import Truth
    w, sc = load(WORKLOADS[2]), load_yaml(QUICK[1])
    tr = Truth(w, sc, sc.duration_s)
    cfg = RetunerConfig(deny=("TREE/LL",)).replace(policy={"ranker": "learned"})
    res = run(w, sc, "ours", truth=tr, retuner_cfg=cfg, tuner_mode="python", workdir=str(tmp_path))
    probes = [a for a in res.audit if a.get("action") == "probe" and "learned" in a]
    assert probes, "no round-1 plan came from the learned policy"
    assert all(p["learned"]["action_values"] for p in probes)
    tried = {c for p in probes for c in p.get("candidates", [])}
    assert tried and not any(c.startswith("TREE/LL/") for c in tried)
    # round 1 holds each cell at one channel count (the channel rounds refine the winner): a round of every cell
    # at three counts kept the 24 s llama run probing (0.385 of the oracle's gain on the quick suite, 0.833 without)
    for p in probes:
        cells = [c.rsplit("/", 1)[0] for c in p["candidates"] if c != "NCCL-default"]
        assert len(cells) == len(set(cells)), p["candidates"]


def test_learned_round1_with_channel_variants_is_still_selectable(tmp_path):
    from dynamiccl.harness.simulator.scenario import load_yaml
    from dynamiccl.harness.simulator.workload import load
    from dynamiccl.harness.retuner_eval.runner import run
    from dynamiccl.harness.retuner_eval.suite import QUICK, WORKLOADS
    from dynamiccl.harness.retuner_eval.truth import Truth
    w, sc = load(WORKLOADS[0]), load_yaml(QUICK[1])
    cfg = RetunerConfig().replace(policy={"ranker": "learned", "learned_cell_variants": True, "learned_extra_cells": 2})
    res = run(w, sc, "ours", truth=Truth(w, sc, sc.duration_s), retuner_cfg=cfg, tuner_mode="python",
              workdir=str(tmp_path))
    probes = [a for a in res.audit if a.get("action") == "probe" and "learned" in a]
    assert any(len({c.rsplit("/", 1)[0] for c in p["candidates"]}) < len(p["candidates"]) for p in probes)


def test_learned_start_max_rel_prunes_only_the_start_up_round(tmp_path):
    """learned_start_max_rel=1: at start-up, after the best-ranked candidate only those predicted faster than NCCL's
    choice are probed (the others are audited as skipped); a regime round keeps its candidates predicted slower."""
    from dynamiccl.harness.simulator.scenario import load_yaml
    from dynamiccl.harness.simulator.workload import load
    from dynamiccl.harness.retuner_eval.runner import run
    from dynamiccl.harness.retuner_eval.suite import QUICK, WORKLOADS
    from dynamiccl.harness.retuner_eval.truth import Truth
    w, sc = load(WORKLOADS[2]), load_yaml(QUICK[1])
    cfg = RetunerConfig().replace(policy={"ranker": "learned", "learned_start_max_rel": 1.0})
    res = run(w, sc, "ours", truth=Truth(w, sc, sc.duration_s), retuner_cfg=cfg, tuner_mode="python",
              workdir=str(tmp_path))
    starts = {a["exploration"] for a in res.audit if a.get("action") == "explore" and a.get("regime") == "start"}
    r1 = [a for a in res.audit if a.get("action") == "probe" and a.get("round") == 1 and "learned" in a]
    start_r1 = [a for a in r1 if a["exploration"] in starts]
    assert start_r1 and any("start-up" in why for a in start_r1 for why in a["skipped"].values())
    for a in start_r1:
        rel = [a["predicted_us"][c] / a["incumbent_predicted_us"] for c in a["candidates"][1:]]
        assert all(r < 1.0 for r in rel), a["candidates"]
    regime_rel = [a["predicted_us"][c] / a["incumbent_predicted_us"] for a in r1 if a["exploration"] not in starts
                  for c in a["candidates"][1:] if c in a["predicted_us"]]
    assert any(r >= 1.0 for r in regime_rel)


def test_train_subcommand_quick_writes_a_loadable_policy(tmp_path, capsys):
    from dynamiccl.cli import main
    out = tmp_path / "p.npz"
    assert main(["retuner", "train", "--quick", "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"weights={out} ") and "val_regret=" in last
    assert LearnedPolicy.load(out).meta["seed"] == "0"
    assert main(["retuner", "train", "--quick", "--out", str(out), "--seed", str(heldout()["seeds"][0])]) == 2
