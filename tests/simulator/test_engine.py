"""Engine: determinism, seqNumbers, timestamps, each regime's effect on durations, tuner hook."""
from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.collector.wire_format import FUNCS, UNKNOWN
from dynamiccl.harness.simulator import scenario as S
from dynamiccl.harness.simulator import workload as W
from dynamiccl.harness.simulator.cost_model import ALGOS, PROTOS
from dynamiccl.harness.simulator.engine import DEFAULT_EPOCH_NS, Engine

SMALL = W.preset("small")
LLAMA = W.preset("llama7b-tp8-dp2")


def collect(engine, n_steps=None):
    parts = []
    for i, b in enumerate(engine.steps()):
        parts.append((b.ops, b.rank, b.comm))
        if n_steps is not None and i + 1 >= n_steps:
            break
    ops = np.concatenate([p[0] for p in parts])
    rank = np.concatenate([p[1] for p in parts])
    comm = np.concatenate([p[2] for p in parts])
    wl = engine.workload
    group_of = np.array([g.name for g in wl.groups for _ in g.comms])[comm]
    dur = (ops["gpu_end_ns"] - ops["gpu_start_ns"]).astype(np.float64) / 1e3
    t = (ops["gpu_start_ns"] - np.uint64(engine.epoch_ns)).astype(np.float64) / 1e9
    return {"ops": ops, "rank": rank, "comm": comm, "group": group_of, "dur": dur, "t": t}


def scen(*events, sigma=0.0):
    return S.from_dict({"name": "t", "noise_sigma": sigma, "events": list(events)})


def run(events=(), wl=SMALL, duration=0.05, seed=0, sigma=0.0, steps=None, **kw):
    """Records until ``duration`` simulated seconds, or exactly ``steps`` steps (same record layout)."""
    return collect(Engine(wl, scen(*events, sigma=sigma), seed=seed, duration_s=duration if steps is None else 1e9,
                          **kw), steps)


def med(r, mask):
    return float(np.median(r["dur"][mask]))


def test_same_seed_identical_records_different_seed_differs():
    # a fixed number of steps: a duration-bounded run may end a step earlier or later under another seed
    a = run(seed=7, sigma=0.05, steps=30)["ops"]
    b = run(seed=7, sigma=0.05, steps=30)["ops"]
    c = run(seed=8, sigma=0.05, steps=30)["ops"]
    assert a.tobytes() == b.tobytes()
    assert len(a) == len(c) and a.tobytes() != c.tobytes()


