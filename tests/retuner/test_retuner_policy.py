"""The retuner's decisions on a synthetic job whose costs are known: explore → commit, roll back, revert on
recovery, reuse on recurrence, hysteresis/cooldown, exploration budget, a config the plugin cannot apply."""
from __future__ import annotations

import json

import pytest

from dynamiccl.nccl_tuner_plugin.config import read_configs
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig

from retuner_fakejob import DEFAULT_CELL, FakeJob, actions, make, rc, run, running, simple_cost, target


def test_explores_commits_the_fast_config_and_writes_it(tmp_path):
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    run(rt, job, 40, {10: "slow", 12: rc("rc-1", "latency", job.step_s * 13)})
    acts = actions(rt)
    assert acts.index("explore") < acts.index("probe") < acts.index("commit")
    assert running(job, 5) == [("TREE", "LL128")] * 5
    rules = read_configs(tmp_path / "tuner.conf")[-1].rules
    assert [(r.algo, r.proto, r.comm_hash) for r in rules] == [("TREE", "LL128", 0x1f)]
    m = rt.metrics
    assert m.decisions["commit"] == 1 and m.counters["pushes"] >= 3 and m.version == rt.pusher.version
    (gain,) = m.gain.values()
    assert gain == pytest.approx(1.3, rel=0.03)
    # the audit file holds the same decisions, one JSON object per line
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [x["action"] for x in lines if x["action"] != "push"] == acts
    assert sum(x["action"] == "push" for x in lines) == m.counters["pushes"]


def test_dry_run_recommends_and_writes_nothing(tmp_path):
    rt = make(tmp_path, dry_run=True)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    run(rt, job, 20, {5: "slow", 8: rc("rc-1", "latency", 2.25)})
    assert not (tmp_path / "tuner.conf").exists()
    assert "recommend" in actions(rt) and "commit" not in actions(rt)
    assert rt.metrics.dry_run == 1 and rt.metrics.counters["pushes"] == 0
    assert set(running(job, 20)) == {DEFAULT_CELL}


def test_rollback_when_the_committed_config_turns_out_slower(tmp_path):
    """TREE/SIMPLE is fast while explored, slower than before once committed (e.g. interference)."""
    state = {"committed": False}
    base = simple_cost({"slow": ("TREE", "SIMPLE", 0)})

    def cost(regime, algo, proto, nch):
        if (algo, proto) == ("TREE", "SIMPLE") and regime == "slow" and state["committed"]:
            return base(regime, *DEFAULT_CELL, 0) * 1.2
        return base(regime, algo, proto, nch)

    rt = make(tmp_path, policy=PolicyConfig(tune_at_start=False, max_cells=1))
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], cost)
    job.regime = "slow"
    for i in range(40):
        rt.observe(job.step())
        if i == 5:
            rt.on_change(rc("rc-1", "latency", job.t))
        state["committed"] = "commit" in actions(rt)
    acts = actions(rt)
    assert "commit" in acts and "rollback" in acts and acts.index("commit") < acts.index("rollback")
    assert rt.metrics.counters["rollbacks"] == 1
    assert running(job, 5) == [DEFAULT_CELL] * 5
    assert read_configs(tmp_path / "tuner.conf")[-1].rules == ()


def test_recovery_reverts_and_a_recurrence_reuses_at_once(tmp_path):
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    first = rc("rc-1", "latency", 2.25)
    run(rt, job, 60, {5: "slow", 8: first, 40: "base", 42: rc("rc-2", "recovery", 10.75, magnitude=0.5, recovers="rc-1")})
    assert "revert" in actions(rt)
    assert running(job, 5) == [DEFAULT_CELL] * 5
    n_probe = actions(rt).count("probe")
    # the same regime again: the remembered config is applied on the next step, no exploration
    job.regime = "slow"
    rt.on_change(rc("rc-3", "latency", job.t + 0.5, magnitude=2.1))
    run(rt, job, 10)
    assert actions(rt).count("probe") == n_probe
    assert "reuse" in actions(rt)
    assert running(job, 10) == [("TREE", "LL128")] * 10


