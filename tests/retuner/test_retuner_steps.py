"""A deeper or softer step of an incident the targets are in (`evidence.step`, `evidence.follows`) is the same
regime for the retuner (`dynamiccl.retuner.steps`): no abort, no new search, no push; its recovery still reverts,
and a change that is not such a step still starts a search."""
from __future__ import annotations

import dataclasses

from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig

from retuner_fakejob import DEFAULT_CELL, FakeJob, rc, simple_cost, target


def _step(id_: str, t: float, follows: str, step: str = "softer", magnitude: float = 0.8):
    return dataclasses.replace(rc(id_, "latency", t, magnitude=magnitude),
                               evidence={"step": step, "follows": follows, "ratio_to_baseline": 1.6})


def _exploring(tmp_path) -> tuple[Retuner, FakeJob]:
    """A retuner that started exploring for a latency degradation ``rc-1`` (job in it)."""
    cfg = RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "tuner.conf"),
                        audit_path=str(tmp_path / "audit.jsonl"), policy=PolicyConfig(tune_at_start=False))
    rt = Retuner(cfg, clock=lambda: 1000.0)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    for i in range(10):
        rt.observe(job.step())
        if i == 5:
            job.regime = "slow"
        if i == 8:
            rt.on_change(rc("rc-1", "latency", job.t))
    assert _actions(rt)[-1:] == ["explore"] or "probe" in _actions(rt), _actions(rt)
    return rt, job


def _actions(rt: Retuner) -> list[str]:
    return [a["action"] for a in rt.audit.recent if a["action"] != "push"]


def _pushes(rt: Retuner) -> int:
    return sum(a["action"] == "push" for a in rt.audit.recent)


def test_a_step_of_the_open_incident_keeps_the_search(tmp_path):
    rt, job = _exploring(tmp_path)
    n_explore, pushes = _actions(rt).count("explore"), _pushes(rt)
    assert rt.on_change(_step("rc-2", job.t, "rc-1")) is None          # nothing pushed for the step
    assert _pushes(rt) == pushes
    assert _actions(rt)[-1] == "ignore" and rt.audit.recent[-1]["step"] == "softer"
    assert rt.audit.recent[-1]["same_regime"] == "rc-1"
    rt.on_change(_step("rc-3", job.t + 0.5, "rc-2", step="deeper", magnitude=1.3))   # a step of the step
    assert rt.audit.recent[-1]["same_regime"] == "rc-1"
    for _ in range(40):
        rt.observe(job.step())
    acts = _actions(rt)
    assert "abort" not in acts and acts.count("explore") == n_explore, acts
    assert "commit" in acts and job.ran[-1][2:4] == ("TREE", "LL128")
    assert all(ts.regime == "rc-1" for ts in rt.targets.values())


def test_the_recovery_that_names_the_newest_step_reverts(tmp_path):
    rt, job = _exploring(tmp_path)
    rt.on_change(_step("rc-2", job.t, "rc-1"))
    for _ in range(40):
        rt.observe(job.step())
    job.regime = "base"
    rt.on_change(rc("rc-4", "recovery", job.t, magnitude=0.5, recovers="rc-2"))   # no evidence.ends
    assert _actions(rt)[-1] == "revert", _actions(rt)
    for _ in range(5):
        rt.observe(job.step())
    assert [r[2:4] for r in job.ran[-3:]] == [DEFAULT_CELL] * 3


def test_a_change_that_is_not_a_step_of_the_open_regime_still_starts_a_search(tmp_path):
    """A new incident (no step evidence), or a step following a change no target is in, is a new regime."""
    rt, job = _exploring(tmp_path)
    for change in (_step("rc-2", job.t, "rc-9"), rc("rc-3", "latency", job.t + 0.5, magnitude=1.6)):
        n = len(_actions(rt))
        rt.on_change(change)
        assert _actions(rt)[n:n + 2] == ["abort", "explore"], _actions(rt)
