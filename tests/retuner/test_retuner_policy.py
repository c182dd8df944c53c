"""The retuner's decisions on a synthetic job whose costs are known: explore → commit, roll back, revert on
recovery, reuse on recurrence, hysteresis/cooldown, exploration budget, a config the plugin cannot apply."""
from __future__ import annotations

import json

import pytest

from dynamiccl.nccl_tuner_plugin.config import read_configs
from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig

from retuner_fakejob import DEFAULT_CELL, FakeJob, rc, simple_cost, target


def make(tmp_path, *, dry_run=False, policy=None, **kw) -> Retuner:
    pol = policy or PolicyConfig(tune_at_start=False)
    cfg = RetunerConfig(dry_run=dry_run, tuner_config_path=str(tmp_path / "tuner.conf"),
                        audit_path=str(tmp_path / "audit.jsonl"), policy=pol, **kw)
    return Retuner(cfg, clock=lambda: 1000.0)


def run(rt: Retuner, job: FakeJob, steps: int, events: dict[int, object] = {}) -> None:
    for i in range(steps):
        rt.observe(job.step())
        if i in events:
            ev = events[i]
            if isinstance(ev, str):
                job.regime = ev
            else:
                rt.on_change(ev)


def actions(rt: Retuner) -> list[str]:
    """Decisions (the audit log also records every push)."""
    return [a["action"] for a in rt.audit.recent if a["action"] != "push"]


def running(job: FakeJob, last: int = 1) -> list[tuple[str, str]]:
    return [(r[2], r[3]) for r in job.ran[-last:]]


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


def _run_until_commit(rt: Retuner, job: FakeJob, *, then=None, limit: int = 80) -> float:
    """Steps the job until the retuner commits; returns the event time of the push that applied the commit."""
    from dynamiccl.detector.events import RegimeChange
    first = RegimeChange(id="rc-1", kind="latency", job_id="job", start_s=1.25, detected_s=1.75, magnitude=2.0,
                         comms=["0x1f"])
    run(rt, job, 10, {4: "slow", 6: first})                # slow from the step starting at 1.25 s
    for _ in range(limit):
        rt.observe(job.step())
        if "commit" in actions(rt):
            break
    assert "commit" in actions(rt)
    if then:
        then()
    ts = rt.targets[job.targets[0].key]
    t_push, cand = ts.applies[-1]
    assert cand is not None and (cand.algo, cand.proto) == ("TREE", "LL128")
    return t_push


def test_a_change_caused_by_our_own_push_is_ignored(tmp_path):
    """The detector sees the speed-up our commit causes (new/old ≈ 1/1.3, onset at the push): the retuner
    recognises its own push, audits the change as ignored (self-induced) and neither explores nor reverts."""
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    t_push = _run_until_commit(rt, job)
    run(rt, job, 8)                                            # detection delay; verify confirms meanwhile
    n_explore = actions(rt).count("explore")
    from dynamiccl.detector.events import RegimeChange
    own = RegimeChange(id="own", kind="bandwidth", job_id="job", start_s=t_push, detected_s=job.t,
                       magnitude=1 / 1.3, comms=["0x1f"])
    rt.on_change(own)
    last = rt.audit.recent[-1]
    assert last["action"] == "ignore" and last["self_induced"] is True and last["regime"] == "own"
    assert last["pushes"][0]["now"].startswith("TREE/LL128") and last["expected_ratio"][0] == pytest.approx(1 / 1.3, rel=0.05)
    rt.on_change(rc("own-end", "recovery", job.t + 1, magnitude=1.3, recovers="own"))
    assert rt.audit.recent[-1]["action"] == "ignore" and rt.audit.recent[-1]["self_induced"] is True
    run(rt, job, 5)
    assert actions(rt).count("explore") == n_explore and "revert" not in actions(rt)
    assert running(job, 3) == [("TREE", "LL128")] * 3