def test_hysteresis_cooldown_and_kinds_that_are_not_tuned(tmp_path):
    rt = make(tmp_path, policy=PolicyConfig(tune_at_start=False, cooldown_s=100.0))
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    run(rt, job, 6)
    rt.on_change(rc("small", "latency", 1.5, magnitude=1.05))          # below min_change (10 %)
    rt.on_change(rc("strag", "straggler", 1.5, magnitude=3.0))         # not a configuration problem
    rt.on_change(rc("flap", "flapping", 1.5, magnitude=3.0))           # nothing remembered: no exploration
    assert actions(rt) == ["ignore", "ignore", "ignore"]
    job.regime = "slow"
    rt.on_change(rc("rc-1", "latency", 2.0))
    run(rt, job, 30)
    assert "commit" in actions(rt)
    job.regime = "slow2"
    rt.on_change(rc("rc-2", "bandwidth", job.t, magnitude=1.5))        # a new regime inside the cooldown
    assert actions(rt)[-1] == "ignore" and "cooldown" in rt.audit.recent[-1]["reason"]


def test_budget_bounds_the_exploration_cost(tmp_path):
    def cost(regime, algo, proto, nch):               # every alternative is 3x slower: exploring only costs
        return 1e-3 if (algo, proto) == DEFAULT_CELL else 3e-3

    (tmp_path / "a").mkdir()
    zero = make(tmp_path / "a", policy=PolicyConfig(tune_at_start=False, exploration_budget=0.0))
    job = FakeJob(str(tmp_path / "a" / "tuner.conf"), [target()], cost)
    run(zero, job, 30, {3: rc("rc-1", "latency", 1.0)})
    assert set(running(job, 30)) == {DEFAULT_CELL} and zero.metrics.counters["excess_s"] == 0.0

    (tmp_path / "b").mkdir()
    rt = make(tmp_path / "b", policy=PolicyConfig(tune_at_start=False, exploration_budget=0.05))
    job = FakeJob(str(tmp_path / "b" / "tuner.conf"), [target()], cost)
    run(rt, job, 200, {3: rc("rc-1", "latency", 1.0)})
    probe_cost = job.n_per_step * 2e-3                 # one probe step of one candidate
    assert 0 < rt.metrics.counters["excess_s"] <= 0.05 * rt.total_s + probe_cost
    assert "keep" in actions(rt) and running(job, 5) == [DEFAULT_CELL] * 5


def test_a_config_the_plugin_cannot_apply_is_detected_and_not_retried(tmp_path):
    rt = make(tmp_path, policy=PolicyConfig(tune_at_start=False, max_cells=2))
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("RING", "LL128", 0)}),
                  disabled=(("TREE", "SIMPLE"),))          # NCCL disabled TREE/SIMPLE: the plugin never revives it
    run(rt, job, 30, {3: "slow", 5: rc("rc-1", "latency", 1.5)})
    assert "unapplicable" in actions(rt)
    (bad,) = [a for a in rt.audit.recent if a["action"] == "unapplicable"]
    assert bad["candidate"] == "TREE/SIMPLE/0"
    assert ("TREE", "SIMPLE") not in {(r[2], r[3]) for r in job.ran}   # the job never ran it
    assert running(job, 3) == [("RING", "LL128")] * 3


