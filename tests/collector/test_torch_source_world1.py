"""torch.distributed source in process (a world-size-1 gloo group): async timing modes, work never waited,
overload drops and counts without blocking, a collector that is down then up, the TCP stream into the
pipeline, bad settings named, every connection's opening stats."""
from __future__ import annotations

import os
import socket
import tempfile
import time

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
from dynamiccl.collector.wire_format import TimingSource  # noqa: E402
from torch_source_sink import Sink, _wait  # noqa: E402


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
    # callback mode: the caller looks 1 s late, so a callback thread a loaded machine delays by up to
    # half of that still tells the completion from the caller's look
    late = 1.0
    d = tempfile.mkdtemp(prefix="dccl-at")
    sink = Sink(os.path.join(d, "c.sock"))
    unpatched = {name: vars(dist.Work)[name] for name in ("wait", "is_completed", "get_future")}
    src.enable(f"unix:{sink.path}", host="h", job_id="j", flush_ms=20, async_timing=mode)
    try:
        t = torch.ones(8)
        w = dist.all_reduce(t, async_op=True)  # world 1: complete almost at once
        assert type(w) is dist.Work            # the backend's own Work object, not a wrapper
        time.sleep(0.3 if mode == "wait" else late)
        assert w.wait() is True
        w.wait()                               # a second wait records nothing more
        w2 = dist.all_reduce(t, async_op=True)
        time.sleep(0.2 if mode == "wait" else late)
        while not w2.is_completed():
            time.sleep(0.001)
        w2.wait()
        w3 = dist.all_reduce(t, async_op=True)
        time.sleep(0.2 if mode == "wait" else late)
        w3.get_future().wait()                 # taken after completion: its callback runs at once
        ev = _stream_events(sink, 3)
        assert len(ev) == 3 and (ev["timing_source"] == TimingSource.KERNEL_CPU).all()
        dur = duration_s(ev)
        if mode == "wait":  # each timed when the caller saw it done: 0.3 s, 0.2 s, 0.2 s after the call
            assert 0.29 <= dur[0] < 1.0 and 0.19 <= dur[1] < 1.0 and 0.19 <= dur[2] < 1.0, dur
        else:               # the completion itself (world 1: at once), however late the caller looked
            assert (dur < 0.5 * late).all(), dur
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
