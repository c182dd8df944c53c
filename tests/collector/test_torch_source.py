"""torch.distributed source: records decode with the collector's decoder, fields are right, async
operations are timed at completion (the in-process cases: `test_torch_source_world1.py`).

A 2-rank gloo job (two processes, FileStore rendezvous, no network ports) streams to a unix
socket sink in this process; the in-process tests use a world-size-1 gloo group.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)

from dynamiccl.collector.decode import StreamDecoder  # noqa: E402
from dynamiccl.collector.records import duration_s  # noqa: E402
from dynamiccl.collector.sources import torch_distributed as src  # noqa: E402
from dynamiccl.collector.sources.wire_sender import SenderConfig  # noqa: E402
from dynamiccl.collector.wire_format import DATATYPES, FUNCS, Kind, TimingSource  # noqa: E402
from torch_source_sink import Sink, _wait  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

WORKER = r'''
import json, os, sys, time
import torch, torch.distributed as dist
rank, store = int(sys.argv[1]), sys.argv[2]
if "--enable" in sys.argv:  # the one-line way; rank 0 is started through the runner instead
    import dynamiccl.collector.sources.torch_distributed as d; d.enable()
import dynamiccl.collector.sources.torch_distributed as d
assert d.is_enabled()
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
t = torch.arange(1024, dtype=torch.float32)
dist.all_reduce(t)
dist.all_gather([torch.zeros(1024), torch.zeros(1024)], t)
dist.all_gather_into_tensor(torch.zeros(2048), t)
dist.reduce_scatter(torch.zeros(512), [torch.ones(512), torch.ones(512)])
dist.reduce_scatter_tensor(torch.zeros(512), torch.ones(1024))
dist.broadcast(t, src=1)
dist.barrier()
i64 = torch.zeros(100, dtype=torch.int64)
if rank == 0:
    dist.send(i64, 1)
else:
    dist.recv(i64, 0)
dp = dist.new_group([0, 1], group_desc="dp")
dist.all_reduce(torch.ones(256, dtype=torch.float64), group=dp)
# async collective: rank 1 joins 0.4 s late, rank 0 waits only at 1.0 s
if rank == 1:
    time.sleep(0.4)
w = dist.all_reduce(t, async_op=True)
if rank == 0:
    time.sleep(1.0)
w.wait()
dist.barrier()
# async p2p: rank 0 posts irecv and waits; rank 1 sends 0.4 s later
if rank == 0:
    w = dist.irecv(t, 1)
    assert isinstance(w, dist.Work)
    w.wait()
    w = dist.isend(i64, 1)
    w.wait()
else:
    time.sleep(0.4)
    dist.send(t, 0)
    assert dist.recv(i64) == 0  # any source
time.sleep(0.3)
print(json.dumps(d.stats()), flush=True)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def two_rank_job():
    d = tempfile.mkdtemp(prefix="dccl-ts")
    sink = Sink(os.path.join(d, "c.sock"))
    script = Path(d, "worker.py")
    script.write_text(WORKER)
    env = dict(os.environ, DYNAMICCL_COLLECTOR=f"unix:{sink.path}", DYNAMICCL_JOB_ID="tsjob",
               DYNAMICCL_FLUSH_MS="20", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    store = os.path.join(d, "store")
    procs = [
        subprocess.Popen([sys.executable, "-m", "dynamiccl.collector.sources.torch_distributed", str(script), "0", store],
                         env=dict(env, DYNAMICCL_HOST="h0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        subprocess.Popen([sys.executable, str(script), "1", store, "--enable"],
                         env=dict(env, DYNAMICCL_HOST="h1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    time.sleep(0.2)
    decoded = sink.decoded()
    sink.close()
    stats = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    by_host = {dec.host: (dec, res) for dec, res in decoded}
    return by_host, stats, decoded


def _events(by_host, host):
    dec, res = by_host[host]
    return res.events


def test_every_connection_decodes_with_process_comm_and_stats(two_rank_job):
    by_host, stats, decoded = two_rank_job
    assert len(decoded) == 2, "one connection per process, no reconnects"
    assert set(by_host) == {"h0", "h1"}
    names = [sorted(dec.comm_names.values()) for dec, _ in decoded]
    assert names == [["dp", "world"], ["dp", "world"]]
    # the same group has the same comm_hash on both ranks, and different groups differ
    assert by_host["h0"][0].comm_names == by_host["h1"][0].comm_names
    for dec, res in decoded:
        assert dec.job_id == "tsjob"
        assert len(res.stats) >= 1  # final STATS at shutdown at least
        last = res.stats[-1]
        assert int(last["records_sent"]) == len(res.events) == 13
        assert int(last["records_dropped_ring_full"]) == 0
    for st in stats:
        assert st["records_emitted"] == st["records_sent"] == 13
        assert st["records_undelivered"] == 0 and st["unrecorded"] == 0


def test_fields_of_each_operation(two_rank_job):
    by_host, _, _ = two_rank_job
    f32, f64, i64 = (DATATYPES.index(n) for n in ("ncclFloat32", "ncclFloat64", "ncclInt64"))
    names = {h: by_host[h][0].comm_names for h in by_host}
    expected = {  # (func, bytes, datatype, root, comm name) in call order
        "h0": [("AllReduce", 4096, f32, 0, "world"), ("AllGather", 4096, f32, 0, "world"),
               ("AllGather", 4096, f32, 0, "world"), ("ReduceScatter", 2048, f32, 0, "world"),
               ("ReduceScatter", 2048, f32, 0, "world"), ("Broadcast", 4096, f32, 1, "world"),
               ("AllReduce", 0, 255, 0, "world"), ("Send", 800, i64, 1, "world"),
               ("AllReduce", 2048, f64, 0, "dp"), ("AllReduce", 4096, f32, 0, "world"),
               ("AllReduce", 0, 255, 0, "world"), ("Recv", 4096, f32, 1, "world"),
               ("Send", 800, i64, 1, "world")],
        "h1": [("AllReduce", 4096, f32, 0, "world"), ("AllGather", 4096, f32, 0, "world"),
               ("AllGather", 4096, f32, 0, "world"), ("ReduceScatter", 2048, f32, 0, "world"),
               ("ReduceScatter", 2048, f32, 0, "world"), ("Broadcast", 4096, f32, 1, "world"),
               ("AllReduce", 0, 255, 0, "world"), ("Recv", 800, i64, 0, "world"),
               ("AllReduce", 2048, f64, 0, "dp"), ("AllReduce", 4096, f32, 0, "world"),
               ("AllReduce", 0, 255, 0, "world"), ("Send", 4096, f32, 0, "world"),
               ("Recv", 800, i64, 0, "world")],
    }
    for host, rank in (("h0", 0), ("h1", 1)):
        ev = np.sort(_events(by_host, host), order="enqueue_ns")
        got = [(FUNCS[e["func"]], int(e["bytes"]), int(e["datatype"]), int(e["root"]),
                names[host][int(e["comm_hash"])]) for e in ev]
        assert got == expected[host]
        assert (ev["rank"] == rank).all() and (ev["nranks"] == 2).all()
        p2p = np.isin(ev["func"], [FUNCS.index("Send"), FUNCS.index("Recv")])
        assert (ev["kind"][p2p] == Kind.P2P).all() and (ev["kind"][~p2p] == Kind.COLL).all()
        assert (ev["timing_source"] == TimingSource.KERNEL_CPU).all()
        assert (ev["pid"] == ev["pid"][0]).all() and ev["pid"][0] > 0
        assert sorted(ev["record_seq"].tolist()) == list(range(1, 14))
        assert (ev["count"] * 4 == ev["bytes"])[ev["datatype"] == f32].all()
        d = duration_s(ev)
        assert np.isfinite(d).all() and (d >= 0).all()


def test_instances_have_the_same_seq_number_on_every_rank(two_rank_job):
    by_host, _, _ = two_rank_job
    keys = []
    for host in ("h0", "h1"):
        ev = _events(by_host, host)
        coll = ev[ev["kind"] == Kind.COLL]
        keys.append(sorted(zip(coll["comm_hash"].tolist(), coll["func"].tolist(), coll["seq_number"].tolist())))
    assert keys[0] == keys[1]
    assert len(set(keys[0])) == len(keys[0])  # distinct instances


def test_async_operations_are_timed_until_the_caller_sees_them_complete(two_rank_job):
    by_host, _, _ = two_rank_job
    ev = np.sort(_events(by_host, "h0"), order="enqueue_ns")
    d = duration_s(ev)
    # default "wait" timing. async all_reduce: rank 1 joined 0.4 s late, but rank 0 waited only
    # at 1.0 s → ≈ 1.0 s (an upper bound: the caller's late wait is counted in)
    assert 0.95 <= d[9] <= 1.6, d[9]
    # irecv waited on at once, the peer sent 0.4 s later → ≈ 0.4 s (exact: waited while in flight)
    assert 0.3 <= d[11] <= 0.8, d[11]
    # rank 1 waited on its async all_reduce at once → the completion (rank 0 joined at once: short)
    ev1 = np.sort(_events(by_host, "h1"), order="enqueue_ns")
    assert duration_s(ev1)[9] < 0.5, duration_s(ev1)[9]