def test_a_recovery_that_also_ends_the_regime_under_our_own_change_reverts(tmp_path):
    """The detector tracks our own change (the commit's speed-up) and the regime it came in as one incident: at the
    regime's end its recovery names the newest change (ours) in ``recovers`` and both in ``evidence["ends"]``. That
    is the regime's end, so the kept config is reverted (the demo kept Ring/LL128 after the latency regime before)."""
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    t_push = _run_until_commit(rt, job)
    run(rt, job, 8)
    from dynamiccl.detector.events import RegimeChange
    own = RegimeChange(id="own", kind="bandwidth", job_id="job", start_s=t_push, detected_s=job.t,
                       magnitude=1 / 1.3, comms=["0x1f"])
    rt.on_change(own)
    assert rt.audit.recent[-1]["self_induced"] is True
    end = rc("end", "recovery", job.t + 1, magnitude=0.5, recovers="own")
    end.evidence["ends"] = ["rc-1", "own"]
    rt.on_change(end)
    reverts = [a for a in rt.audit.recent if a["action"] == "revert"]
    assert reverts and reverts[-1]["recovers"] == "own" and reverts[-1]["regime"] == "end"
    assert reverts[-1]["was"].startswith("TREE/LL128") and reverts[-1]["now"] == "NCCL-default"


def test_a_real_change_at_the_moment_of_our_push_is_not_ignored(tmp_path):
    """The network slows down (×1.5 for every config) exactly when the commit is applied: a config measured
    before and after the onset shows it, so the change is genuine and handled (here: cooldown after the
    commit's verification), not filed as self-induced."""
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    t_push = _run_until_commit(rt, job, then=lambda: setattr(job, "regime", "slow2"))
    run(rt, job, 8)
    from dynamiccl.detector.events import RegimeChange
    real = RegimeChange(id="real", kind="bandwidth", job_id="job", start_s=t_push - 0.4, detected_s=job.t,
                        magnitude=1.5, comms=["0x1f"])
    rt.on_change(real)
    mine = [a for a in rt.audit.recent if a.get("regime") == "real"]
    assert mine and not any(a.get("self_induced") for a in mine)


def test_a_change_too_small_to_explain_is_not_filed_as_self_induced(tmp_path):
    """A change within the hysteresis (|magnitude − 1| < min_change) whose onset meets our push is not evidence that
    the push caused anything: it is not filed as self-induced (the held-out p5 bandwidth drop, magnitude 1.0, was),
    and a recovery of that size still reverts the regime it ends."""
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    t_push = _run_until_commit(rt, job)
    run(rt, job, 8)
    from dynamiccl.detector.events import RegimeChange
    flat = RegimeChange(id="flat", kind="bandwidth", job_id="job", start_s=t_push, detected_s=job.t,
                        magnitude=1.0, comms=["0x1f"])
    rt.on_change(flat)
    last = rt.audit.recent[-1]
    assert last["regime"] == "flat" and last["action"] == "ignore" and not last.get("self_induced")
    assert "hysteresis" in last["reason"]
    end = RegimeChange(id="end", kind="recovery", job_id="job", start_s=t_push, detected_s=job.t,
                       magnitude=1.02, comms=[], recovers="rc-1")
    rt.on_change(end)
    reverts = [a for a in rt.audit.recent if a["action"] == "revert"]
    assert reverts and reverts[-1]["regime"] == "end" and reverts[-1]["now"] == "NCCL-default"


def test_unmeasured_candidates_start_one_at_a_time_by_default(tmp_path):
    """``probe_parallel`` = 1: a cohort starts at most one never-measured candidate per step (best predicted
    first), so the first results can prune the rest before each costs a step on a member."""
    tgs = [target(h) for h in (0x11, 0x12, 0x13, 0x14)]
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), tgs, simple_cost({"slow": ("TREE", "LL128", 0)}))
    run(rt, job, 4)
    job.regime = "slow"
    rt.on_change(rc("rc-1", "latency", job.t, comms=[f"0x{h:x}" for h in (0x11, 0x12, 0x13, 0x14)]))
    seen = {DEFAULT_CELL}
    n0 = len(job.ran)
    for _ in range(30):
        rt.observe(job.step())
        step = {(r[2], r[3]) for r in job.ran[-len(tgs):]}
        assert len(step - seen) <= 1, step - seen
        seen |= step
    assert len(job.ran) > n0 and "commit" in actions(rt)
    assert {(r[2], r[3]) for r in job.ran[-4:]} == {("TREE", "LL128")}


