"""Paths real NCCL takes that the emulator now replays (issue 23): a send/recv to self has no
KernelCh children, CollNet reports nChannels = 0 while its children still arrive, ncclUint8 is
named "Unknown", a communicator can live shorter than one flush. End to end through the real .so,
its sender thread and a collector."""
from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.collector import wire_format as wf
from test_emulator_stream import FLAG, F, check_events, make_ops, proc_and_comms


def alltoall_steps(n_steps: int, nranks: int, rank: int) -> list[dict]:
    """A grouped all-to-all per step (MoE): a Send and a Recv to every peer, self included."""
    ops, seq = [], {}
    base = make_ops(1)[0]
    for step in range(n_steps):
        for peer in range(nranks):
            for func in ("Send", "Recv"):
                k = (func, peer)
                ops.append(dict(base, func=F[func], root=peer, seq_number=seq.get(k, 0), n_channels=2,
                                gpu_start_ns=base["gpu_start_ns"] + step, gpu_end_ns=base["gpu_end_ns"] + step))
                seq[k] = seq.get(k, 0) + 1
    return ops


def test_alltoall_with_self_send_never_fills_the_pool(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    ops = alltoall_steps(100, nranks=4, rank=1)  # 800 operations, 200 of them to self, pool of 32
    res = run_scenario([
        {"op": "init", "hash": 0x77, "nnodes": 1, "nranks": 4, "rank": 1, "threads": 1},
        {"op": "run", "ops": ops}, {"op": "sync"}, {"op": "finalize"},
    ], sock_addr, env={"DYNAMICCL_POOL_SIZE": "32"})
    assert res["ok"], res
    st = res["stats"]
    assert st["events_dropped_pool_full"] == 0 and st["events_stale"] == 0, st
    assert st["records_emitted"] == len(ops) == st["records_sent"]
    ev = col.events()
    check_events(ev, ops, comm_hash=0x77, rank=1, nranks=4, nnodes=1)
    self_recs = ev[ev["root"] == 1]
    assert len(self_recs) == 200 and np.all(self_recs["timing_source"] == wf.TimingSource.NONE)


def run_collnet_mix(run_scenario, collector_factory, sock_addr, *, n, algo, comm, threads, pool):
    """n CollNet ops (nChannels 0, children still replayed) interleaved with n ordinary ones (seq >= 1000)."""
    col = collector_factory(sock_addr)
    collnet = make_ops(n, seq0=0, algo=wf.ALGOS.index(algo), flags=FLAG["COLLNET"])
    normal = make_ops(n, seq0=1000)
    mixed = [op for pair in zip(collnet, normal) for op in pair]
    res = run_scenario([
        {"op": "init", "hash": comm, "nnodes": 2, "nranks": 16, "rank": 3, "threads": threads},
        {"op": "run", "ops": mixed}, {"op": "sync"}, {"op": "finalize"},
    ], sock_addr, env={"DYNAMICCL_POOL_SIZE": str(pool)})
    assert res["ok"], res
    return col.events(), res["stats"], collnet, normal


def test_collnet_zero_channels_children_refused(run_scenario, collector_factory, sock_addr):
    ev, st, collnet, normal = run_collnet_mix(run_scenario, collector_factory, sock_addr, n=60,
                                              algo="COLLNET_DIRECT", comm=0x99, threads=1, pool=1)
    check_events(ev[ev["seq_number"] >= 1000], normal, comm_hash=0x99, rank=3, nranks=16, nnodes=2)
    cn = ev[ev["seq_number"] < 1000]
    assert len(cn) == 60 and np.all(cn["n_channels"] == 0) and np.all(cn["timing_source"] == wf.TimingSource.NONE)
    assert np.all(cn["channels_seen"] == 0) and np.all(cn["flags"] == 0)
    assert st["kernel_ch_rejected"] == sum(op["n_channels"] for op in collnet), st
    assert st["events_stale"] == 0 and st["events_dropped_pool_full"] == 0


def test_collnet_late_children_never_reach_the_next_occupant(run_scenario, collector_factory, sock_addr):
    """Proxy thread behind the application: a CollNet op's children arrive while its slot holds
    later operations. Every record emitted carries exactly its own operation's timing."""
    ev, st, collnet, normal = run_collnet_mix(run_scenario, collector_factory, sock_addr, n=200,
                                              algo="COLLNET_CHAIN", comm=0x9A, threads=2, pool=2)
    assert len(ev) + st["events_dropped_pool_full"] == len(collnet) + len(normal), "every operation accounted for"
    by_seq = {op["seq_number"]: op for op in normal}
    for r in ev[(ev["seq_number"] >= 1000) & (ev["flags"] == 0)]:
        op = by_seq[int(r["seq_number"])]
        assert r["channels_seen"] == op["n_channels"], (r["channels_seen"], op["n_channels"])
        assert (r["gpu_start_ns"], r["gpu_end_ns"]) == (op["gpu_start_ns"], op["gpu_end_ns"])
    assert np.all(ev[ev["seq_number"] < 1000]["channels_seen"] == 0)


def test_uint8_bytes_counted(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    ops = make_ops(20, datatype=wf.DATATYPES.index("ncclUint8"))
    res = run_scenario([{"op": "init", "hash": 0x8}, {"op": "run", "ops": ops}, {"op": "finalize"}], sock_addr)
    assert res["ok"], res
    check_events(col.events(), ops, comm_hash=0x8, rank=0, nranks=2, nnodes=1)


def test_short_lived_comm_is_announced(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    res = run_scenario([
        {"op": "init", "hash": 0x1, "name": "world", "threads": 1},
        {"op": "sleep", "s": 0.3},                      # connected, world announced
        {"op": "init", "hash": 0x2, "name": "probe", "threads": 1},
        {"op": "run", "comm": 1, "ops": make_ops(3)},
        {"op": "finalize", "comm": 1},                   # gone long before the next flush
        {"op": "sleep", "s": 1.5},
        {"op": "finalize", "comm": 0},
    ], sock_addr, env={"DYNAMICCL_FLUSH_MS": "1000"})
    assert res["ok"], res
    _, comms = proc_and_comms(col)
    names = {int(c["comm_hash"]): c["comm_name"] for c in comms}
    assert names.get(0x2) == b"probe", names
    assert len(col.events()) == 3


def test_v7_user_tag_and_symmetric(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    tagged = make_ops(30, flags=FLAG["TAGGED"] | FLAG["SYMMETRIC"])
    plain = make_ops(30, seq0=500)
    res = run_scenario([
        {"op": "init", "hash": 0x7, "threads": 2}, {"op": "run", "ops": tagged + plain}, {"op": "sync"},
        {"op": "finalize"},
    ], sock_addr, abi=7)
    assert res["ok"], res
    ev = col.events()
    t = ev[ev["seq_number"] < 500]
    assert len(t) == 30
    assert np.all(t["user_tag"] == (0x5400000000000000 | t["seq_number"]))
    assert np.all(t["flags"] == wf.EventFlags.SYMMETRIC)
    assert np.all(t["kernel_variant"] == wf.kernel_variant_hash("sym"))  # the emulator's kernelVariant names
    check_events(ev[ev["seq_number"] >= 500], plain, comm_hash=0x7, rank=0, nranks=2, nnodes=1)
    assert np.all(ev[ev["seq_number"] >= 500]["user_tag"] == 0)
    assert np.all(ev[ev["seq_number"] >= 500]["kernel_variant"] == wf.kernel_variant_hash("default"))


def test_kernel_variant_only_from_v7(run_scenario, collector_factory, sock_addr):
    """Before v7 the ABI has no kernelVariant: the field stays 0 (as in records of older plugins)."""
    col = collector_factory(sock_addr)
    res = run_scenario([{"op": "init", "hash": 0x8}, {"op": "run", "ops": make_ops(10, flags=FLAG["SYMMETRIC"])},
                        {"op": "finalize"}], sock_addr, abi=6)
    assert res["ok"], res
    assert len(col.events()) == 10 and np.all(col.events()["kernel_variant"] == 0)


@pytest.mark.parametrize("abi", [6, 7])
def test_copy_engine_collectives_counted(abi, run_scenario, collector_factory, sock_addr):
    """Copy-engine collectives (NCCL 2.29+, ncclLaunchCeColl) have no Coll event and no kernel: with
    CeColl (4096) in the mask each is one record, flag COPY_ENGINE, enqueue time only."""
    col = collector_factory(sock_addr)
    ce = make_ops(25, func=F["AllGather"], flags=FLAG["CE"])
    normal = make_ops(25, seq0=100)
    res = run_scenario([
        {"op": "init", "hash": 0xCE, "threads": 2}, {"op": "run", "ops": ce + normal}, {"op": "sync"},
        {"op": "finalize"},
    ], sock_addr, abi=abi, env={"DYNAMICCL_EVENT_MASK": str(70 | 4096)})
    assert res["ok"], res
    ev = col.events()
    c = ev[ev["seq_number"] < 100]
    assert len(c) == 25 and np.all(c["flags"] == wf.EventFlags.COPY_ENGINE)
    assert np.all(c["timing_source"] == wf.TimingSource.NONE) and np.all(c["func"] == F["AllGather"])
    assert np.all(c["bytes"] == np.array([o["count"] * wf.DATATYPE_SIZES[o["datatype"]] for o in ce]))
    check_events(ev[ev["seq_number"] >= 100], normal, comm_hash=0xCE, rank=0, nranks=2, nnodes=1)
    assert res["stats"]["records_emitted"] == 50


@pytest.mark.parametrize("abi,chained", [(6, 0), (7, 0), (7, 70 | 32768), (7, 70)])
def test_kernel_phase_initial_sync(abi, chained, built, run_scenario, collector_factory, sock_addr):
    """v7 KernelPhase (mask bit 32768): each record carries its longest initial_sync phase (a rank's
    wait for its peers). The emulator's channel c waits 100 + c ns; v6 has no phases: 0. The same
    with a profiler chained behind ours (DYNAMICCL_PROFILER_CHAIN, its mask: with KernelPhase the phase
    handles go through the chain; without, the phases under a chained KernelCh are ours alone)."""
    col = collector_factory(sock_addr)
    ops = make_ops(40, flags=FLAG["PHASES"])
    env = {"DYNAMICCL_EVENT_MASK": str(70 | 32768)}
    if chained:
        env |= {"DYNAMICCL_PROFILER_CHAIN": str(built["chain_probe"]), "CHAIN_PROBE_MASK": str(chained)}
    res = run_scenario([
        {"op": "init", "hash": 0x5C, "threads": 2}, {"op": "run", "ops": ops}, {"op": "sync"}, {"op": "finalize"},
    ], sock_addr, abi=abi, env=env)
    assert res["ok"], res
    ev = col.events()
    check_events(ev, ops, comm_hash=0x5C, rank=0, nranks=2, nnodes=1)
    want = {op["seq_number"]: (100 + op["n_channels"] - 1 if abi == 7 else 0) for op in ops}
    assert all(int(r["sync_wait_ns"]) == want[int(r["seq_number"])] for r in ev)


@pytest.mark.parametrize("threads", [1, 2])
def test_stale_kernelch_ptimers_after_self_send_are_not_gpu_timed(run_scenario, collector_factory, sock_addr,
                                                                  threads):
    """NCCL 2.28 after a send/recv to self replays older kernels' pTimers (emulator STALE_PTIMER: start
    6 kernels back, stop 2 back). The records before it keep their exact GPU times; the ones after are
    untimed (NONE: no latency to trust) and flagged TIMING_SUSPECT, counted in STATS."""
    col = collector_factory(sock_addr)
    before = make_ops(40, seq0=0, n_channels=8)
    self_pair = [dict(before[0], func=F[f], root=1, seq_number=0, n_channels=2) for f in ("Send", "Recv")]
    after = make_ops(40, seq0=100, n_channels=8, flags=FLAG["STALE_PTIMER"])
    res = run_scenario([
        {"op": "init", "hash": 0x5E1F, "nnodes": 1, "nranks": 4, "rank": 1, "threads": threads},
        {"op": "run", "ops": before + self_pair + after}, {"op": "sync"}, {"op": "finalize"},
    ], sock_addr)
    assert res["ok"], res
    ev = col.events()
    check_events(ev[ev["seq_number"] < 100], before + self_pair, comm_hash=0x5E1F, rank=1, nranks=4, nnodes=1)
    late = ev[ev["seq_number"] >= 100]
    assert len(late) == len(after)
    assert not np.any(late["timing_source"] == wf.TimingSource.KERNEL_GPU)
    assert np.all(late["timing_source"] == wf.TimingSource.NONE)
    assert np.all(late["flags"] == wf.EventFlags.TIMING_SUSPECT)
    assert np.all(late["cpu_end_ns"] >= late["enqueue_ns"]) and np.all(late["channels_seen"] == 8)
    assert res["stats"]["kernel_ch_timing_suspect"] == len(after)


@pytest.mark.parametrize("abi", [6, 7])
def test_collectives_without_coll_event_counted(abi, run_scenario, collector_factory, sock_addr):
    """Coverage: NCCL 2.28+ starts a CollApi event for every collective call, but runs some without a
    Coll event (several broadcast roots in one group, symmetric kernels before 2.31). Those calls are
    counted in STATS colls_without_event; copy-engine collectives (CeColl) and ordinary ones are not."""
    col = collector_factory(sock_addr)
    hidden = make_ops(7, func=F["Broadcast"], flags=FLAG["NO_COLL_EVENT"])
    ce = make_ops(5, func=F["AllGather"], flags=FLAG["CE"], seq0=100)
    normal = make_ops(20, seq0=200)
    res = run_scenario([
        {"op": "init", "hash": 0xC0, "threads": 2}, {"op": "run", "ops": hidden + ce + normal}, {"op": "sync"},
        {"op": "finalize"},
    ], sock_addr, abi=abi, env={"DYNAMICCL_EVENT_MASK": str(70 | 4096), "NCCL_ALLGATHERV_ENABLE": "0"})
    assert res["ok"], res
    st = res["stats"]
    assert st["colls_without_event"] == 7, st
    assert st["records_emitted"] == 25 == st["records_sent"], st
    check_events(col.events()[col.events()["seq_number"] >= 200], normal, comm_hash=0xC0, rank=0, nranks=2,
                 nnodes=1)


@pytest.mark.parametrize("abi, allgatherv, api_level", [(5, None, False), (6, None, True), (7, None, True),
                                                        (7, "1", True), (7, "0", False)])
def test_broadcasts_nccl_runs_without_an_event_are_recorded_at_the_api_level(
        abi, allgatherv, api_level, run_scenario, collector_factory, sock_addr):
    """NCCL 2.29+ (ABI 6+) runs every ncclBroadcast through its AllGatherV path with no Coll event (seen on
    real 2.30.7-2.32.3): the CollApi event becomes an API-level record (func, count, root, enqueue time;
    timing NONE, algo/proto UNKNOWN, flag API_LEVEL), in call order. With NCCL_ALLGATHERV_ENABLE=0 (NCCL's
    old path) and on ABI 5 a Broadcast has its Coll event and an ordinary GPU-timed record, never both."""
    col = collector_factory(sock_addr)
    hidden = make_ops(6, func=F["Broadcast"], datatype=wf.DATATYPES.index("ncclFloat32"))  # the emulator: no Coll on 6+
    normal = make_ops(10, seq0=200, func=F["AllReduce"])
    env = {"DYNAMICCL_EVENT_MASK": "70", "NCCL_ALLGATHERV_ENABLE": allgatherv or ""}  # "": NCCL's default
    res = run_scenario([
        {"op": "init", "hash": 0xB0, "threads": 2}, {"op": "run", "ops": hidden + normal}, {"op": "sync"},
        {"op": "finalize"},
    ], sock_addr, abi=abi, env=env)
    assert res["ok"], res
    st, ev = res["stats"], col.events()
    api = ev[(ev["flags"] & wf.EventFlags.API_LEVEL) != 0]
    assert st["records_emitted"] == st["records_sent"] == 16 and st["colls_without_event"] == 0, st
    assert len(api) == 6 * api_level
    bc = ev[ev["func"] == F["Broadcast"]]
    assert len(bc) == 6 and np.all((bc["timing_source"] == wf.TimingSource.KERNEL_GPU) != api_level)
    if api_level:
        assert np.all(api["func"] == F["Broadcast"]) and np.all(api["timing_source"] == wf.TimingSource.NONE)
        assert np.all(api["algo"] == wf.UNKNOWN) and np.all(api["proto"] == wf.UNKNOWN)
        assert list(api["seq_number"]) == list(range(6)) and list(api["root"]) == [o["root"] for o in hidden]
        assert list(api["count"]) == [o["count"] for o in hidden]
        assert list(api["bytes"]) == [4 * o["count"] for o in hidden]
