"""The retuner and its own pushes: a change its push caused is ignored (a real one at that moment is not), a
version the job did not apply is published again a bounded number of times, a clearly promising first candidate
leads; and regimes recognised from the measurements before any report."""
from __future__ import annotations


import pytest

from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig

from retuner_fakejob import DEFAULT_CELL, FakeJob, actions, make, rc, run, running, simple_cost, target


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