def test_a_version_the_job_did_not_apply_is_published_again_a_bounded_number_of_times(tmp_path):
    # a rank's copy of the file was lost: the job's steps keep reporting the old version after our push
    # (in process: the job gets a push at the event time it is written, so no lag allowance)
    rt = make(tmp_path, policy=PolicyConfig(tune_at_start=False, republish_after_s=0.0))
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    run(rt, job, 12, {10: "slow"})
    deliver = job.tuner.refresh
    v0 = job.tuner.refresh()
    job.tuner.refresh = lambda: v0                 # nothing new reaches the job
    rt.on_change(rc("rc-1", "latency", job.t))
    run(rt, job, 10)
    pushes = [a for a in rt.audit.recent if a["action"] == "push" and a["version"] > v0]
    again = [a for a in pushes if a.get("republish")]
    assert again, "a stale version must be published again"
    # bounded: at most max_republish re-publications per set of rules (a new set of rules restarts the count)
    assert max(a["republish"] for a in again) <= rt.policy.max_republish
    assert len(again) <= rt.policy.max_republish * (len(pushes) - len(again))
    assert all(v == v0 for *_, v in job.ran[-10:])
    job.tuner.refresh = deliver                    # delivery works again: the exploration goes on and commits
    run(rt, job, 60)
    assert "commit" in actions(rt)
    assert running(job, 3) == [("TREE", "LL128")] * 3


@pytest.mark.parametrize("policy", [
    # a live pipeline's input trails the job by window + lateness: steps that began in that time after a push
    # legitimately ran the old version, so nothing is republished while the delivery is working
    PolicyConfig(tune_at_start=False, republish_after_s=1e6),
    PolicyConfig(tune_at_start=False, max_republish=0),            # switched off
], ids=["within-pipeline-lag", "disabled"])
def test_no_republish(tmp_path, policy):
    rt = make(tmp_path, policy=policy)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    run(rt, job, 12, {10: "slow"})
    v0 = job.tuner.refresh()
    job.tuner.refresh = lambda: v0
    rt.on_change(rc("rc-1", "latency", job.t))
    run(rt, job, 10)
    assert not [a for a in rt.audit.recent if a["action"] == "push" and a.get("republish")]


def _lead_exploration(pred_us: float, *, lead_share: float = 0.5):
    from dynamiccl.retuner.explore import Exploration
    from dynamiccl.retuner.types import Candidate
    pol = PolicyConfig(lead_share=lead_share)
    members = [target(h) for h in (0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18)]
    x = Exploration("x1", trigger="rc-1", kind="latency", members=members, incumbent=None, policy=pol,
                    fingerprint=("latency", ("0x11",), 2.0), t_start=0.0)
    for m in members:                                   # the incumbent measured in the new regime: 1.5 ms
        x.record(m.key, None, 64, 1.5e-3, (0.02 * 1.5e-3) ** 2, 1.0)
    a, b = Candidate("RING", "LL128"), Candidate("TREE", "LL128")
    x.pred_us, x.inc_pred_us = {a: pred_us, b: 2000.0}, 1500.0
    x.start_round([a, b])
    return x, a


def test_a_clearly_promising_first_candidate_starts_on_half_the_cohort():
    x, a = _lead_exploration(1000.0)                    # predicted 0.67x the incumbent's measured time
    assert list(x.assign(allow_probe=True).values()).count(a) == 4
    x, a = _lead_exploration(1400.0)                    # 0.93x: not clearly better, one member as usual
    assert list(x.assign(allow_probe=True).values()).count(a) == 1
    x, a = _lead_exploration(1000.0, lead_share=0.0)    # disabled
    assert list(x.assign(allow_probe=True).values()).count(a) == 1


def _regime_cycle(rt: Retuner, job: FakeJob) -> None:
    """Start-up tuning, then the "slow" regime (reported by the detector), explored and committed."""
    run(rt, job, 40)
    onset = job.t
    run(rt, job, 40, {0: "slow", 4: rc("rc-1", "latency", onset + 1.0)})
    assert "commit" in actions(rt) and running(job, 3) == [("TREE", "LL128")] * 3


def _recognised(rt: Retuner) -> list[dict]:
    return [a for a in rt.audit.recent if a.get("recognized") is True and a["action"] in ("revert", "reuse")]


