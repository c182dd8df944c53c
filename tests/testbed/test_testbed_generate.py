"""The scenario generator: seeded, valid, labelled, split by seed; directional throttles."""
from dynamiccl.harness.testbed.generate import generate, parse_seeds, split
from dynamiccl.harness.testbed.netns import Topology


def test_same_seed_same_scenario_and_every_draw_is_valid():
    assert generate(7) == generate(7)
    assert generate(7) != generate(8)
    kinds, dirs = set(), set()
    for seed in range(200):
        sc = generate(seed)  # validate() runs inside: every schedule is a legal one
        assert 2 <= sc.nranks <= 4 and len(sc.actions) >= 10
        gaps = [b.at_s - a.at_s for a, b in zip(sc.actions, sc.actions[1:])]
        assert min(gaps) >= 9.9  # 10 s, rounded to 0.1 s
        kinds |= {a.do for a in sc.actions}
        dirs |= {a.direction for a in sc.actions if a.do == "throttle"}
    assert kinds == {"throttle", "release", "bulk_on", "bulk_off"}
    assert dirs == {"both", "ingress", "egress"}


def test_every_run_ends_at_its_base_state():
    for seed in range(100):
        sc = generate(seed)
        open_throttles = open_bulk = 0
        for a in sc.actions:
            if a.do == "throttle":
                open_throttles = 1
            elif a.do == "release":
                open_throttles = 0
            open_bulk += {"bulk_on": 1, "bulk_off": -1}.get(a.do, 0)
        assert open_throttles == 0 and open_bulk == 0, seed


def test_split_is_by_seed_parity():
    assert [split(s) for s in parse_seeds("0-3")] == ["dev", "eval", "dev", "eval"]


def test_directional_throttle_shapes_only_that_side():
    topo = Topology(3, prefix="dtb0abc", base_mbit=50, dry_run=True)
    topo.set_rate([1], 20, "ingress")
    assert len(topo.commands) == 1 and topo.commands[0][4] == topo.host_links[1]
    topo.set_rate([2], 10, "egress")
    assert topo.commands[-1][:3] == ["tc", "-n", topo.namespaces[2]]
    assert topo.rates == [50.0, 20.0, 10.0]
    topo.set_rate([1, 2], 50)
    assert topo.rates == [50.0] * 3 and len(topo.commands) == 6


def test_corpus_runs_use_their_own_prefix_family():
    from dynamiccl.harness.testbed.netns import PREFIX_RE, new_prefix
    p = new_prefix("dtc")
    assert p.startswith("dtc") and PREFIX_RE.fullmatch(p)
    assert Topology(2, prefix=p, dry_run=True).bridge == f"{p}br"


def test_controller_labels_a_softer_step_as_an_improvement(tmp_path):
    from dynamiccl.harness.testbed.controller import Controller
    from dynamiccl.harness.testbed.scenario import Action, Scenario
    sc = Scenario("s", nranks=2, base_mbit=40, actions=(Action(0, "throttle", (0,), 10.0, "egress"),
                                                         Action(10, "throttle", (0,), 20.0, "egress"),
                                                         Action(20, "release", (0,))))
    c = Controller(sc, Topology(3, prefix="dtb0abd", base_mbit=40, dry_run=True), truth_path=tmp_path / "t.json")
    evs = [c.apply(i, a) for i, a in enumerate(sc.actions)]
    assert [e.degrades for e in evs] == [True, False, False]
    assert [e.direction for e in evs] == ["egress", "egress", "both"]