def test_cohort_explores_candidates_in_parallel_over_equivalent_comms(tmp_path):
    tgs = [target(h) for h in (0x11, 0x12, 0x13, 0x14)]
    rt = make(tmp_path, policy=PolicyConfig(tune_at_start=False, probe_parallel=4))
    job = FakeJob(str(tmp_path / "tuner.conf"), tgs, simple_cost({"slow": ("TREE", "LL128", 0)}))
    run(rt, job, 4)
    job.regime = "slow"
    rt.on_change(rc("rc-1", "latency", job.t, comms=[f"0x{h:x}" for h in (0x11, 0x12, 0x13, 0x14)]))
    step_of_commit = None
    for i in range(20):
        rt.observe(job.step())
        if step_of_commit is None and "commit" in actions(rt):
            step_of_commit = i
    # 4 candidates measured side by side in one step (plus the incumbent's), not one step each
    assert step_of_commit is not None and step_of_commit <= 3
    assert actions(rt).count("explore") == 1
    assert {(r[2], r[3]) for r in job.ran[-4:]} == {("TREE", "LL128")}


def test_allow_and_deny_lists_and_pins(tmp_path):
    rt = make(tmp_path, deny=("TREE/*",), pins=())
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    run(rt, job, 30, {3: "slow", 5: rc("rc-1", "latency", 1.5)})
    assert not any(r[2] == "TREE" for r in job.ran)

    from dynamiccl.retuner.config import Pin
    (tmp_path / "p").mkdir()
    rt = make(tmp_path / "p", pins=(Pin("AllReduce", "RING", "LL", 2, comm="0x1f"),))
    job = FakeJob(str(tmp_path / "p" / "tuner.conf"), [target()], simple_cost({}))
    run(rt, job, 5)
    assert running(job, 3) == [("RING", "LL")] * 3
    assert read_configs(tmp_path / "p" / "tuner.conf")[-1].rules[0].n_channels == 2


def test_start_up_tuning_sets_the_baseline(tmp_path):
    rt = make(tmp_path, policy=PolicyConfig(tune_at_start=True))
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"base": ("RING", "LL", 0)}))
    run(rt, job, 40)
    assert running(job, 3) == [("RING", "LL")] * 3
    (st,) = rt.status()
    assert st["baseline"] == "RING/LL/0" and st["active"] == "RING/LL/0"


def _committed_slower_than_default_job(tmp_path):
    """Start-up commits TREE/LL128 (1.3x faster than NCCL's RING/SIMPLE); the regime then makes it 1.5x slower than
    NCCL's choice and every other cell 1.15x slower. RING/SIMPLE is denied, so only NCCL's default gets it back."""
    def cost(regime, algo, proto, nch):
        if (algo, proto) == ("TREE", "LL128"):
            return 1e-3 / 1.3 if regime == "base" else 2e-3 * 1.5
        f = 1e-3 if regime == "base" else 2e-3
        return f if (algo, proto) == DEFAULT_CELL else f * 1.15
    return FakeJob(str(tmp_path / "tuner.conf"), [target()], cost)


@pytest.mark.parametrize("default_probe,families,back_to_default",
                         [(True, 2, True), (True, 0, True), (False, 0, False), (False, 2, False)])
def test_after_a_regime_change_nccls_default_is_probed_and_a_slower_config_is_not_kept(
        tmp_path, default_probe, families, back_to_default):
    pol = PolicyConfig(max_cells=1, channel_rounds=0, regime_default_probe=default_probe,
                       regime_family_probes=families)
    rt = make(tmp_path, policy=pol, deny=("RING/SIMPLE",))
    job = _committed_slower_than_default_job(tmp_path)
    run(rt, job, 40)
    assert running(job) == [("TREE", "LL128")]                  # the start-up round committed it
    job.regime = "slow"
    run(rt, job, 4)
    rt.on_change(rc("rc-1", "latency", job.t))
    run(rt, job, 80)
    probes = [a for a in rt.audit.recent if a["action"] == "probe" and a.get("round") == 1]
    assert ("NCCL-default" in probes[-1]["candidates"]) is default_probe
    assert (running(job, 5) == [DEFAULT_CELL] * 5) is back_to_default
    if back_to_default:
        assert read_configs(tmp_path / "tuner.conf")[-1].rules == ()


