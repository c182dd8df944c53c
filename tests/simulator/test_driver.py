"""Driver end-to-end: engine -> node worker processes -> emulator -> real plugin -> Unix socket -> decode."""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from dynamiccl.collector import wire_format as wf
from dynamiccl.harness.simulator import workload as W
from dynamiccl.harness.simulator.driver import DriverError, SimulatedJob, WireSink
from dynamiccl.harness.simulator.engine import EMU_OP_DTYPE, Engine

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "dynamiccl" / "nccl_profiler_plugin"


@pytest.fixture(scope="module")
def built():
    subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR), "libnccl-profiler-dynamiccl.so", "emulator"],
                   check=True, capture_output=True, text=True)
    return {"plugin": PLUGIN_DIR / "libnccl-profiler-dynamiccl.so",
            "emu_lib": PLUGIN_DIR / "emulator" / "libdccl-nccl-emu.so"}


@pytest.fixture
def sink(tmp_path):
    s = WireSink(f"unix:{tmp_path}/c.sock")
    yield s
    s.close()


def test_emu_record_layout_matches_the_emulator_binding():
    from dynamiccl.nccl_profiler_plugin.emulator import EMU_OP_DTYPE as emu_dtype

    assert EMU_OP_DTYPE == emu_dtype and EMU_OP_DTYPE.itemsize == 64


def expected_records(wl, seed, duration, epoch_ns=None):
    eng = Engine(wl, seed=seed, duration_s=duration, **({} if epoch_ns is None else {"epoch_ns": epoch_ns}))
    parts = [(b.ops, b.rank, b.comm) for b in eng.steps()]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]))


def test_fast_run_delivers_exactly_what_the_engine_produced(built, sink, tmp_path):
    wl = W.preset("small")
    job = SimulatedJob(wl, "stationary", collector=sink.addr, seed=11, duration_s=0.02, out_dir=tmp_path / "out",
                       plugin=built["plugin"], emu_lib=built["emu_lib"], job_id="job-sim-test")
    res = job.start().wait(timeout=60)
    ops, rank, comm = expected_records(wl, 11, 0.02)
    assert res.records == len(ops) > 1000
    assert sink.wait_for(len(ops), timeout=10)
    tot = res.totals()
    assert tot["records_sent"] == len(ops) and tot["records_dropped_ring_full"] == 0
    ev = sink.events()
    assert len(ev) == len(ops)
    assert (ev["timing_source"] == wf.TimingSource.KERNEL_GPU).all()
    comms = wl.comms
    # what each record must carry, from the engine: comm hash, comm rank, nranks, nnodes, func, timing ...
    exp = np.zeros(len(ops), dtype=[("comm_hash", "<u8"), ("rank", "<i4"), ("func", "u1"), ("gpu_start_ns", "<u8"),
                                    ("gpu_end_ns", "<u8"), ("count", "<u8"), ("n_channels", "u1"), ("algo", "u1"),
                                    ("proto", "u1"), ("nranks", "<i4"), ("nnodes", "<i4")])
    exp["comm_hash"] = [comms[c].comm_hash for c in comm]
    exp["rank"] = [comms[c].ranks.index(r) for c, r in zip(comm.tolist(), rank.tolist())]
    exp["nranks"] = [comms[c].n_ranks for c in comm]
    exp["nnodes"] = [comms[c].n_nodes for c in comm]
    for f in ("func", "gpu_start_ns", "gpu_end_ns", "count", "n_channels", "algo", "proto"):
        exp[f] = ops[f]
    got = np.zeros(len(ev), dtype=exp.dtype)
    for f in exp.dtype.names:
        got[f] = ev[f]
    assert np.array_equal(np.sort(got, order=list(exp.dtype.names)), np.sort(exp, order=list(exp.dtype.names)))
    # seqNumbers of collectives arrive as the engine numbered them
    coll = ev["kind"] == wf.Kind.COLL
    key = lambda a, s: np.sort(np.rec.fromarrays([a["comm_hash"], a["rank"], a["func"], s, a["gpu_start_ns"]]))  # noqa: E731
    ecoll = ops["algo"] != wf.UNKNOWN
    assert np.array_equal(key(got[coll], ev["seq_number"][coll]), key(exp[ecoll], ops["seq_number"][ecoll]))
    assert (ev["kind"][~coll] == wf.Kind.P2P).all() and (~coll).sum() == (~ecoll).sum()
    # one PROCESS per node worker, one COMM per (communicator, local rank)
    procs = sink.records(wf.Kind.PROCESS)
    assert len(procs) == 2 and len(set(procs["pid"].tolist())) == 2
    assert set(procs["job_id"].tolist()) == {b"job-sim-test"}
    cm = sink.records(wf.Kind.COMM)
    assert len(cm) == sum(c.n_ranks for c in comms)
    assert {(int(h), int(r)) for h, r in zip(cm["comm_hash"], cm["rank"])} == \
        {(c.comm_hash, i) for c in comms for i in range(c.n_ranks)}
    names = {int(h): n.decode() for h, n in zip(cm["comm_hash"], cm["comm_name"])}
    assert names == {c.comm_hash: c.name for c in comms}
    assert (tmp_path / "out" / "truth.jsonl").exists() and (tmp_path / "out" / "run.json").exists()


