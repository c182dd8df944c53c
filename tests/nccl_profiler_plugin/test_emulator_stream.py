"""End to end: the real plugin .so, driven by the emulator (NCCL's call sequence), streaming
frames to a fake collector that decodes them with dynamiccl.collector.wire_format's dtypes."""
from __future__ import annotations

import subprocess
import time

import numpy as np
import pytest

from dynamiccl.collector import wire_format as wf
from dynamiccl.nccl_profiler_plugin.emulator import FLAGS

F = {n: i for i, n in enumerate(wf.FUNCS)}
DT = {n: i for i, n in enumerate(wf.DATATYPES)}
ALGO = {n: i for i, n in enumerate(wf.ALGOS)}
PROTO = {n: i for i, n in enumerate(wf.PROTOS)}
FLAG = FLAGS  # emu_coll_t.flags (emulator/nccl_emu.h EMU_F_*)
T0 = 1_700_000_000_000_000_000


def make_ops(n: int, seq0: int = 0, **over) -> list[dict]:
    rng = np.random.default_rng(seq0 + 7)
    funcs = ["AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce"]
    ops = []
    for i in range(n):
        seq = seq0 + i
        start = T0 + seq * 100_000
        op = dict(func=F[funcs[i % len(funcs)]], datatype=int(rng.integers(0, len(wf.DATATYPES))),
                  algo=int(rng.integers(0, len(wf.ALGOS))), proto=int(rng.integers(0, len(wf.PROTOS))),
                  n_channels=int(rng.integers(1, 33)), n_warps=int(rng.integers(4, 33)), root=i % 3, flags=0,
                  count=int(rng.integers(1, 1 << 24)), seq_number=seq, gpu_start_ns=start,
                  gpu_end_ns=start + 1000 + int(rng.integers(0, 50_000)))
        op.update(over)
        ops.append(op)
    return ops


def check_events(events: np.ndarray, ops: list[dict], *, comm_hash: int, rank: int, nranks: int, nnodes: int,
                 pid: int | None = None) -> None:
    """Every op has exactly one record and every field matches what the emulator reported."""
    mine = events[events["comm_hash"] == comm_hash]
    assert len(mine) == len(ops), (len(mine), len(ops))
    by_key = {(int(r["func"]), int(r["seq_number"]), int(r["root"])): r for r in mine}
    assert len(by_key) == len(ops), "duplicate records"
    for op in ops:
        r = by_key[(op["func"], op["seq_number"], op["root"])]
        p2p = op["func"] in (F["Send"], F["Recv"])
        if p2p and op["root"] == rank:  # to self: no KernelCh in NCCL, complete at stop
            assert r["channels_seen"] == 0 and r["timing_source"] == wf.TimingSource.NONE
            assert r["bytes"] == op["count"] * wf.DATATYPE_SIZES[op["datatype"]] and r["flags"] == 0
            continue
        assert r["kind"] == (wf.Kind.P2P if p2p else wf.Kind.COLL)
        assert r["datatype"] == op["datatype"]
        assert r["algo"] == (wf.UNKNOWN if p2p else op["algo"])
        assert r["proto"] == (wf.UNKNOWN if p2p else op["proto"])
        assert r["n_channels"] == op["n_channels"] and r["channels_seen"] == op["n_channels"]
        assert r["n_warps"] == (0 if p2p else op["n_warps"])
        assert r["count"] == op["count"]
        assert r["bytes"] == op["count"] * wf.DATATYPE_SIZES[op["datatype"]]
        assert r["root"] == op["root"]
        assert (r["rank"], r["nranks"], r["nnodes"]) == (rank, nranks, nnodes)
        assert r["timing_source"] == wf.TimingSource.KERNEL_GPU
        assert r["gpu_start_ns"] == op["gpu_start_ns"] and r["gpu_end_ns"] == op["gpu_end_ns"]
        assert r["enqueue_ns"] > 1_600_000_000_000_000_000 and r["cpu_end_ns"] >= r["enqueue_ns"]
        assert r["tuner_config_version"] == 0 and r["flags"] == 0
        if pid is not None:
            assert r["pid"] == pid


def proc_and_comms(col, conn=0):
    recs = col.records(conn=conn)
    assert int(recs[0]["kind"]) == wf.Kind.PROCESS, "PROCESS must be first on a connection"
    comms = [r for r in recs if int(r["kind"]) == wf.Kind.COMM]
    return recs[0], comms


