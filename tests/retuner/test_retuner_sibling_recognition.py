"""Recognising the baseline on one target of a communicator switches its siblings in the same regime too: a config
first run in the regime has no baseline time, so the target running it could only wait for the detector."""
from __future__ import annotations

import pytest

from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig
from dynamiccl.retuner.types import Candidate

from retuner_fakejob import DEFAULT_CELL, FakeJob, rc, simple_cost, target


def _regime(tmp_path, targets, no_tree, report_after: int, **policy):
    """A job on ``targets`` of one communicator, 20 baseline steps, then "slow" (TREE/LL128 1.3x faster, not
    applicable to ``no_tree``), reported after ``report_after`` steps, explored for 36 more."""
    cfg = RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "tuner.conf"),
                        audit_path=str(tmp_path / "audit.jsonl"), policy=PolicyConfig(tune_at_start=False, **policy))
    rt = Retuner(cfg, clock=lambda: 1000.0)
    job = FakeJob(str(tmp_path / "tuner.conf"), targets, simple_cost({"slow": ("TREE", "LL128", 0)}))
    for _ in range(20):
        rt.observe(job.step())
    rt.targets[no_tree.key].unapplicable.add(Candidate("TREE", "LL128", 0))
    onset = job.t
    job.regime = "slow"
    for i in range(report_after + 36):
        rt.observe(job.step())
        if i == report_after:
            rt.on_change(rc("rc-1", "latency", onset + 1.0))
    return rt, job


def _recovered(rt, job, steps: int = 3) -> list[dict]:
    job.regime = "base"                     # the network recovers; no detector report yet
    for _ in range(steps):
        rt.observe(job.step())
    return [x for x in rt.audit.recent if x["action"] == "revert" and x.get("recognized") is True]


def _job_in_regime(tmp_path, **policy):
    """Two targets of one communicator: the 24 bucket commits TREE/LL128 in "slow" (never run before the regime);
    the 20 bucket cannot apply it and keeps NCCL's choice, whose baseline time is known."""
    a, b = target(bucket=24), target(bucket=20)
    rt, job = _regime(tmp_path, [a, b], b, 3, **policy)
    assert rt.targets[a.key].active == Candidate("TREE", "LL128", 0) and rt.targets[b.key].active is None
    return rt, job, a, b, _recovered(rt, job)


def _last_cell(job: FakeJob, key) -> tuple[str, str]:
    r = [x for x in job.ran if x[1] == key][-1]
    return (r[2], r[3])


def test_the_baseline_recognised_on_one_target_reverts_its_sibling_that_cannot_recognise_it(tmp_path):
    rt, job, a, b, revs = _job_in_regime(tmp_path)
    assert [x["target"] for x in revs] == [rt.targets[b.key].target.comm_name + "/AllReduce/20",
                                           rt.targets[a.key].target.comm_name + "/AllReduce/24"]
    assert revs[1]["via"] == revs[0]["target"] and revs[1]["was"] == "TREE/LL128/0"
    assert _last_cell(job, a.key) == DEFAULT_CELL and rt.targets[a.key].regime is None
    assert not any(x["action"] == "unrecognize" for x in rt.audit.recent)


def test_without_siblings_the_target_running_a_regime_only_config_stays_in_it(tmp_path):
    rt, job, a, b, revs = _job_in_regime(tmp_path, recognize_siblings=False)
    assert len(revs) == 1 and revs[0]["target"].endswith("/AllReduce/20")
    assert _last_cell(job, a.key) == ("TREE", "LL128") and rt.targets[a.key].regime == "rc-1"


def test_the_baseline_signature_outlives_a_detection_delay_longer_than_the_signature(tmp_path):
    """NCCL's choice runs through 40 regime steps before the report (the signature keeps the newest 32): its
    baseline time must survive the move, so the recovery is still recognised from the measurements."""
    t = target()
    rt, job = _regime(tmp_path, [t], t, 40)
    assert rt.targets[t.key].active is None and rt.targets[t.key].regime == "rc-1"
    revs = _recovered(rt, job)
    assert len(revs) == 1 and revs[0]["recognized_regime_s"] == pytest.approx(1e-3, rel=0.03)
    assert rt.targets[t.key].regime is None
