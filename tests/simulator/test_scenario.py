"""Scenarios: each kind's NetworkState, composition, recovery, validation, ground truth."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dynamiccl.harness.simulator import scenario as S
from dynamiccl.harness.simulator.scenario import ScenarioError
from dynamiccl.harness.simulator.topology import preset as topo

T = topo("h100-2x8")


def sc(*events, **kw):
    return S.from_dict({"name": "t", "events": list(events), **kw})


def arr(v, n):
    return np.broadcast_to(np.asarray(v, dtype=float), (n,))


def test_bw_drop_latency_straggler_and_composition():
    s = sc({"at_s": 1, "kind": "bw_drop", "magnitude": 0.5, "nodes": [1]},
           {"at_s": 2, "kind": "bw_drop", "magnitude": 0.5},
           {"at_s": 1, "kind": "latency", "magnitude": 30, "links": [0]},
           {"at_s": 1, "kind": "straggler", "magnitude": 500, "ranks": [3, 9], "duration_s": 2})
    st0 = s.state_at(0.5, T)
    assert st0.link_bw_factor == 1.0 and st0.added_latency_us == 0.0 and st0.rank_delay_us == 0.0
    st = s.state_at(2.5, T)
    assert arr(st.link_bw_factor, 2).tolist() == [0.5, 0.25]
    assert arr(st.added_latency_us, 2).tolist() == [30.0, 0.0]
    d = arr(st.rank_delay_us, 16)
    assert d[3] == d[9] == 500 and d.sum() == 1000
    assert s.state_at(3.5, T).rank_delay_us == 0.0                  # duration_s over


def test_incast_and_flap_toggle_with_their_period():
    s = sc({"at_s": 10, "kind": "incast", "magnitude": 0.8, "period_s": 2, "duty": 0.25},
           {"at_s": 10, "kind": "flap", "magnitude": 0.9, "period_s": 4, "nodes": [0]})
    on = s.state_at(10.2, T)
    assert on.competing_share == pytest.approx(0.8)
    assert arr(on.link_bw_factor, 2)[0] == pytest.approx(0.1)
    off = s.state_at(10.7, T)                                        # incast off after 0.5 s of 2 s
    assert off.competing_share == 0.0 and arr(off.link_bw_factor, 2)[0] == pytest.approx(0.1)
    later = s.state_at(12.5, T)                                      # flap good half
    assert later.link_bw_factor == 1.0
    assert s.state_at(12.1, T).competing_share == pytest.approx(0.8)  # next incast burst
    ct = s.change_times(14)
    assert {10.0, 10.5, 12.0, 12.5, 14.0} <= set(ct.tolist())


def test_degrading_nic_ramps_then_recovery_restores_baseline():
    s = sc({"at_s": 5, "kind": "degrading_nic", "magnitude": 0.6, "ramp_s": 4, "nodes": [1]},
           {"at_s": 20, "kind": "recovery"})
    f = [arr(s.state_at(t, T).link_bw_factor, 2)[1] for t in (5.1, 6.1, 7.1, 9.5, 19.9)]
    assert f[0] == 1.0 and f[0] > f[1] > f[2] > f[3]
    assert f[3] == pytest.approx(0.4) and f[4] == pytest.approx(0.4)
    assert s.state_at(20.0, T).link_bw_factor == 1.0
    truth = s.truth(duration_s=30)
    assert [(e["kind"], e["t_start"], e["t_end"]) for e in truth] == [("degrading_nic", 5.0, 20.0),
                                                                    ("recovery", 20.0, 20.0)]


def test_benign_events_do_not_touch_the_network():
    s = sc({"at_s": 1, "kind": "pause", "duration_s": 2}, {"at_s": 1, "kind": "mix", "magnitude": 2.0,
                                                            "groups": ["dp"]},
           {"at_s": 1.5, "kind": "recovery"})
    st = s.state_at(1.5, T)
    assert st.link_bw_factor == 1.0 and st.competing_share == 0.0
    assert s.pause_until(1.7) == 3.0 and s.pause_until(3.0) is None  # recovery does not end benign events
    assert s.size_scale(2.0, "dp") == 2.0 and s.size_scale(2.0, "tp") == 1.0
    truth = s.truth(duration_s=10)
    assert [e["benign"] for e in truth] == [True, True, False]


@pytest.mark.parametrize("event, message", [
    ({"at_s": 1, "kind": "bw_drop", "magnitude": 1.0}, r"events\[0\].magnitude must be < 1.0"),
    ({"at_s": 1, "kind": "bw_drop"}, r"events\[0\].magnitude is required"),
    ({"at_s": -1, "kind": "latency", "magnitude": 3}, r"events\[0\].at_s must be >= 0"),
    ({"at_s": 1, "kind": "quake", "magnitude": 3}, r"events\[0\].kind must be one of"),
    ({"at_s": 1, "kind": "straggler", "magnitude": 3}, r"events\[0\].ranks must be a non-empty list"),
    ({"at_s": 1, "kind": "pause"}, r"events\[0\].duration_s is required for kind pause"),
    ({"at_s": 1, "kind": "latency", "magnitude": 3, "ranks": [1]}, r"events\[0\].ranks is only used"),
    ({"at_s": 1, "kind": "incast", "magnitude": 0.5, "duty": 1.5}, r"events\[0\].duty must be < 1.0"),
    ({"at_s": 1, "kind": "recovery", "magnitude": 1}, r"events\[0\].magnitude is not used by kind recovery"),
    ({"at_s": 1, "kind": "flap", "magnitude": 0.5, "colour": 1}, r"events\[0\]: unknown key"),
    ({"at_s": 1, "kind": "mix", "magnitude": 0}, r"events\[0\].magnitude must be > 0.0"),
])
def test_validation_errors_name_the_field(event, message):
    with pytest.raises(ScenarioError, match=message):
        sc(event)


def test_validate_against_topology():
    with pytest.raises(ScenarioError, match=r"events\[0\].nodes \[2\] outside \[0, 2\)"):
        sc({"at_s": 1, "kind": "bw_drop", "magnitude": 0.5, "nodes": [2]}).validate_for(T)
    with pytest.raises(ScenarioError, match=r"events\[0\].ranks \[16\] outside"):
        sc({"at_s": 1, "kind": "straggler", "magnitude": 5, "ranks": [16]}).validate_for(T)
    with pytest.raises(ScenarioError, match=r"events\[0\].groups \['zz'\] not in"):
        sc({"at_s": 1, "kind": "mix", "magnitude": 2, "groups": ["zz"]}).validate_for(T, ("tp",))


def test_presets_and_truth_file(tmp_path):
    demo = S.preset("demo")
    assert 80 <= demo.duration_s <= 120
    regimes = [e for e in demo.events if not e.benign]
    assert 2 <= len(regimes) <= 5 and any(e.benign for e in demo.events)
    assert S.preset("stationary").events == ()
    assert {e.kind for e in S.preset("tour").events} == set(S.KINDS)
    p = S.write_truth(tmp_path / "truth.jsonl", demo, duration_s=110, epoch_ns=10**18)
    rows = [json.loads(line) for line in p.read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["pause", "bw_drop", "recovery", "latency", "straggler"]
    bw = rows[1]
    assert (bw["t_start"], bw["t_end"], bw["where"], bw["benign"]) == (27.0, 41.0, {"nodes": "all"}, False)
    assert bw["t_start_ns"] == 10**18 + 27 * 10**9
    assert (rows[3]["t_start"], rows[3]["t_end"], rows[3]["magnitude"]) == (50.0, 90.0, 100.0)
    assert rows[0]["benign"] and rows[4]["where"] == {"ranks": [5]} and rows[4]["t_end"] == 106.0
    for r in rows:
        assert set(r) >= {"t_start", "t_end", "kind", "magnitude", "where", "benign"}
