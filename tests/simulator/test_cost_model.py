import numpy as np
import pytest

from dynamiccl.harness.simulator.cost_model import ALGOS, PROTOS, NcclModel
from dynamiccl.harness.simulator.topology import from_dict, preset

SIZES = np.array([4 ** k for k in range(5, 16)])  # 1 KiB .. 1 GiB


def winners(model, func="AllReduce", sizes=SIZES):
    r = model.cost_table(func, sizes)
    return dict(zip(sizes.tolist(), r.choice_names()))


def test_shape_dtype_and_ignore_value():
    r = NcclModel(preset("h100-2x8")).cost_table("AllReduce", SIZES)
    assert r.table.shape == (SIZES.size, 7, 3) and r.table.dtype == np.float32
    assert set(np.unique(r.table[r.table < 0])) == {-1.0}


@pytest.mark.parametrize("func", ["Broadcast", "Reduce"])
def test_broadcast_reduce_ring_only(func):
    t = NcclModel(preset("h100-4x8")).cost_table(func, SIZES).table
    assert np.all(t[:, [0, 2, 3, 4, 5, 6], :] == -1)
    assert np.all(t[:, 1, :] > 0)


def test_enable_rules_h100():
    m1 = NcclModel(preset("h100-1x8"))
    t = m1.cost_table("AllReduce", SIZES).table
    assert np.all(t[:, 4, 2] > 0) and np.all(t[:, 4, :2] == -1)   # NVLS: Simple only
    assert np.all(t[:, 5, :] == -1)                                # NVLSTree off on one node
    assert np.all(t[:, 2:4, :] == -1)                              # CollNet off by default
    assert np.all(t[:, 6, :] == -1)                                # PAT never for AllReduce
    t2 = NcclModel(preset("h100-2x8")).cost_table("AllReduce", SIZES).table
    assert np.all(t2[:, 4, :] == -1)                               # multi-node NVLS needs collnet
    assert np.all(t2[:, 5, 2] > 0)
    ag = NcclModel(preset("h100-2x8")).cost_table("AllGather", SIZES).table
    assert np.all(ag[:, 0, :] == -1) and np.all(ag[:, 6, :] == -1)  # no Tree; PAT needs 1 GPU/node


def test_pat_with_one_gpu_per_node_and_no_nvls_on_ampere():
    ag = NcclModel(preset("h100-2x1-roce")).cost_table("AllGather", SIZES).table
    assert np.all(ag[:, 6, 2] > 0) and np.all(ag[:, 6, :2] == -1)
    t = NcclModel(preset("a100-1x8")).cost_table("AllReduce", SIZES).table
    assert np.all(t[:, 4:6, :] == -1)


def test_ll128_disabled_on_pcie():
    t = from_dict({"name": "pcie", "nodes": 1, "gpus_per_node": 4, "gpu": "ampere",
                   "intra": {"kind": "pcie", "bw_gbps": 24.0}})
    tab = NcclModel(t).cost_table("AllReduce", SIZES).table
    assert np.all(tab[:, :, 1] == -1)


def test_exclusion_makes_cells_ignore():
    m = NcclModel(preset("h100-4x8"), exclude_algos=("TREE",), exclude_protos=("LL",))
    t = m.cost_table("AllReduce", SIZES).table
    assert np.all(t[:, 0, :] == -1) and np.all(t[:, :, 0] == -1)
    assert np.all(t[:, 1, 2] > 0)


def test_single_rank_only_ring_simple_zero():
    t = from_dict({"name": "one", "nodes": 1, "gpus_per_node": 1})
    r = NcclModel(t).cost_table("AllReduce", SIZES)
    assert np.all(r.table[:, 1, 2] == 0.0)
    assert np.sum(r.table >= 0) == SIZES.size
    assert r.choice_names()[0] == "RING/SIMPLE"


def test_worked_case_a_numbers():
    # nccl-cost-model.md §2 (a): lat/algBw Ring LL 15.0/80.6, LL128 40.6/189.3, Simple 56.0/205.7;
    # Tree LL 15.2/43.6, LL128 31.5/128.8, Simple 64.4/165.6.
    m = NcclModel(preset("h100-1x8"), exclude_algos=("NVLS",))
    want = {("RING", "LL"): (15.0, 80.6), ("RING", "LL128"): (40.6, 189.3), ("RING", "SIMPLE"): (56.0, 205.7),
            ("TREE", "LL"): (15.2, 43.6), ("TREE", "LL128"): (31.5, 128.8), ("TREE", "SIMPLE"): (64.4, 165.6)}
    for (a, p), (lat, bw) in want.items():
        assert m.latency("AllReduce", a, p) == pytest.approx(lat, abs=0.05)
        assert m.bandwidth("AllReduce", a, p) == pytest.approx(bw, abs=0.06)