def test_records_are_complete_and_well_formed():
    eng = Engine(SMALL, seed=0, duration_s=1.0)
    b = eng.step()
    assert len(b.ops) == SMALL.records_per_step
    assert b.node_bounds.tolist() == [0, 64, 128]
    assert (b.rank[:64] < 8).all() and (b.rank[64:] >= 8).all()          # node-major
    assert (b.ops["gpu_end_ns"] > b.ops["gpu_start_ns"] + 64).all()
    assert (b.ops["gpu_start_ns"] >= DEFAULT_EPOCH_NS).all()
    # node-local keys name a (comm, comm rank) of that node
    for n in range(2):
        inits = eng.node_comms(n)
        ops, keys = b.node(n)
        ranks = b.rank[b.node_bounds[n]:b.node_bounds[n + 1]]
        assert all(inits[k].global_rank == r for k, r in zip(keys.tolist(), ranks.tolist()))
    f = b.ops["func"]
    send, recv = FUNCS.index("Send"), FUNCS.index("Recv")
    assert (f == send).sum() == (f == recv).sum() == 8
    p2p = (f == send) | (f == recv)
    assert (b.ops["algo"][p2p] == UNKNOWN).all() and (b.ops["algo"][~p2p] < len(ALGOS)).all()
    ag = f == FUNCS.index("AllGather")
    assert (b.ops["count"][ag] == 65536 // 16 // 2).all()                # per-rank count
    cross = b.ops["flags"] & 0x8
    tp = np.isin(b.comm, [0, 1])
    assert (cross[tp] == 0).all() and (cross[~tp] != 0).all()


def test_seq_numbers_identical_across_ranks_and_consecutive():
    r = run(duration=0.02)
    ops = r["ops"]
    coll = ops["algo"] != UNKNOWN
    for c in np.unique(r["comm"]):
        for fn in np.unique(ops["func"][coll & (r["comm"] == c)]):
            m = coll & (r["comm"] == c) & (ops["func"] == fn)
            ranks = np.unique(r["rank"][m])
            per_rank = [np.sort(ops["seq_number"][m & (r["rank"] == rk)]) for rk in ranks]
            assert all(np.array_equal(per_rank[0], x) for x in per_rank)
            assert np.array_equal(per_rank[0], np.arange(len(per_rank[0])))
            # one instance = one seq: its ranks share the finish (up to per-rank noise, 0 here)
            seq0 = m & (ops["seq_number"] == 0)
            assert len(np.unique(ops["gpu_end_ns"][seq0])) == 1


def test_ranks_arrive_with_skew():
    r = run(duration=0.01)
    m = (r["comm"] == 0) & (r["ops"]["seq_number"] == 0) & (r["ops"]["func"] == FUNCS.index("AllReduce"))
    assert len(np.unique(r["ops"]["gpu_start_ns"][m])) == 8


def test_bw_drop_hits_network_bound_collectives_only():
    # Losing 60 % of the uplink stretches the bandwidth part of a network-bound op by 1 / 0.4 = 2.5x and
    # leaves its latency part alone: the DP 4 MiB all-reduce (one 400G NIC, ~2/3 bandwidth) lands in
    # (1.6, 2.5]; NVLink-only TP ops do not move. One degraded uplink paces the whole ring: same effect.
    base = run(steps=20)
    dp, tp = base["group"] == "dp", base["group"] == "tp"
    for where in ({}, {"nodes": [1]}):
        drop = run([{"at_s": 0, "kind": "bw_drop", "magnitude": 0.6, **where}], steps=20)
        assert 1.6 < med(drop, dp) / med(base, dp) <= 2.5 * 1.01
        assert med(drop, tp) == pytest.approx(med(base, tp), rel=0.05)


def test_latency_hits_small_messages():
    # +50 us per network crossing: the 8-byte world all-reduce (Tree/LL, 2 nodes: up and down = 2 crossings)
    # gains ~100 us, i.e. it triples; the DP all-reduce (2-rank Ring/Simple, 2 crossings, Simple waits for
    # completion + flush = 3 one-way latencies per crossing) gains ~300 us; NVLink-only TP ops do not move.
    base = run(steps=20)
    lat = run([{"at_s": 0, "kind": "latency", "magnitude": 50}], steps=20)
    ops = base["ops"]
    w = (base["group"] == "world") & (ops["func"] == FUNCS.index("AllReduce"))   # 8-byte all-reduce
    assert {(ALGOS[a], PROTOS[p]) for a, p in zip(ops["algo"][w], ops["proto"][w])} == {("TREE", "LL")}
    assert med(lat, w) - med(base, w) == pytest.approx(2 * 50, rel=0.05)
    assert med(lat, w) > 2.5 * med(base, w)
    dp, tp = base["group"] == "dp", base["group"] == "tp"
    assert {PROTOS[p] for p in ops["proto"][dp]} == {"SIMPLE"}
    assert med(lat, dp) - med(base, dp) == pytest.approx(2 * 3 * 50, rel=0.05)
    assert med(lat, tp) == pytest.approx(med(base, tp), rel=0.02)


def test_incast_is_on_off():
    ev = {"at_s": 0, "kind": "incast", "magnitude": 0.9, "period_s": 0.01, "duty": 0.5}
    base, inc = run(duration=0.1), run([ev], duration=0.1)
    dp = inc["group"] == "dp"
    on = ((inc["t"] % 0.01) < 0.0045) & dp
    off = ((inc["t"] % 0.01) > 0.0055) & (inc["t"] % 0.01 < 0.0095) & dp
    b = med(base, base["group"] == "dp")
    # share 0.9 against NCCL's 8 reference flows = 72 competing flows; the DP op's 4 channels keep
    # 4 / (4 + 72) of the uplink, so its bandwidth part grows 19x (and queueing 10x the base network
    # latency): between 5x and 19x while on, baseline while off
    nch = int(np.median(inc["ops"]["n_channels"][on]))
    assert nch == 4
    assert 5.0 < med(inc, on) / b <= (nch + 72) / nch
    assert med(inc, off) == pytest.approx(b, rel=0.05)


def test_flap_toggles_bandwidth():
    ev = {"at_s": 0, "kind": "flap", "magnitude": 0.8, "period_s": 0.02, "duty": 0.5, "nodes": [1]}
    base, fl = run(duration=0.1), run([ev], duration=0.1)
    dp = fl["group"] == "dp"
    phase = fl["t"] % 0.02
    b = med(base, base["group"] == "dp")
    # down phase: node 1's uplink keeps 20 %: bandwidth part x5 (the whole op between 2.5x and 5x)
    assert 2.5 < med(fl, dp & (phase < 0.009)) / b <= 5.0 * 1.01
    assert med(fl, dp & (phase > 0.011) & (phase < 0.019)) == pytest.approx(b, rel=0.05)


def test_straggler_is_late_and_has_the_shortest_duration():
    r = run([{"at_s": 0, "kind": "straggler", "magnitude": 2000, "ranks": [5]}], steps=10)
    base = run(steps=10)
    tp0 = r["comm"] == 0
    for seq in range(2):
        m = tp0 & (r["ops"]["seq_number"] == seq) & (r["ops"]["func"] == FUNCS.index("AllReduce"))
        starts = r["ops"]["gpu_start_ns"][m]
        durs = r["dur"][m]
        ranks = r["rank"][m]
        assert ranks[np.argmax(starts)] == 5 and ranks[np.argmin(durs)] == 5
    # the peers wait for the late rank: their durations grow by the delay (2000 us); the straggler's own
    # duration is the collective without any wait, no longer than the baseline's
    peers = tp0 & (r["rank"] != 5)
    own = tp0 & (r["rank"] == 5)
    assert med(r, peers) - med(base, peers) == pytest.approx(2000, rel=0.05)
    assert 0.7 * med(base, own) < med(r, own) <= 1.05 * med(base, own)


def test_degrading_nic_ramps_down_within_a_run():
    ev = {"at_s": 0.5, "kind": "degrading_nic", "magnitude": 0.7, "ramp_s": 2.0, "nodes": [0]}
    r = run([ev], wl=LLAMA, duration=3.0)
    dp = r["group"] == "dp"
    windows = [med(r, dp & (r["t"] >= a) & (r["t"] < a + 0.5)) for a in (0.0, 1.0, 1.5, 2.5)]
    assert windows[0] < windows[1] < windows[2] < windows[3]
    # fully degraded (>= 2.5 s): 30 % of node 0's uplink left, the bandwidth part x3.3
    assert 2.5 < windows[3] / windows[0] <= 1 / 0.3 * 1.01


def test_recovery_and_mid_step_change():
    ev = [{"at_s": 0.1, "kind": "bw_drop", "magnitude": 0.6}, {"at_s": 0.5, "kind": "recovery"}]
    r = run(ev, wl=LLAMA, duration=1.0)
    dp = r["group"] == "dp"
    before = med(r, dp & (r["t"] < 0.09))
    during = med(r, dp & (r["t"] > 0.11) & (r["t"] < 0.3))     # inside the first 0.33 s step
    after = med(r, dp & (r["t"] > 0.55))
    assert 1.8 < during / before <= 2.5 * 1.01         # bw_drop 0.6: at most 1 / 0.4
    assert after == pytest.approx(before, rel=0.02)     # recovery: back to the baseline


def test_pause_leaves_a_gap_and_mix_scales_sizes():
    r = run([{"at_s": 0.01, "kind": "pause", "duration_s": 0.02},
             {"at_s": 0.0, "kind": "mix", "magnitude": 2.0, "groups": ["dp"], "duration_s": 0.005}], duration=0.05)
    t = np.sort(r["t"])
    gaps = np.diff(t)
    assert gaps.max() > 0.019
    dp = r["group"] == "dp"
    counts = r["ops"]["count"][dp]
    early = r["t"][dp] < 0.004
    assert (counts[early] == 2 * 4194304 // 2).all() and (counts[r["t"][dp] > 0.04] == 4194304 // 2).all()


class ForceRingSimple:
    def __init__(self, n_channels):
        self.n_channels = n_channels
        self.calls = 0

    def get_coll_info(self, comm, func, nbytes, cost_table):
        self.calls += 1
        assert cost_table.shape == (7, 3)
        t = np.full((7, 3), -1.0, dtype=np.float32)
        t[ALGOS.index("RING"), PROTOS.index("SIMPLE")] = 1.0
        return t, self.n_channels


def test_tuner_hook_changes_the_choice_and_channels():
    tuner = ForceRingSimple(2)
    r = collect(Engine(SMALL, scen(), seed=0, duration_s=1e9, tuner=tuner), 5)
    coll = r["ops"]["algo"] != UNKNOWN
    assert tuner.calls > 0
    assert (r["ops"]["algo"][coll] == ALGOS.index("RING")).all()
    assert (r["ops"]["proto"][coll] == PROTOS.index("SIMPLE")).all()
    assert (r["ops"]["n_channels"][coll] == 2).all()
    base = run(steps=5)
    tp = r["group"] == "tp"
    assert med(r, tp) != pytest.approx(med(base, tp), rel=0.05)   # the choice matters to the durations