@pytest.mark.parametrize("abi", [4, 5, 6, 7])
@pytest.mark.parametrize("threads", [1, 2])
def test_records_every_field(abi, threads, run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    ops_a = make_ops(300)
    ops_b = make_ops(200, seq0=1000)
    res = run_scenario([
        {"op": "init", "hash": 0xA1A2A3A4A5A6A7A8, "name": "dp-group", "nnodes": 2, "nranks": 16, "rank": 5,
         "threads": threads},
        {"op": "init", "hash": 0x42, "name": None, "nnodes": 1, "nranks": 4, "rank": 3, "threads": threads},
        {"op": "run", "comm": 0, "ops": ops_a},
        {"op": "run", "comm": 1, "ops": ops_b},
        {"op": "sync", "comm": 0}, {"op": "sync", "comm": 1},
        {"op": "sleep", "s": 0.3},
        {"op": "finalize", "comm": 0}, {"op": "finalize", "comm": 1},
    ], sock_addr, abi=abi)
    assert res["ok"], res
    assert res["mask"] == 70
    ev = col.events()
    check_events(ev, ops_a, comm_hash=0xA1A2A3A4A5A6A7A8, rank=5, nranks=16, nnodes=2)
    check_events(ev, ops_b, comm_hash=0x42, rank=3, nranks=4, nnodes=1)
    assert len(set(ev["pid"].tolist())) == 1
    seqs = np.sort(ev["record_seq"])
    assert seqs[0] == 1 and np.all(np.diff(seqs) == 1), "record_seq dense without loss"
    proc, comms = proc_and_comms(col)
    assert proc["abi_version"] == abi and proc["job_id"] == b"job-test" and proc["host"]
    assert proc["pid"] == ev["pid"][0]
    names = {int(c["comm_hash"]): (c["comm_name"], int(c["rank"]), int(c["nranks"]), int(c["nnodes"]))
             for c in comms}
    assert names[0xA1A2A3A4A5A6A7A8] == (b"dp-group", 5, 16, 2)
    assert names[0x42] == (b"", 3, 4, 1)
    st = res["stats"]
    assert st["records_emitted"] == 500 and st["records_sent"] == 500
    assert st["records_undelivered"] == 0 and st["events_dropped_pool_full"] == 0
    assert st["records_dropped_ring_full"] == 0 and st["events_stale"] == 0
    final_stats = col.records(wf.Kind.STATS)
    assert final_stats and int(final_stats[-1]["records_emitted"]) == 500
    assert col.bad_frames == 0


def test_p2p_cross_node_pxn_and_null_coll_parent(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    # P2P has no seqNumber in the ABI: the plugin numbers each (send|recv, peer) pair 0, 1, 2, ...
    p2p, ordinal = [], {}
    for i, o in enumerate(make_ops(16)):
        key = ("Send" if i % 2 == 0 else "Recv", i % 4)
        p2p.append(dict(o, func=F[key[0]], root=key[1], seq_number=ordinal.get(key, 0)))
        ordinal[key] = ordinal.get(key, 0) + 1
    colls = make_ops(50, seq0=100, flags=FLAG["CROSS_NODE"] | FLAG["PXN"] | FLAG["NULL_PARENT"])
    res = run_scenario([
        {"op": "init", "hash": 7, "name": "pp", "nnodes": 2, "nranks": 4, "rank": 1, "threads": 2},
        {"op": "run", "ops": p2p}, {"op": "run", "ops": colls}, {"op": "sync"}, {"op": "finalize"},
    ], sock_addr, env={"DYNAMICCL_EVENT_MASK": str(70 | 8 | 16)})  # + ProxyOp|ProxyStep (ignored by the plugin)
    assert res["ok"], res
    ev = col.events()
    check_events(ev, p2p + colls, comm_hash=7, rank=1, nranks=4, nnodes=2)


def test_collector_down_at_start_then_started(start_scenario, collector_factory, sock_addr, tmp_path):
    go = tmp_path / "collector-up"
    ops_a = make_ops(100)
    ops_b = make_ops(120, seq0=500)
    proc, finish = start_scenario([
        {"op": "init", "hash": 9, "name": "x", "threads": 2},
        {"op": "run", "ops": ops_a}, {"op": "sync"},
        {"op": "sleep", "s": 0.4},            # drained while nobody listens: undelivered
        {"op": "touch", "path": str(tmp_path / "a-done")},
        {"op": "wait_path", "path": str(go)},
        {"op": "sleep", "s": 1.0},            # backoff <= 800 ms by now: reconnect happens
        {"op": "run", "ops": ops_b}, {"op": "sync"},
        {"op": "sleep", "s": 0.3},
        {"op": "finalize"},
    ], sock_addr)
    deadline = time.monotonic() + 20
    while not (tmp_path / "a-done").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    col = collector_factory(sock_addr)
    go.touch()
    res = finish()
    assert res["ok"], res
    ev = col.events()
    check_events(ev, ops_b, comm_hash=9, rank=0, nranks=2, nnodes=1)
    # the gap is visible in record_seq (A took 1..100) and counted
    assert int(ev["record_seq"].min()) == 101
    st = res["stats"]
    assert st["records_undelivered"] == 100 and st["records_sent"] == 120 and st["reconnects"] == 0
    proc_and_comms(col)


def test_collector_killed_mid_run_and_restarted(start_scenario, collector_factory, sock_addr, tmp_path):
    ops = [make_ops(100), make_ops(100, seq0=200), make_ops(100, seq0=400)]
    proc, finish = start_scenario([
        {"op": "init", "hash": 11, "name": "k", "threads": 2},
        {"op": "sleep", "s": 0.3},
        {"op": "run", "ops": ops[0]}, {"op": "sync"}, {"op": "sleep", "s": 0.3},
        {"op": "touch", "path": str(tmp_path / "phase1")},
        {"op": "wait_path", "path": str(tmp_path / "killed")},
        {"op": "run", "ops": ops[1]}, {"op": "sync"}, {"op": "sleep", "s": 0.4},
        {"op": "touch", "path": str(tmp_path / "phase2")},
        {"op": "wait_path", "path": str(tmp_path / "restarted")},
        {"op": "sleep", "s": 1.2},
        {"op": "run", "ops": ops[2]}, {"op": "sync"}, {"op": "sleep", "s": 0.3},
        {"op": "finalize"},
    ], sock_addr)
    col1 = collector_factory(sock_addr)

    def wait_file(name):
        deadline = time.monotonic() + 20
        while not (tmp_path / name).exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.poll()
            time.sleep(0.01)

    wait_file("phase1")
    assert col1.wait_for(lambda: len(col1.events()) == 100)
    col1.kill()
    (tmp_path / "killed").touch()
    wait_file("phase2")
    col2 = collector_factory(sock_addr)
    (tmp_path / "restarted").touch()
    res = finish()
    assert res["ok"], res  # the process survived (no SIGPIPE) and finished normally
    check_events(col1.events(), ops[0], comm_hash=11, rank=0, nranks=2, nnodes=1)
    check_events(col2.events(), ops[2], comm_hash=11, rank=0, nranks=2, nnodes=1)
    _, comms = proc_and_comms(col2)                # PROCESS + COMM re-sent on the new connection
    assert [int(c["comm_hash"]) for c in comms] == [11]
    st = res["stats"]
    assert st["records_undelivered"] == 100 and st["records_sent"] == 200 and st["reconnects"] == 1
    assert int(col2.events()["record_seq"].min()) == 201
    # issue 18 #6: the STATS that opens each connection says which connection it is and what was sent
    # before it, so the restarted collector counts the 100 records col1 took with it
    for col, ordinal, sent_before in ((col1, 1, 0), (col2, 2, 100)):
        recs = col.records(conn=0)
        kinds = [int(r["kind"]) for r in recs[:3]]
        # PROCESS first; the opening STATS and the COMM follow in either order (a connection made
        # before the communicator's init sends its STATS first)
        assert kinds[0] == wf.Kind.PROCESS and sorted(kinds[1:]) == sorted([wf.Kind.COMM, wf.Kind.STATS]), kinds
        first_stats = np.array([recs[1 + kinds[1:].index(wf.Kind.STATS)]]).view(wf.STATS_DTYPE)[0]
        assert (int(first_stats["reserved"][0]), int(first_stats["records_sent"])) == (ordinal, sent_before)


def test_tcp_collector(run_scenario, collector_factory):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    addr = f"tcp:127.0.0.1:{port}"
    col = collector_factory(addr)
    ops = make_ops(64)
    res = run_scenario([{"op": "init", "hash": 5, "threads": 1}, {"op": "run", "ops": ops}, {"op": "finalize"}],
                       addr)
    assert res["ok"], res
    assert len(col.events()) == len(ops), res["stats"]
    check_events(col.events(), ops, comm_hash=5, rank=0, nranks=2, nnodes=1)


def test_pool_exhaustion_and_stale_at_finalize(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    lost = make_ops(40, flags=FLAG["NO_KERNEL"])        # children never come: slots stay busy
    res = run_scenario([
        {"op": "init", "hash": 3, "threads": 2}, {"op": "run", "ops": lost}, {"op": "sync"}, {"op": "finalize"},
    ], sock_addr, env={"DYNAMICCL_POOL_SIZE": "8"})
    assert res["ok"], res
    st = res["stats"]
    assert st["events_dropped_pool_full"] == 32 and st["events_stale"] == 8
    ev = col.events()
    assert len(ev) == 8
    assert np.all(ev["flags"] == wf.EventFlags.STALE) and np.all(ev["timing_source"] == wf.TimingSource.NONE)
    assert sorted(ev["seq_number"].tolist()) == list(range(8))


def test_stale_reaper_with_null_kernel_parents(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    orphans = make_ops(20, flags=FLAG["NULL_KCH_PARENT"])  # KernelCh arrive with parentObj = NULL
    good = make_ops(20, seq0=100)
    res = run_scenario([
        {"op": "init", "hash": 4, "threads": 2}, {"op": "run", "ops": orphans}, {"op": "run", "ops": good},
        {"op": "sync"}, {"op": "sleep", "s": 0.8}, {"op": "finalize"},
    ], sock_addr, env={"DYNAMICCL_STALE_MS": "200", "DYNAMICCL_FLUSH_MS": "20"})
    assert res["ok"], res
    ev = col.events()
    check_events(ev[ev["seq_number"] >= 100], good, comm_hash=4, rank=0, nranks=2, nnodes=1)
    stale = ev[ev["seq_number"] < 100]
    assert len(stale) == 20 and np.all(stale["flags"] == wf.EventFlags.STALE)
    assert np.all(stale["channels_seen"] == 0)
    assert res["stats"]["events_stale"] == 20


def test_kernel_cpu_timing(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    ops = make_ops(10, flags=FLAG["NO_GPU_TIMER"])
    res = run_scenario([{"op": "init", "hash": 8}, {"op": "run", "ops": ops}, {"op": "finalize"}], sock_addr)
    assert res["ok"], res
    ev = col.events()
    assert len(ev) == 10 and np.all(ev["timing_source"] == wf.TimingSource.KERNEL_CPU)
    assert np.all(ev["gpu_start_ns"] == 0) and np.all(ev["cpu_end_ns"] >= ev["enqueue_ns"])


def test_sampling_and_min_bytes(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    ops = make_ops(64, datatype=DT["ncclFloat32"])
    for i, o in enumerate(ops):
        o["count"] = 10 if i % 2 else 1000          # 40 B or 4000 B
    res = run_scenario([{"op": "init", "hash": 6}, {"op": "run", "ops": ops}, {"op": "finalize"}], sock_addr,
                       env={"DYNAMICCL_SAMPLE": "4", "DYNAMICCL_MIN_BYTES": "1000"})
    assert res["ok"], res
    ev = col.events()
    expected = [o for o in ops if o["seq_number"] % 4 == 0 and o["count"] == 1000]
    check_events(ev, expected, comm_hash=6, rank=0, nranks=2, nnodes=1)
    assert res["stats"]["sampled_out"] == 32 - len(expected) + 0  # large ops not on the sample grid


def test_kernelch_disabled_emits_at_stop(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    ops = make_ops(20)
    res = run_scenario([{"op": "init", "hash": 12}, {"op": "run", "ops": ops}, {"op": "finalize"}], sock_addr,
                       env={"DYNAMICCL_EVENT_MASK": "2"})
    assert res["ok"] and res["mask"] == 2, res
    ev = col.events()
    assert len(ev) == 20 and np.all(ev["timing_source"] == wf.TimingSource.NONE)
    assert np.all(ev["channels_seen"] == 0) and np.all(ev["cpu_end_ns"] == 0)


@pytest.mark.parametrize("var,value", [("DYNAMICCL_RING_SIZE", "1000"), ("DYNAMICCL_SAMPLE", "0"),
                                       ("DYNAMICCL_COLLECTOR", "http://x"), ("DYNAMICCL_POOL_SIZE", "many")])
def test_invalid_env_fails_init(var, value, run_scenario, sock_addr):
    res = run_scenario([{"op": "init", "hash": 1}], sock_addr, env={var: value})
    assert not res["ok"]
    assert "profiler init failed" in res["error"] and var in res["error"], res["error"]


def test_missing_symbol_is_a_clear_error(built, tmp_path):
    # a library without ncclProfiler_v* symbols: the emulator library itself
    import sys
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from dynamiccl.nccl_profiler_plugin.emulator import Emulator, EmulatorError\n"
            "try:\n    Emulator(%r, 6)\nexcept EmulatorError as e:\n    print(e)\n") % (
        str(built["plugin"].parents[1]), str(built["emu_lib"]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "does not export ncclProfiler_v6" in out


def test_exported_symbols(built):
    out = subprocess.run(["nm", "-D", "--defined-only", str(built["plugin"])], capture_output=True, text=True,
                         check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert names == ["dynamicclProfilerStats", "ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6", "ncclProfiler_v7"]


@pytest.mark.parametrize("threads", [1, 2])
def test_emulate_cli(built, threads, sock_addr, collector_factory):
    col = collector_factory(sock_addr)
    env = {"DYNAMICCL_COLLECTOR": sock_addr, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([str(built["emulate"]), str(built["plugin"]), "--colls", "5000", "--warmup", "0",
                          "--threads", str(threads), "--comms", "3"], capture_output=True, text=True,
                         env=env, check=True, timeout=60).stdout
    assert "ns_per_coll_median=" in out and "calls_per_coll=31.0" in out
    assert "records_emitted=5000 records_sent=5000" in out
    assert col.wait_for(lambda: len(col.events()) == 5000), len(col.events())
