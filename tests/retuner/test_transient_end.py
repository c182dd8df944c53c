"""A transient's end (`dynamiccl.detector.events.TransientEnd`, handed by the loop, never on the change
stream) is triaged as the recovery it stands for: what the retuner chose for the excursion reverts."""
from __future__ import annotations

from dynamiccl.detector.events import TransientEnd
from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig

from retuner_fakejob import DEFAULT_CELL, FakeJob, rc, simple_cost, target


def _committed(tmp_path) -> tuple[Retuner, FakeJob]:
    """A retuner that explored and committed TREE/LL128 for a degradation ``rc-1`` (job now in it)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "tuner.conf"),
                        audit_path=str(tmp_path / "audit.jsonl"), policy=PolicyConfig(tune_at_start=False))
    rt = Retuner(cfg, clock=lambda: 1000.0)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    for i in range(40):
        rt.observe(job.step())
        if i == 5:
            job.regime = "slow"
        if i == 8:
            rt.on_change(rc("rc-1", "latency", job.t))
    assert "commit" in _actions(rt), _actions(rt)
    assert job.ran[-1][2:4] == ("TREE", "LL128")
    job.regime = "base"
    for _ in range(4):
        rt.observe(job.step())
    return rt, job


def _actions(rt: Retuner) -> list[str]:
    return [a["action"] for a in rt.audit.recent if a["action"] != "push"]


def _end(job: FakeJob, ends=("rc-1",)) -> TransientEnd:
    return TransientEnd(id="rc-1.end", job_id="job", ends=tuple(ends), start_s=job.t - 1.0, detected_s=job.t,
                        magnitude=0.5, comms=("0x1f",), comm_names=("dp0",))


def _running_after(rt: Retuner, job: FakeJob, n: int = 5) -> list[tuple[str, str]]:
    for _ in range(n):
        rt.observe(job.step())
    return [r[2:4] for r in job.ran[-n:]]


def test_a_committed_choice_reverts_when_its_transient_ends(tmp_path):
    rt, job = _committed(tmp_path)
    rt.on_transient_end(_end(job))
    assert _actions(rt)[-1] == "revert", _actions(rt)
    revert = [a for a in rt.audit.recent if a["action"] == "revert"][-1]
    assert revert["recovers"] == "rc-1" and revert["regime"] == "rc-1.end"
    assert _running_after(rt, job) == [DEFAULT_CELL] * 5


def test_a_transient_end_is_triaged_exactly_as_its_recovery(tmp_path):
    """Same decisions, same configs running, whether the end came as a recovery or as a transient end."""
    a, ja = _committed(tmp_path / "a")
    b, jb = _committed(tmp_path / "b")
    a.on_transient_end(_end(ja))
    b.on_change(_end(jb).as_recovery())
    strip = lambda r: {k: v for k, v in r.items() if k != "ts"}  # noqa: E731
    assert [strip(r) for r in a.audit.recent] == [strip(r) for r in b.audit.recent]
    assert _running_after(a, ja) == _running_after(b, jb) == [DEFAULT_CELL] * 5


def test_the_end_of_another_regime_reverts_nothing(tmp_path):
    """A transient on other communicators leaves the committed choice (the targets are in ``rc-1``)."""
    rt, job = _committed(tmp_path)
    te = TransientEnd(id="rc-9.end", job_id="job", ends=("rc-9",), start_s=job.t - 1.0, detected_s=job.t,
                      magnitude=0.5, comms=("0x2e",), comm_names=("tp0",))
    rt.on_transient_end(te)
    assert _actions(rt)[-1] == "ignore"
    job.regime = "slow"
    assert _running_after(rt, job) == [("TREE", "LL128")] * 5


def test_the_central_tiers_job_retuner_passes_it_through_its_gate(tmp_path):
    """`dynamiccl central`'s per-job retuner (the loop's retuner there) hands an allowed job's transient end on
    (the choice reverts) and drops another job's, counted as a change would be."""
    from dynamiccl.retuner.inputs import InputGate
    from dynamiccl.scaleout.retuning import JobRetuner
    rt, job = _committed(tmp_path)
    wrapped = JobRetuner(rt, InputGate(jobs=("job",), comms=(), allow_unauthenticated=True,
                                                 metrics=rt.metrics))
    other = TransientEnd(id="rc-1.end", job_id="other", ends=("rc-1",), start_s=job.t - 1.0, detected_s=job.t,
                         magnitude=0.5, comms=("0x1f",), comm_names=("dp0",))
    wrapped.on_transient_end(other)
    assert "revert" not in _actions(rt) and rt.metrics.dropped.get("not_allowed") == 1
    wrapped.on_transient_end(_end(job))
    assert _actions(rt)[-1] == "revert" and _running_after(rt, job) == [DEFAULT_CELL] * 5