def test_regime_probes_cover_the_protocols_and_algorithms_the_round_lacks(tmp_path):
    from dynamiccl.retuner.planner import Plan, Planner
    from dynamiccl.retuner.types import Candidate
    cfg = RetunerConfig(deny=("TREE/LL",))
    inc = Candidate("TREE", "LL128", 4)
    plan = Plan([Candidate("TREE", "LL128", 2)])
    probes = Planner(cfg).diverse(target(), plan, incumbent=inc, inc_cell=("TREE", "LL128"),
                                  unapplicable={Candidate("RING", "SIMPLE", 0)}, max_families=3)
    # NCCL's default first; then one cell per missing protocol (LL: TREE/LL denied; SIMPLE: RING/SIMPLE cannot apply),
    # then the missing algorithm is covered already (RING) and the cap is not reached
    assert probes == [None, Candidate("TREE", "SIMPLE", 0), Candidate("RING", "LL", 0)]
    assert Planner(cfg).diverse(target(), plan, incumbent=None, inc_cell=("TREE", "LL128"), unapplicable=set(),
                                max_families=0) == []


def test_misjudged_names_a_cell_that_ran_much_faster_than_the_refitted_model_said():
    from dynamiccl.retuner.explore import Exploration
    from dynamiccl.retuner.stats import Running
    from dynamiccl.retuner.types import Candidate
    pol = PolicyConfig(min_samples=4)
    inc = Candidate("TREE", "LL128", 0)
    x = Exploration("x1", trigger="rc-1", kind="latency", members=[target()], incumbent=inc, policy=pol,
                    fingerprint=("latency", ("0x1f",), 2.0), t_start=0.0)
    x.default_cell = ("RING", "LL128")
    x.model_ranked = [(("TREE", "LL128"), 1000.0), (("RING", "LL128"), 1830.0), (("RING", "SIMPLE"), 4450.0)]
    x.model_inc_pred_us = 1000.0
    x.stats[inc] = Running(n=64, mean=1e-3, m2=0.0)
    x.stats[Candidate("RING", "SIMPLE", 0)] = Running(n=64, mean=4e-3, m2=0.0)   # 0.9x its prediction: fine
    x.stats[Candidate("RING", "SIMPLE", 8)] = Running(n=64, mean=1e-4, m2=0.0)   # a channel variant: no prediction
    assert x.misjudged(1.5) is None
    x.stats[None] = Running(n=2, mean=0.68e-3, m2=0.0)                           # too few samples yet
    assert x.misjudged(1.5) is None
    x.stats[None] = Running(n=64, mean=0.68e-3, m2=0.0)                          # NCCL's default: 0.37x predicted
    assert x.misjudged(1.5) == "NCCL-default measured 0.37x its predicted time"
    assert x.misjudged(3.0) is None


@pytest.mark.parametrize("after_s", [None, 1.5])
def test_start_up_tuning_begins_after_start_after_s(tmp_path, after_s):
    """Each second before start-up tuning is a second at NCCL's choice: it begins once the target has been seen
    ``start_after_s`` (default 0: ``min_samples`` gates it), not later."""
    pol = PolicyConfig(tune_at_start=True) if after_s is None else PolicyConfig(tune_at_start=True,
                                                                                start_after_s=after_s)
    rt = make(tmp_path, policy=pol)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"base": ("RING", "LL", 0)}))
    run(rt, job, 12)
    t_explore = next(a["t"] for a in rt.audit.recent if a["action"] == "explore")
    want = pol.start_after_s
    assert want <= t_explore <= want + 2 * job.step_s


def test_start_up_tuning_begins_once_a_target_has_min_samples_not_after_a_fixed_wait(tmp_path):
    """A job with 20 ms steps: after its first step the heavy target has 64 measurements (>= min_samples) and
    is the only op, so its share is known; every step waited runs NCCL's choice (the reactive reference
    runs the baseline's best config from t = 0)."""
    rt = make(tmp_path, policy=PolicyConfig(tune_at_start=True))
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"base": ("RING", "LL", 0)}), step_s=0.02)
    run(rt, job, 2)
    assert "explore" in actions(rt)
