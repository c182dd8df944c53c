"""torch.distributed source: records decode with the collector's decoder, fields are right, async
operations are timed at completion, overload drops and counts, a missing collector costs nothing.

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


class Sink:
    """Unix-socket server keeping each connection's bytes."""

    def __init__(self, path: str):
        self.path = path
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(16)
        self.conns: list[bytearray] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            buf = bytearray()
            with self._lock:
                self.conns.append(buf)
            threading.Thread(target=self._read, args=(c, buf), daemon=True).start()

    @staticmethod
    def _read(c, buf):
        with c:
            while True:
                try:
                    b = c.recv(1 << 16)
                except OSError:
                    return
                if not b:
                    return
                buf.extend(b)

    def decoded(self):
        out = []
        with self._lock:
            conns = [bytes(b) for b in self.conns]
        for raw in conns:
            dec = StreamDecoder()
            res = dec.feed(raw)
            assert res.consumed == len(raw), "a partial frame was left on a finished connection"
            out.append((dec, res))
        return out

    def close(self):
        self.srv.close()


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


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


def _received(sink, n, timeout=10.0):
    """(decoder, result) of the sink's first connection once ``n`` events have arrived (the
    source counting them sent does not mean the sink's reader thread has them yet)."""
    def enough():
        try:
            got = sink.decoded()
        except AssertionError:  # a frame still half-way through the socket
            return False
        # events is None while only the PROCESS/COMM frames have arrived
        return bool(got) and got[0][1].events is not None and len(got[0][1].events) >= n
    assert _wait(enough, timeout)
    return sink.decoded()[0]


def _stream_events(sink, n, timeout=10.0):
    return np.sort(_received(sink, n, timeout)[1].events, order="enqueue_ns")


@pytest.mark.parametrize("mode", ["wait", "callback"])
def test_async_timing_modes(world1, mode):
    """``wait``: completion = when the caller sees it (wait / is_completed / the future);
    ``callback``: the future's done-callback, however late the caller waits."""
    d = tempfile.mkdtemp(prefix="dccl-at")
    sink = Sink(os.path.join(d, "c.sock"))
    unpatched = {name: vars(dist.Work)[name] for name in ("wait", "is_completed", "get_future")}
    src.enable(f"unix:{sink.path}", host="h", job_id="j", flush_ms=20, async_timing=mode)
    try:
        t = torch.ones(8)
        w = dist.all_reduce(t, async_op=True)  # world 1: complete almost at once
        assert type(w) is dist.Work            # the backend's own Work object, not a wrapper
        time.sleep(0.3)
        assert w.wait() is True
        w.wait()                               # a second wait records nothing more
        w2 = dist.all_reduce(t, async_op=True)
        time.sleep(0.2)
        while not w2.is_completed():
            time.sleep(0.001)
        w2.wait()
        w3 = dist.all_reduce(t, async_op=True)
        time.sleep(0.2)
        w3.get_future().wait()                 # taken after completion: its callback runs at once
        ev = _stream_events(sink, 3)
        assert len(ev) == 3 and (ev["timing_source"] == TimingSource.KERNEL_CPU).all()
        dur = duration_s(ev)
        if mode == "wait":  # each timed when the caller saw it done: 0.3 s, 0.2 s, 0.2 s after the call
            assert 0.29 <= dur[0] < 1.0 and 0.19 <= dur[1] < 1.0 and 0.19 <= dur[2] < 1.0, dur
        else:               # the completion itself (world 1: at once), however late the caller looked:
            # below the 0.2 s the caller waited (a loaded machine delays the callback thread, not to 0.2 s)
            assert (dur < 0.19).all(), dur
        assert src.stats()["async_pending"] == 0 and src.stats()["events_stale"] == 0
    finally:
        src.disable()
        sink.close()
    assert {name: vars(dist.Work)[name] for name in unpatched} == unpatched  # disable() restores


def test_async_work_never_waited_is_sent_untimed_and_counted_stale(world1):
    cfg = src.TorchSourceConfig(sender=SenderConfig(collector="unix:/nonexistent/x.sock", host="h",
                                                    job_id="j", flush_ms=60_000), pending_cap=4)
    rec = src.enable(config=cfg)
    try:
        t = torch.ones(4)
        kept = [dist.all_reduce(t, async_op=True) for _ in range(6)]  # 2 over the cap
        st = src.stats()
        assert st["async_pending"] == 4 and st["events_stale"] == 2
        for w in kept[2:]:
            w.wait()
        st = src.stats()
        assert st["async_pending"] == 0 and st["events_stale"] == 2 and st["records_emitted"] == 6
        dropped = dist.all_reduce(t, async_op=True)  # never observed: untimed at disable()
        del dropped
        timing = [item[-1] for item in rec.queue]
    finally:
        src.disable()
    assert timing.count(TimingSource.NONE) == 2 and timing.count(TimingSource.KERNEL_CPU) == 4
    assert rec.stale == 3  # the one dropped unwaited, at disable()


def test_bad_async_timing_is_named():
    with pytest.raises(ValueError, match="DYNAMICCL_TORCH_ASYNC_TIMING"):
        src.TorchSourceConfig.from_env({"DYNAMICCL_TORCH_ASYNC_TIMING": "later"})


# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world1():
    d = tempfile.mkdtemp(prefix="dccl-w1")
    dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
    yield
    src.disable()
    dist.destroy_process_group()


def test_overload_drops_and_counts_without_blocking(world1):
    cfg = src.TorchSourceConfig(sender=SenderConfig(collector="unix:/nonexistent/x.sock", host="h",
                                                    job_id="j", queue_size=8, flush_ms=60_000))
    rec = src.enable(config=cfg)
    try:
        t = torch.ones(4)
        for _ in range(50):
            dist.all_reduce(t)
        st = src.stats()
        assert st["queued"] == 8
        assert st["records_dropped_ring_full"] == 42
        assert st["records_emitted"] == 8
        rec.sender.flush_once()  # collector down: taken and counted undelivered
        st = src.stats()
        assert st["queued"] == 0 and st["records_undelivered"] == 8 and st["records_sent"] == 0
    finally:
        src.disable()
    assert not src.is_enabled() and not getattr(dist.all_reduce, "_dynamiccl_wrapper", False)


def test_collector_down_then_up_reconnects_with_process_and_comm_first(world1):
    d = tempfile.mkdtemp(prefix="dccl-ru")
    path = os.path.join(d, "c.sock")
    src.enable(f"unix:{path}", host="hx", job_id="jx", flush_ms=20)
    try:
        t = torch.ones(16)
        t0 = time.perf_counter()
        for _ in range(20):
            dist.all_reduce(t)
        assert time.perf_counter() - t0 < 5  # no connect attempts on the caller's thread
        assert _wait(lambda: src.stats()["records_undelivered"] == 20)
        sink = Sink(path)
        assert _wait(lambda: src.stats()["connected"], timeout=15)
        for _ in range(5):
            dist.all_reduce(t)
        assert _wait(lambda: src.stats()["records_sent"] == 5)
        dec, res = _received(sink, 5)
        assert dec.host == "hx" and dec.job_id == "jx" and list(dec.comm_names.values()) == ["world"]
        assert len(res.events) == 5
        # record_seq continues after the 20 undelivered: the collector sees a delivery gap
        assert res.events["record_seq"].tolist() == [21, 22, 23, 24, 25]
        sink.close()
    finally:
        src.disable()


def test_tcp_stream_into_the_collector_pipeline(world1):
    from dynamiccl.collector.config import default_config
    from dynamiccl.collector.pipeline import Pipeline
    cfg = default_config().replace(receiver={"listen": ("tcp:127.0.0.1:0",)}, parquet={"directory": None},
                                   prometheus={"address": None}, features={"address": None},
                                   window={"window_s": 0.5, "allowed_lateness_s": 0.1, "idle_flush_s": 0.5})
    with Pipeline(cfg) as p:
        sub = p.subscribe()
        addr = p.addresses["listen"][0]
        src.enable(addr, host="tcp-host", job_id="tcpjob", flush_ms=20)
        try:
            t = torch.ones(1 << 12)
            for _ in range(30):
                dist.all_reduce(t)
            assert _wait(lambda: src.stats()["records_sent"] == 30)
        finally:
            src.disable()
        assert _wait(lambda: p.metrics.snapshot()["records_decoded_total"] == 30)
    windows = []
    while (wf := sub.get(timeout=1)) is not None:
        windows.append(wf)
    keys = [wf.keys for wf in windows if wf.keys.height]
    assert sum(int(k["records"].sum()) for k in keys) == 30
    row = keys[0].row(0, named=True)
    assert (row["job_id"], row["func"], row["comm_name"], row["size_bucket"]) == ("tcpjob", "AllReduce", "world", 14)
    assert row["lat_p50_s"] > 0


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="DYNAMICCL_COLLECTOR"):
        SenderConfig.from_env({"DYNAMICCL_COLLECTOR": "udp:1.2.3.4:5"})
    with pytest.raises(ValueError, match="DYNAMICCL_RING_SIZE"):
        SenderConfig.from_env({"DYNAMICCL_RING_SIZE": "lots"})
    with pytest.raises(ValueError, match="queue_size"):
        SenderConfig.from_env({"DYNAMICCL_RING_SIZE": "0"})


def test_every_connection_opens_with_stats_naming_its_ordinal_and_what_was_sent_before():
    """Issue 18 #6: a restarted collector could not know what the Python sender had sent to its predecessor."""
    import socket as _socket

    from dynamiccl.collector.sources.wire_sender import Comm, SenderConfig, WireSender
    s = WireSender(SenderConfig(collector="unix:/nonexistent", host="h0", job_id="j"))
    comm = Comm(comm_hash=0xABC, name="world", rank=0, nranks=2, nnodes=1)
    s.register_comm(comm)
    seen = []
    for k in range(2):
        a, b = _socket.socketpair()
        s.attach(a)
        s.queue.extend([(comm, 1, 1, 6, 0, 256, 1024, 0, 1_000, 51_000, 2)] * 5)
        s.flush_once()
        res = StreamDecoder().feed(b.recv(1 << 20))
        st = res.stats[0]
        seen.append((int(st["reserved"][0]), int(st["records_sent"])))
        a.close()
        b.close()
    assert seen == [(1, 0), (2, 5)]