def test_worker_host_is_the_simulated_node(built, sink):
    res = SimulatedJob("small", None, collector=sink.addr, duration_s=0.003, plugin=built["plugin"],
                       emu_lib=built["emu_lib"]).start().wait(timeout=60)
    assert sink.wait_for(res.records, timeout=10)
    hosts = sorted(h.decode() for h in sink.records(wf.Kind.PROCESS)["host"])
    if hosts == [socket.gethostname()[:55]] * 2:
        pytest.xfail("the plugin does not honour DYNAMICCL_HOST yet (host = machine name)")
    assert hosts == ["sim-node-00", "sim-node-01"]


def test_realtime_mode_is_paced_to_the_wall_clock(built, sink):
    t0 = time.time_ns()
    job = SimulatedJob("small", None, collector=sink.addr, duration_s=0.5, realtime=True, plugin=built["plugin"],
                       emu_lib=built["emu_lib"])
    job.start()
    time.sleep(0.2)
    mid = sink.count
    res = job.wait(timeout=60)
    assert res.wall_seconds >= 0.45
    assert sink.wait_for(res.records, timeout=10)
    ev = sink.events()
    assert abs(int(ev["gpu_start_ns"].min()) - t0) < 5e9          # epoch = wall clock at start
    assert 0 < mid < res.records                                  # records trickled in while running
    assert job.truth() == []


def test_missing_plugin_gives_a_clear_error(built, tmp_path):
    with pytest.raises(DriverError, match=r"profiler plugin not found at .*nope.so; build it with `make -C"):
        SimulatedJob("small", plugin=tmp_path / "nope.so", emu_lib=built["emu_lib"]).start()
    with pytest.raises(DriverError, match=r"emulator library not found at .*; build it with .* emulator`"):
        SimulatedJob("small", plugin=built["plugin"], emu_lib=tmp_path / "nope.so").start()


def test_plugin_without_the_symbol_or_version_gives_a_clear_error(built, tmp_path):
    with pytest.raises(DriverError, match=r"does not export ncclProfiler_v6"):
        SimulatedJob("small", collector=f"unix:{tmp_path}/x.sock", plugin=built["emu_lib"],
                     emu_lib=built["emu_lib"]).start()
    with pytest.raises(DriverError, match=r"unsupported profiler ABI version 9"):
        SimulatedJob("small", collector=f"unix:{tmp_path}/x.sock", plugin=built["plugin"], emu_lib=built["emu_lib"],
                     abi=9).start()
    bad = tmp_path / "junk.so"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(DriverError, match=r"cannot open profiler plugin .*junk.so"):
        SimulatedJob("small", plugin=bad, emu_lib=built["emu_lib"]).start()


def test_wire_sink_replaces_a_stale_socket_and_refuses_a_live_one(tmp_path):
    """Two sinks on one path would silently split a job's records between them; a dead one's file is reused."""
    path = tmp_path / "c.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()                                   # the file stays, nobody listens
    with WireSink(f"unix:{path}") as live:
        with pytest.raises(OSError, match="another process is listening"):
            WireSink(f"unix:{path}")
        assert path.exists() and live.count == 0    # the live sink keeps its socket
    with pytest.raises(ValueError, match="unix:PATH or tcp:HOST:PORT"):
        WireSink("udp:127.0.0.1:1")
