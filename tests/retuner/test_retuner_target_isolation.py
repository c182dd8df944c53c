"""One target the tuner cannot name, or whose rule cannot be built, never stops the others.

The wire spells all-to-all ``AlltoAll``, the tuner file ``AllToAll``; Gather, Scatter and SendRecv have no
tuner token at all (NCCL never asks the tuner about them). A target of either kind on the same communicator
as an AllReduce must not keep the AllReduce's committed config out of the file.
"""
from __future__ import annotations

import pytest

from dynamiccl.nccl_tuner_plugin.config import read_configs
from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig
from dynamiccl.retuner.types import Candidate, Target

from retuner_fakejob import FakeJob, rc, simple_cost, target


def make(tmp_path) -> Retuner:
    cfg = RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "tuner.conf"),
                        audit_path=str(tmp_path / "audit.jsonl"), policy=PolicyConfig(tune_at_start=False))
    return Retuner(cfg, clock=lambda: 1000.0)


def run_slow_regime(rt: Retuner, job: FakeJob, steps: int = 40) -> None:
    for i in range(steps):
        rt.observe(job.step())
        if i == 10:
            job.regime = "slow"
        if i == 12:
            rt.on_change(rc("rc-1", "latency", job.step_s * 13))


def committed(tmp_path) -> list[tuple[str, str | None, str | None]]:
    return [(r.func, r.algo, r.proto) for r in read_configs(tmp_path / "tuner.conf")[-1].rules]


def neighbour(func: str, bucket: int = 20) -> Target:
    return Target(0x1f, func, bucket, nranks=2, nnodes=2, comm_name="c1f")


def test_an_all_to_all_target_is_tuned_under_the_tuner_token_and_the_allreduce_is_committed(tmp_path):
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target(), neighbour("AlltoAll")],
                  simple_cost({"slow": ("TREE", "LL128", 0)}))
    run_slow_regime(rt, job)
    rules = committed(tmp_path)
    assert ("AllReduce", "TREE", "LL128") in rules
    assert all(f in ("AllReduce", "AllToAll") for f, _, _ in rules)   # the file only holds tuner tokens
    assert rt.metrics.push_errors == {} or not any(rt.metrics.push_errors.values())


@pytest.mark.parametrize("func", ["Gather", "Scatter", "SendRecv"])
def test_a_collective_the_tuner_cannot_name_never_blocks_the_allreduce(tmp_path, func):
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target(), neighbour(func)],
                  simple_cost({"slow": ("TREE", "LL128", 0)}))
    run_slow_regime(rt, job)
    assert committed(tmp_path) == [("AllReduce", "TREE", "LL128")]
    assert rt.metrics.dropped["untunable"] > 0


def test_a_zero_byte_target_has_a_bucket_and_a_byte_range(tmp_path):
    t = Target(0x1f, "AllReduce", -1, nranks=8, nnodes=1)      # the collector's bucket for 0 bytes
    assert t.byte_range() == (0, 0)
    assert Candidate("RING", "LL").rule(t).max_bytes == 0


def test_one_target_whose_rule_cannot_be_built_is_skipped_and_counted(tmp_path, monkeypatch):
    rt = make(tmp_path)
    bad = neighbour("AllReduce", bucket=20)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target(), bad], simple_cost({"slow": ("TREE", "LL128", 0)}))
    real = Candidate.rule

    def rule(self, t):
        if t == bad:
            raise ValueError("cannot express this target")
        return real(self, t)

    monkeypatch.setattr(Candidate, "rule", rule)
    run_slow_regime(rt, job)
    rules = read_configs(tmp_path / "tuner.conf")[-1].rules
    assert [(r.func, r.algo, r.proto, r.min_bytes) for r in rules] == [("AllReduce", "TREE", "LL128", 1 << 24)]
    assert rt.metrics.push_errors.get("bad_target", 0) >= 1
    errors = [a for a in rt.audit.recent if a["action"] == "push_error" and a.get("reason") == "bad_target"]
    assert errors and "c1f/AllReduce/20" in errors[0]["target"]