def test_worked_case_a_winners():
    w = winners(NcclModel(preset("h100-1x8"), exclude_algos=("NVLS",)))
    assert all(w[s] == "RING/LL" for s in SIZES if s <= 2 ** 20)
    assert w[4 ** 11] == w[4 ** 12] == "RING/LL128"                 # 4 MiB, 16 MiB
    assert all(w[s] == "RING/SIMPLE" for s in SIZES if s >= 2 ** 26)


def test_worked_case_b_winners():
    w = winners(NcclModel(preset("h100-4x8"), exclude_algos=("NVLS_TREE",)))
    assert all(w[s] == "TREE/LL" for s in SIZES if s <= 2 ** 16)
    assert all(w[s] == "TREE/LL128" for s in SIZES if 2 ** 18 <= s <= 2 ** 24)
    assert w[2 ** 26] == "RING/LL128"
    assert all(w[s] == "RING/SIMPLE" for s in SIZES if s >= 2 ** 28)


def test_worked_case_c_times_and_winners():
    t = from_dict({"preset": "h100-4x8", "graph": {"n_channels": 8, "bw_intra": 24.0, "bw_inter": 24.0}})
    m = NcclModel(t, exclude_algos=("NVLS_TREE",))
    tab = m.cost_table("AllReduce", np.array([2 ** 28])).table[0]
    assert tab[1, 1] == pytest.approx(3089, abs=1)    # Ring/LL128
    assert tab[1, 2] == pytest.approx(3105, abs=1)    # Ring/Simple
    assert tab[0, 1] == pytest.approx(3308, abs=1)    # Tree/LL128
    w = winners(m)
    assert w[2 ** 26] == w[2 ** 28] == "RING/LL128" and w[2 ** 30] == "RING/SIMPLE"


def test_worked_case_d_winners():
    w = winners(NcclModel(preset("a100-2x8")))
    assert all(w[s] == "TREE/LL" for s in SIZES if s <= 2 ** 16)
    assert w[2 ** 18] == "RING/LL"
    assert w[2 ** 20] == w[2 ** 22] == "TREE/LL128"
    assert w[2 ** 24] == "RING/LL128"
    assert all(w[s] == "RING/SIMPLE" for s in SIZES if s >= 2 ** 26)


def test_argmin_ties_pick_first_in_algo_major_order():
    m = NcclModel(preset("h100-1x8"))
    r = m.cost_table("AllReduce", SIZES)
    flat = np.where(r.table >= 0, r.table, np.inf).reshape(SIZES.size, 21)
    assert np.array_equal(r.algo * 3 + r.proto, np.argmin(flat, axis=1))
    # construct an exact tie: identical rows -> first wins
    tab = np.full((1, 21), np.inf)
    tab[0, [3 * 1 + 2, 3 * 0 + 1]] = 5.0
    assert int(np.argmin(tab, axis=1)[0]) == 1


def test_channels_and_chunks():
    m = NcclModel(preset("h100-1x8"))
    r = m.cost_table("AllReduce", np.array([1024, 2 ** 30]))
    assert r.n_channels[0] == 1 and r.n_channels[1] == m.comm_channels or r.choice_names()[1].startswith("NVLS")
    a, p = ALGOS.index("RING"), PROTOS.index("SIMPLE")
    nc, nw = m.algo_info(a, p, np.array([2 ** 30]))
    assert nc[0] == m.comm_channels == 48 and nw[0] == (512 + 32) // 32
    assert m.chunk_size("AllReduce", a, p, np.array([2 ** 30]), nc)[0] == 2 * 2 ** 20
    assert m.chunk_size("AllReduce", a, 0, np.array([2 ** 30]), nc)[0] == 32768
    assert m.chunk_size("AllReduce", a, 1, np.array([2 ** 30]), nc)[0] == 576000
    assert m.chunk_size("Broadcast", a, p, np.array([2 ** 30]), nc)[0] == 512 * 1024
    _, nw_tree = m.algo_info(ALGOS.index("TREE"), 1, np.array([1024]))
    assert nw_tree[0] == 20                                          # Tree forced to 640 threads


def test_vectorised_equals_scalar():
    m = NcclModel(preset("a100-2x8"))
    r = m.cost_table("AllReduce", SIZES)
    for i, s in enumerate(SIZES):
        one = m.cost_table("AllReduce", np.array([s]))
        assert np.array_equal(one.table[0], r.table[i])
        assert one.choice_names()[0] == r.choice_names()[i]
        assert one.chunk[0] == r.chunk[i] and one.n_channels[0] == r.n_channels[i]
