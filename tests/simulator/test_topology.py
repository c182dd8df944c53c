import pytest

from dynamiccl.harness.simulator.topology import (GraphParams, InterNet, IntraLink, Topology, load_yaml, preset,
                                preset_names)


@pytest.mark.parametrize("name", preset_names())
def test_presets_validate(name):
    t = preset(name)
    assert t.n_ranks == t.nodes * t.gpus_per_node
    g = t.graph_params()
    g.validate()


def test_required_presets_exist():
    assert {"h100-2x8", "h100-8x8", "a100-2x8"} <= set(preset_names())
    assert preset("h100-8x8").n_ranks == 64


@pytest.mark.parametrize("kwargs, field", [
    ({"nodes": 0}, "nodes"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
    ({"gpu": "kepler"}, "gpu"),
    ({"intra": IntraLink(bw_gbps=0)}, "intra.bw_gbps"),
    ({"intra": IntraLink(kind="nvswitch")}, "intra.kind"),
    ({"inter": InterNet(kind="ethernet")}, "inter.kind"),
    ({"inter": InterNet(nics_per_node=0)}, "inter.nics_per_node"),
    ({"inter": InterNet(ll_crossing_us=-1.0)}, "inter.ll_crossing_us"),
    ({"inter": InterNet(tree_ll128_eff=0.0)}, "inter.tree_ll128_eff"),
    ({"inter": InterNet(nvls_tree_extra_us=-1.0)}, "inter.nvls_tree_extra_us"),
    ({"graph": GraphParams(n_channels=0, bw_intra=1, bw_inter=1)}, "graph.n_channels"),
    ({"gpu": "ampere", "intra": IntraLink(nvls=True)}, "intra.nvls"),
])
def test_validate_names_the_field(kwargs, field):
    base = dict(name="x", nodes=2, gpus_per_node=8)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Topology(**{**base, **kwargs}).validate()


def test_unknown_preset():
    with pytest.raises(KeyError, match="h100-2x8"):
        preset("nope")


def test_yaml_roundtrip(tmp_path):
    p = tmp_path / "topo.yaml"
    p.write_text("preset: a100-2x8\nnodes: 4\ninter:\n  kind: roce\n  latency_us: 6.5\n")
    t = load_yaml(p)
    assert (t.nodes, t.gpus_per_node, t.gpu, t.inter.kind, t.inter.latency_us, t.inter.nic_bw_gbps) == \
        (4, 8, "ampere", "roce", 6.5, 25.0)


def test_yaml_full_and_unknown_key(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("name: mine\nnodes: 2\ngpus_per_node: 4\ngpu: blackwell\n"
                 "intra: {kind: nvlink, bw_gbps: 900, nvls: true}\n"
                 "inter: {kind: ib, nic_bw_gbps: 50, nics_per_node: 4}\n")
    t = load_yaml(p)
    assert t.compcap_index == 3 and t.nics_used == 4
    p.write_text("name: bad\nnodes: 2\ngpus_per_node: 4\nbogus: 1\n")
    with pytest.raises(ValueError, match="bogus"):
        load_yaml(p)


def test_derived_graph_matches_reference_assumptions():
    # nccl-cost-model.md §2 (a): 24 ch x 15 GB/s; (b) 8 ch x 48; (d) 8 ch x 24.
    g = preset("h100-1x8").graph_params()
    assert (g.n_channels, g.bw_intra) == (24, 15.0)
    g = preset("h100-4x8").graph_params()
    assert (g.n_channels, g.bw_inter, g.latency_inter) == (8, 48.0, 0.0)
    g = preset("a100-2x8").graph_params()
    assert (g.n_channels, g.bw_intra) == (8, 24.0)


def test_fitted_fields_are_neutral_except_p5():
    # The per-platform fitted InterNet fields (dynamiccl/harness/simulator/aws_regions.py) leave every other preset bit-identical.
    neutral = InterNet()
    for name in preset_names():
        inter = preset(name).inter
        fitted = {f: getattr(inter, f) for f in ("ll_crossing_us", "tree_ll128_eff", "nvls_tree_extra_us")
                  if getattr(inter, f) != getattr(neutral, f)}
        assert fitted == ({"ll_crossing_us": 12.0} if name == "p5-2x8" else {}), (name, fitted)
