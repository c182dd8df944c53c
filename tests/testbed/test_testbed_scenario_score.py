"""Scenarios (validation, YAML) and scoring (hits, false alarms, delays, localisation)."""
from __future__ import annotations

import pytest

from dynamiccl.harness.testbed.controller import TruthEvent
from dynamiccl.harness.testbed.scenario import BUILTIN, MIN_CHANGE, Action, Scenario, builtin, load
from dynamiccl.harness.testbed.score import Detection, score


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_scenarios_meet_the_issue_terms(name):
    s = builtin(name)
    assert s.nranks >= 4
    assert len(s.actions) >= 10
    for a in s.actions:
        if a.do == "throttle":
            assert 1 - a.mbit / s.base_mbit >= MIN_CHANGE
    # every degradation is undone, so the run ends at base capacity
    assert sum(a.degrades for a in s.actions) == sum(not a.degrades for a in s.actions)
    assert any(a.ranks is None for a in s.actions) and any(a.do == "bulk_on" for a in s.actions)
    assert sum(a.do == "throttle" and a.ranks is not None and len(a.ranks) == 1 for a in s.actions) >= 3


def test_ci_scenario_fits_the_ci_budget():
    assert builtin("ci").duration_s <= 110  # + start-up and teardown: under 3 minutes


def test_yaml_scenario_and_errors(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("base_mbit: 40\nactions:\n  - {at_s: 0, do: throttle, ranks: all, mbit: 20}\n"
                 "  - {at_s: 5, do: release, ranks: all}\n")
    s = load(str(f))
    assert s.name == "mine" and s.actions[0].ranks is None and s.actions[0].mbit == 20.0
    f.write_text("actions:\n  - {at_s: 0, do: release, ranks: [1]}\n")
    with pytest.raises(ValueError, match="releases ranks that are not throttled"):
        load(str(f))
    f.write_text("colour: red\n")
    with pytest.raises(ValueError, match="unknown field.*colour"):
        load(str(f))
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        load("nope")
    with pytest.raises(ValueError, match="ranks \\(7,\\) not in 0..3"):
        Scenario("x", actions=(Action(0, "throttle", (7,), 10.0),)).validate()
    with pytest.raises(ValueError, match="before the previous one"):
        Scenario("x", actions=(Action(5, "bulk_on", (1,)), Action(1, "bulk_off", (1,)))).validate()


def _ev(i, do, ranks, onset, all_ranks=False):
    return TruthEvent(i, do, ranks, all_ranks, do in ("throttle", "bulk_on"), 0.0, onset, onset, None, None, do)


def test_score_hits_false_alarms_and_localisation():
    ev = [_ev(0, "throttle", [2], 100.0), _ev(1, "release", [2], 107.0),
          _ev(2, "throttle", [0, 1, 2, 3], 114.0, all_ranks=True), _ev(3, "release", [0, 1, 2, 3], 121.0, True),
          _ev(4, "throttle", [3], 128.0), _ev(5, "release", [3], 135.0)]
    det = [Detection("early", "latency", 99.0),                    # before the first change
           Detection("a", "straggler", 101.5, ranks=[2]),          # hit, localised
           Detection("a2", "bandwidth", 102.0),                    # second report of change 0
           Detection("b", "recovery", 109.0, ranks=[2]),           # hit
           Detection("c", "recovery", 115.0),                      # wrong direction for a throttle
           Detection("d", "bandwidth", 116.5),                     # hit (not localisable: all ranks)
           Detection("e", "recovery", 127.0),                      # 6 s after change 3: too late
           Detection("f", "straggler", 129.0, ranks=[1])]          # hit, wrong rank
    s = score(ev, det)
    assert (s.changes, s.detected, s.false_alarms) == (6, 4, 4)
    assert s.localisable == 2 and s.localised == 1
    assert s.max_delay_s == pytest.approx(2.5)
    assert [r["detected"] for r in s.rows] == [True, True, True, False, True, False]
    assert sorted(f["why"].split(" ")[0] for f in s.false) == ["6.0s", "before", "second", "wrong"]
    assert s.line() == "changes=6 detected=4 false_alarms=4 max_delay_s=2.50 localised=1/2"
    assert not s.meets()


def test_score_perfect_run_meets_targets():
    ev = [_ev(0, "throttle", [1], 10.0), _ev(1, "release", [1], 17.0)]
    s = score(ev, [Detection("a", "straggler", 11.0, ranks=[1]), Detection("b", "recovery", 19.9)])
    assert s.meets() and s.line() == "changes=2 detected=2 false_alarms=0 max_delay_s=2.90 localised=1/1"
    assert not s.meets(limit_s=2.0)


def test_score_softer_step_reports_an_eased_throttle():
    """A softer throttle (more capacity than the throttle before it) is an improvement: the
    detector's softer step (a change of the incident's kind, ``evidence.step == "softer"``)
    reports it; before, only a ``recovery`` could, and the softer step was a wrong-direction
    false alarm. A deeper step stays a degradation."""
    ev = [TruthEvent(0, "throttle", [1], False, True, 0, 100.0, 100.0, 200, 50, "t"),
          TruthEvent(1, "throttle", [1], False, False, 12, 112.0, 112.0, 50, 120, "softer"),
          TruthEvent(2, "throttle", [1], False, True, 24, 124.0, 124.0, 120, 30, "deeper")]
    det = [Detection("a", "bandwidth", 101.5), Detection("b", "bandwidth", 114.0, step="softer"),
           Detection("c", "bandwidth", 126.0, step="deeper")]
    s = score(ev, det)
    assert (s.detected, s.false_alarms) == (3, 0), s.false
    assert not score(ev, [Detection("b", "bandwidth", 114.0, step="softer")]).rows[0]["detected"]


def test_score_falling_latency_reports_a_release():
    """A release whose throttle was not reported is seen, if at all, as an incident of falling
    latency (a change of kind bandwidth / latency with magnitude below 1): an improvement."""
    ev = [TruthEvent(0, "throttle", [1], False, True, 0, 100.0, 100.0, 200, 50, "t"),
          TruthEvent(1, "release", [1], False, False, 12, 112.0, 112.0, 50, 200, "r")]
    s = score(ev, [Detection("a", "bandwidth", 113.5, magnitude=0.45)])
    assert (s.detected, s.false_alarms) == (1, 0) and s.rows[1]["detected"], s.false
