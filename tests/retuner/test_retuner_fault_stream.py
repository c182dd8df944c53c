"""The evaluation's lossy delivery: with ``fault_stream="step"`` a push meets the same fault whatever was pushed
before it, so two retuner variants are compared on the same faults (common random numbers)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from dynamiccl.harness.retuner_eval.sim_tuner import LossyDelivery


class _Ranks:
    def __init__(self, n: int) -> None:
        self.n_ranks = n
        self.plugins = [SimpleNamespace(staged_version=0) for _ in range(n)]
        self.delivered: list[tuple[int, str]] = []

    def deliver(self, r: int, path: str) -> None:
        self.delivered.append((r, path))

    def reload(self, ranks) -> None:
        pass


def _fault_of_last_push(tmp_path, seed: int, push_steps: list[int], stream: str) -> tuple:
    """What happened to the copies of the push at ``push_steps[-1]``: ranks served at once, ranks due later."""
    src = tmp_path / f"{stream}-{seed}-{len(push_steps)}.conf"
    d = LossyDelivery(src, tmp_path / f"snap-{stream}-{seed}-{len(push_steps)}", seed=seed, p_fault=0.5,
                      fault_stream=stream)
    rt = _Ranks(8)
    for i, step in enumerate(push_steps):
        src.write_text("x" * (i + 1))          # a new version: a new stamp
        d(rt, step)
    last = d.newest
    now = frozenset(r for r, p in rt.delivered if p == last)
    later = tuple(sorted((due - push_steps[-1], r) for due, r, p in d.pending if p == last))
    return now, later


@pytest.fixture(autouse=True)
def _no_agreement(monkeypatch):
    from dynamiccl.nccl_tuner_plugin import sync
    monkeypatch.setattr(sync, "run_ranks", lambda plugins: [0] * len(plugins))


def test_step_keyed_faults_do_not_depend_on_earlier_pushes(tmp_path):
    for seed in range(20):
        a = _fault_of_last_push(tmp_path, seed, [5, 50], "step")
        b = _fault_of_last_push(tmp_path, seed, [5, 6, 50], "step")
        assert a == b, seed


def test_push_ordered_faults_are_re_dealt_by_an_extra_push(tmp_path):
    # the default stream (every published figure used it): one more earlier push changes a later push's fault
    differ = [seed for seed in range(20) if _fault_of_last_push(tmp_path, seed, [5, 50], "push")
              != _fault_of_last_push(tmp_path, seed, [5, 6, 50], "push")]
    assert differ


def test_unknown_fault_stream_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fault_stream"):
        LossyDelivery(tmp_path / "x.conf", tmp_path / "s", fault_stream="time")


def test_audit_counts_of_an_evaluation_report():
    from dynamiccl.harness.retuner_eval.audit_counts import counts
    rep = {"results": [{"decisions": [
        {"action": "probe", "learned": {"policy": "learned", "action_values": {"RING/LL/x0": -1.0}}},
        {"action": "probe", "learned": {"policy": "learned", "fallback": "no model"}},
        {"action": "unapplicable"}, {"action": "commit"}]}]}
    c = counts(rep)
    assert (c["decisions"], c["learned_ranked"], c["with_action_values"], c["fallback"], c["unapplicable"]) == (4, 2, 1, 1, 1)
