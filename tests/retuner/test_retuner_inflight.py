"""One tuner version in flight (`dynamiccl.retuner.inflight`): new rules are not written while the newest version
has not been seen applied in the input (bounded by `max_in_flight_s`), so every version written is run by the job;
the gate is open for inputs without versions and after the bound."""
from __future__ import annotations

import dataclasses

import pytest

from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig

from retuner_fakejob import FakeJob, rc, simple_cost, target


def _setup(tmp_path, **policy) -> tuple[Retuner, FakeJob]:
    cfg = RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "tuner.conf"),
                        audit_path=str(tmp_path / "audit.jsonl"),
                        policy=PolicyConfig(tune_at_start=False, **policy))
    rt = Retuner(cfg, clock=lambda: 1000.0)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()],
                  simple_cost({"slow": ("TREE", "LL128", 0)}))
    return rt, job


def _pushed_then_recovery(rt: Retuner, job: FakeJob) -> int:
    """Run until a step's observations make the exploration push a version, then report the regime's recovery at
    once (before the job ran that version: the revert wants new rules). Returns the version pushed by the step."""
    for i in range(60):
        v = rt.observe(job.step())
        if i == 5:
            job.regime = "slow"
        if i == 8:
            rt.on_change(rc("rc-1", "latency", job.t))
        if i > 8 and v is not None:
            job.regime = "base"
            rt.on_change(rc("rc-2", "recovery", job.t, magnitude=0.5, recovers="rc-1"))
            assert [a["action"] for a in rt.audit.recent if a["action"] != "push"][-1] in ("abort", "revert")
            return v
    raise AssertionError("the exploration never pushed")


def test_a_new_version_waits_until_the_previous_one_ran(tmp_path):
    rt, job = _setup(tmp_path)
    v = _pushed_then_recovery(rt, job)
    assert rt.pusher.version == v                 # the revert's rules wait: v has not run yet
    for _ in range(30):
        rt.observe(job.step())
    written = {a["version"] for a in rt.audit.recent if a["action"] == "push" and a["version"] > 1}
    ran = {r[5] for r in job.ran}
    assert written <= ran, f"versions written but never run: {sorted(written - ran)}"
    assert rt.metrics.counters["pushes_held"] >= 1


def _run_without_versions(tmp_path, **policy) -> list[dict]:
    tmp_path.mkdir()
    rt, job = _setup(tmp_path, **policy)
    step = job.step
    job.step = lambda: [dataclasses.replace(o, version=None) for o in step()]
    for i in range(60):
        rt.observe(job.step())
        if i == 5:
            job.regime = "slow"
        if i == 8:
            rt.on_change(rc("rc-1", "latency", job.t))
        if i == 30:
            job.regime = "base"
            rt.on_change(rc("rc-2", "recovery", job.t, magnitude=0.5, recovers="rc-1"))
    assert rt.metrics.counters["pushes_held"] == 0
    return [{k: v for k, v in a.items() if k != "ts"} for a in rt.audit.recent]


def test_the_gate_is_open_when_the_input_carries_no_versions(tmp_path):
    """Nothing can tell applied from not: the same decisions and pushes as with the gate off."""
    on = _run_without_versions(tmp_path / "on")
    assert on == _run_without_versions(tmp_path / "off", max_in_flight_s=0.0)
    assert sum(a["action"] == "push" for a in on) >= 3


@pytest.mark.parametrize("policy, opens_s", [
    ({"max_in_flight_s": 2.0, "republish_after_s": 30.0}, 2.0),     # the bound
    ({"max_in_flight_s": 60.0, "republish_after_s": 0.5}, 0.5),     # the job showed it missed the version
])
def test_a_version_never_seen_does_not_wedge_the_retuner(tmp_path, policy, opens_s):
    """The job keeps running the version before our newest (a lost file): the new rules are written once a step
    that began republish_after_s after the push ran the older version, or after max_in_flight_s."""
    rt, job = _setup(tmp_path, **policy)
    v = _pushed_then_recovery(rt, job)
    stalled, t_push = rt.pusher.version, job.t
    job.tuner.refresh = lambda: v - 1           # every step still runs the version before v
    while rt.pusher.version == stalled and job.t < t_push + 10.0:
        rt.observe(job.step())
    assert rt.pusher.version > stalled
    assert opens_s <= job.t - t_push <= opens_s + 2 * job.step_s