def test_the_baseline_and_a_known_regime_are_recognised_from_the_measurements_before_any_report(tmp_path):
    """TREE/LL128 measured 1.15 ms at start-up and 1.54 ms in "slow": when it measures 1.15 ms again the baseline
    is back (revert at once); when NCCL's choice then measures its "slow" time again, the regime is back (its
    remembered config at once). The detector's later reports of the same changes are adopted, not acted on."""
    rt = make(tmp_path, policy=PolicyConfig(tune_at_start=True))
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    _regime_cycle(rt, job)
    n_probe, n_explore = actions(rt).count("probe"), actions(rt).count("explore")
    run(rt, job, 4, {0: "base"})                          # no report: recognised from two observations
    (rev,) = _recognised(rt)
    assert rev["action"] == "revert" and rev["recovers"] == "rc-1" and rev["now"] == "NCCL-default"
    assert rev["config"] == "TREE/LL128/0" and rev["recognized_regime_s"] == pytest.approx(1.15e-3, rel=0.03)
    assert running(job, 1) == [DEFAULT_CELL]
    t_base = job.t
    run(rt, job, 16)
    rt.on_change(rc("rc-2", "recovery", t_base, magnitude=0.5, recovers="rc-1"))   # the detector, later
    assert rt.audit.recent[-1]["action"] == "ignore" and rt.audit.recent[-1]["recognized"] is True
    onset = job.t
    run(rt, job, 4, {0: "slow"})
    reuse = _recognised(rt)[-1]
    assert reuse["action"] == "reuse" and reuse["candidate"] == "TREE/LL128/0" and reuse["config"] == "NCCL-default"
    assert reuse["onset_s"] == pytest.approx(onset + job.step_s)      # the first step wholly in the regime
    assert running(job, 1) == [("TREE", "LL128")]
    run(rt, job, 4, {2: rc("rc-3", "latency", onset + 1.0)})
    adopt = [a for a in rt.audit.recent if a.get("regime") == "rc-3"]
    assert [a["action"] for a in adopt] == ["ignore"] and adopt[0]["recognized"] is True
    assert not any(a.get("self_induced") for a in rt.audit.recent)
    assert rt.targets[target().key].regime == "rc-3"                  # so the detector's recovery finds it
    assert (actions(rt).count("probe"), actions(rt).count("explore")) == (n_probe, n_explore)
    assert running(job, 4) == [("TREE", "LL128")] * 4


def test_a_wrong_recognition_is_undone_at_once_and_an_unknown_regime_or_recognize_off_is_not_acted_on(tmp_path):
    rt = make(tmp_path, policy=PolicyConfig(tune_at_start=True))
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    _regime_cycle(rt, job)
    n = len(job.ran)
    run(rt, job, 6, {0: "base", 1: "slow"})               # one odd step that looks like the baseline
    (rev,) = _recognised(rt)
    assert rev["action"] == "revert"
    undo = rt.audit.recent[-2] if rt.audit.recent[-1]["action"] == "push" else rt.audit.recent[-1]
    assert undo["action"] == "unrecognize" and undo["now"] == "TREE/LL128/0" and undo["regime"] == "rc-1"
    # NCCL's choice measured its "slow" time (2 ms), not its baseline time: one step on it, then TREE/LL128 again
    assert [(r[2], r[3]) for r in job.ran[n:]] == [("TREE", "LL128"), ("TREE", "LL128"), DEFAULT_CELL] + \
        [("TREE", "LL128")] * 3
    assert rt.targets[target().key].regime == "rc-1"     # the detector's recovery still finds it
    run(rt, job, 10, {0: "slow2"})                        # a regime never seen: left to the detector
    assert len(_recognised(rt)) == 1 and running(job, 1) == [("TREE", "LL128")]
    (tmp_path / "off").mkdir()
    off = make(tmp_path / "off", policy=PolicyConfig(tune_at_start=True, recognize=False))
    job2 = FakeJob(str(tmp_path / "off" / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    _regime_cycle(off, job2)
    run(off, job2, 10, {0: "base"})
    assert _recognised(off) == [] and running(job2, 1) == [("TREE", "LL128")]


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
