import numpy as np
import pytest

from dynamiccl.harness.simulator.cost_model import NcclModel
from dynamiccl.harness.simulator.perf_model import NetworkState, expected_time, sample_durations
from dynamiccl.harness.simulator.topology import preset

SMALL, LARGE = np.array([8 * 1024]), np.array([2 ** 30])
T2 = preset("h100-2x8")


def t_of(state, sizes, algo="RING", proto="SIMPLE", topo=T2, nch=32, chunk=2 ** 21):
    return expected_time(topo, "AllReduce", sizes, algo, proto, nch, chunk, state)


def test_deterministic_under_seed():
    st = NetworkState(noise_sigma=0.1, rank_delay_us=0.0)
    a = sample_durations(T2, "AllReduce", LARGE, "RING", "SIMPLE", 32, 2 ** 21, st, rng=np.random.default_rng(7))
    b = sample_durations(T2, "AllReduce", LARGE, "RING", "SIMPLE", 32, 2 ** 21, st, rng=np.random.default_rng(7))
    c = sample_durations(T2, "AllReduce", LARGE, "RING", "SIMPLE", 32, 2 ** 21, st, rng=np.random.default_rng(8))
    assert a.shape == (1, 16) and np.array_equal(a, b) and not np.array_equal(a, c)


def test_bandwidth_drop_hurts_large_more_than_small():
    idle, deg = NetworkState(), NetworkState(link_bw_factor=(1.0, 0.4))
    r_small = t_of(deg, SMALL, "TREE", "LL") / t_of(idle, SMALL, "TREE", "LL")
    r_large = t_of(deg, LARGE) / t_of(idle, LARGE)
    assert r_large > 2.0 and r_small < 1.05


def test_added_latency_hurts_small_more_than_large():
    st = NetworkState(added_latency_us=20.0)
    r_small = t_of(st, SMALL, "TREE", "LL") / t_of(NetworkState(), SMALL, "TREE", "LL")
    r_large = t_of(st, LARGE) / t_of(NetworkState(), LARGE)
    assert r_small > 1.3 and r_large < 1.1


def test_ring_loses_more_than_network_light_algorithm():
    # nccl#319: a degraded path costs Ring ~55 % but Tree ~25 %; here NVLSTree is NVLink-bound on 2 nodes.
    st = NetworkState(link_bw_factor=0.6)
    ring = t_of(st, LARGE) / t_of(NetworkState(), LARGE)
    nvlst = (t_of(st, LARGE, "NVLS_TREE", "SIMPLE", nch=16, chunk=131072)
             / t_of(NetworkState(), LARGE, "NVLS_TREE", "SIMPLE", nch=16, chunk=131072))
    assert ring > 1.5 and nvlst < ring - 0.2


def test_competing_traffic_more_channels_win_back_share():
    st = NetworkState(competing_share=0.5)
    few = t_of(st, LARGE, nch=8) / t_of(NetworkState(), LARGE, nch=8)
    many = t_of(st, LARGE, nch=32) / t_of(NetworkState(), LARGE, nch=32)
    assert few > 1.5 and many < few


def test_straggler_own_duration_is_shortest():
    delay = np.zeros(16)
    delay[5] = 500.0
    st = NetworkState(rank_delay_us=tuple(delay), noise_sigma=0.02)
    d = sample_durations(T2, "AllReduce", np.array([2 ** 20, 2 ** 26]), "RING", "SIMPLE", 32, 2 ** 21, st,
                         rng=np.random.default_rng(0))
    assert np.all(np.argmin(d, axis=1) == 5)
    peers = np.delete(d, 5, axis=1)
    assert np.all(peers.min(axis=1) - d[:, 5] > 400)


def test_slow_rank_slows_everyone():
    slow = np.ones(16)
    slow[3] = 1.5
    base = t_of(NetworkState(), LARGE)
    assert t_of(NetworkState(rank_slowdown=tuple(slow)), LARGE) == pytest.approx(base * 1.5, rel=0.02)


def test_smaller_chunk_costs_on_network_under_latency():
    st = NetworkState(added_latency_us=100.0)
    assert t_of(st, LARGE, chunk=2 ** 17) > 1.3 * t_of(st, LARGE, chunk=2 ** 21)


def test_state_validation_names_field():
    with pytest.raises(ValueError, match="link_bw_factor"):
        t_of(NetworkState(link_bw_factor=0.0), LARGE)
    with pytest.raises(ValueError, match="rank_delay_us"):
        t_of(NetworkState(rank_delay_us=(1.0, 2.0)), LARGE)
    with pytest.raises(ValueError, match="competing_share"):
        t_of(NetworkState(competing_share=1.0), LARGE)


def test_impossible_cells_are_inf_and_vectorised():
    assert np.isinf(t_of(None, LARGE, "NVLS", "SIMPLE"))                 # NVLS is single-node only here
    sizes = np.array([2 ** k for k in range(10, 31, 4)])
    vec = t_of(None, sizes)
    assert np.all(np.diff(vec) > 0)
    assert np.allclose(vec, [t_of(None, np.array([s]))[0] for s in sizes])


def test_perf_model_differs_from_nccl_model():
    m = NcclModel(T2)
    sizes = np.array([2 ** k for k in range(12, 31, 2)])
    r = m.cost_table("AllReduce", sizes)
    real = np.array([expected_time(T2, "AllReduce", sizes[i:i + 1], int(r.algo[i]), int(r.proto[i]),
                                   r.n_channels[i], r.chunk[i])[0] for i in range(sizes.size)])
    predicted = r.table[np.arange(sizes.size), r.algo, r.proto]
    assert np.max(np.abs(real / predicted - 1)) > 0.2


def test_ll_across_nodes_is_capped_by_the_host_cpu():
    # NCCL stages LL through host memory across nodes: its ceiling is the host's (NCCL llMaxBw rows by CPU
    # vendor: Intel 39, AMD 22.5 GB/s of bus bandwidth at 2 nodes), not the NICs'; LL128 does not care.
    import dataclasses

    amd = dataclasses.replace(T2, cpu_vendor="amd")
    big = np.array([2 ** 28])
    t_intel = t_of(None, big, "TREE", "LL", nch=32, chunk=32768)
    t_amd = t_of(None, big, "TREE", "LL", topo=amd, nch=32, chunk=32768)
    bus_intel = 2 * big[0] / t_intel[0] / 1e3                     # Tree moves 2 S per rank
    assert 30 < bus_intel <= 39.0
    assert t_amd[0] / t_intel[0] == pytest.approx(39.0 / 22.5, rel=0.05)
    ll128 = t_of(None, big, "TREE", "LL128", nch=32, chunk=576000)
    assert t_of(None, big, "TREE", "LL128", topo=amd, nch=32, chunk=576000) == pytest.approx(ll128)
    assert ll128[0] < t_intel[0] / 3
    one_node = preset("h100-1x8")                                  # no network: no host staging
    assert 2 * big[0] / t_of(None, big, "TREE", "LL", topo=one_node, nch=32, chunk=32768)[0] / 1e3 > 39.0


def test_multi_node_ring_steps_pay_the_proxy_overhead_by_cpu_vendor():
    # NCCL's netOverhead (reference §1.1/§1.4): every intra-node step of a multi-node ring costs at least the
    # proxy's turn-around, 1 µs on Intel and 2 µs on AMD hosts (x3 for Simple). 16-rank AllGather: 15 steps,
    # 1 crossing -> 14 intra-node steps; NVLink LL steps (0.8 µs) are raised to 1.0 / 2.0 µs.
    import dataclasses

    tiny = np.array([4096])
    amd = dataclasses.replace(T2, cpu_vendor="amd")

    def ag(topo, proto):
        return expected_time(topo, "AllGather", tiny, "RING", proto, 1, 32768)[0]

    assert ag(amd, "LL") - ag(T2, "LL") == pytest.approx(14 * (2.0 - 1.0), abs=0.5)
    assert ag(amd, "SIMPLE") - ag(T2, "SIMPLE") == pytest.approx(14 * (6.0 - 0.8 * 3.4 / 0.6), abs=0.5)
    one_node = preset("h100-1x8")                                   # no proxy in a single-node ring
    assert ag(dataclasses.replace(one_node, cpu_vendor="amd"), "LL") == pytest.approx(ag(one_node, "LL"))


def test_tree_chain_fill_uses_the_per_position_nvlink_share():
    # Tree chains are rotations on NVSwitch systems (one head per NIC, NCCL search.cc): while the pipeline fills,
    # a GPU forwards only the nCh/8 channels at its chain position. Same job without an NVSwitch (chains not
    # rotated): every hop forwards all 32 channels' 6 KiB at NVLink/32. 14 NVLink hops of 6 KiB each:
    # 6144 B / (346 GB/s / 32) vs 6144 B / min(36, 346 * 8 / 32) GB/s -> ~5.4 µs less.
    import dataclasses

    mid = np.array([192 * 1024])
    no_switch = dataclasses.replace(T2, intra=dataclasses.replace(T2.intra, nvswitch=False))
    rotated = expected_time(T2, "AllReduce", mid, "TREE", "LL128", 32, 18000)[0]
    shared = expected_time(no_switch, "AllReduce", mid, "TREE", "LL128", 32, 18000)[0]
    per_hop = 6144 / (450 * 0.82 * 120 / 128 / 32) - 6144 / 36.0            # ns
    assert shared - rotated == pytest.approx(14 * per_hop / 1000.0, rel=0.05)
    # the steady state is unchanged: a large Tree/LL128 costs the same either way (fill is negligible there)
    big = np.array([2 ** 30])
    assert expected_time(T2, "AllReduce", big, "TREE", "LL128", 32, 576000)[0] == pytest.approx(
        expected_time(no_switch, "AllReduce", big, "TREE", "LL128", 32, 576000)[0], rel=0.01)


def test_fitted_ll_crossing_charges_each_network_crossing_of_ll_only():
    # InterNet.ll_crossing_us (fitted on p5): a 2-node Tree crosses the network twice (reduce up, broadcast down),
    # a 2-node Ring AllGather once (one inter-node step); LL128 and one-node runs are untouched.
    import dataclasses
    from dynamiccl.harness.simulator.aws_regions import with_fit

    p5 = preset("p5-2x8")
    base = with_fit(p5)
    ll = lambda topo: t_of(None, SMALL, "TREE", "LL", topo=topo, nch=8, chunk=32768)        # noqa: E731
    assert (ll(p5) - ll(base))[0] == pytest.approx(2 * 12.0)
    ag = lambda topo: expected_time(topo, "AllGather", SMALL, "RING", "LL", 8, 32768)        # noqa: E731
    assert (ag(p5) - ag(base))[0] == pytest.approx(12.0)
    ll128 = lambda topo: t_of(None, SMALL, "TREE", "LL128", topo=topo, nch=8, chunk=32768)   # noqa: E731
    assert ll128(p5)[0] == ll128(base)[0]
    one = dataclasses.replace(p5, nodes=1)
    assert ag(one)[0] == ag(with_fit(one))[0]
