"""The plugin stream receiver over real sockets: good data, every kind of bad input, gaps."""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from dynamiccl.collector.pipeline import Pipeline
from dynamiccl.harness.collector_testing import (comm_record, encode_frame, encode_frames, header, process_record,
                               stats_record, synthetic_events)
from dynamiccl.collector.wire_format import EVENT_DTYPE, MAX_RECORDS_PER_FRAME

from collector_helpers import connect, quiet_config, sock_path, wait_until  # noqa: F401 (fixtures)


def _hello(host="nodeA", job="job1", pid=1000, start_ns=1):
    return encode_frame(np.concatenate([
        process_record(host, job, pid, start_ns=start_ns).view(EVENT_DTYPE),
        comm_record(0x1111_2222_3333_4444, "world", pid=pid).view(EVENT_DTYPE)]))


@pytest.fixture
def pipe(quiet_config, sock_path):
    cfg = quiet_config.replace(receiver={"listen": (f"unix:{sock_path}", "tcp:127.0.0.1:0")},
                               window={"idle_flush_s": 0.3})
    p = Pipeline(cfg).start()
    yield p
    p.shutdown()


def _connect(p, which=0):
    return connect(p.addresses["listen"][which])


def _good(p, n=50, which=0, pid=1000, seq_base=1):
    ev = synthetic_events(n, nranks=2, seed=pid, pid_base=pid, seq_base=seq_base)
    ev = ev[ev["rank"] == 0]
    s = _connect(p, which)
    s.sendall(_hello(pid=pid) + encode_frames(ev, per_frame=16))
    return s, ev


@pytest.mark.parametrize("which", [0, 1], ids=["unix", "tcp"])
def test_good_connection_is_decoded_and_aggregated(pipe, which):
    sub = pipe.subscribe()
    s, ev = _good(pipe, which=which)
    assert wait_until(lambda: pipe.metrics.decoded == len(ev))
    assert pipe.metrics.received == len(ev) + 2  # + PROCESS + COMM
    s.close()
    wf = sub.get(timeout=5)
    assert wf is not None and wf.keys["records"].sum() == len(ev)
    assert set(wf.keys["comm_name"].to_list()) <= {"world", ""}
    assert "world" in wf.keys["comm_name"].to_list()
    assert wf.ranks["host"].to_list() == ["nodeA"] * wf.ranks.height


BAD = {
    "bad_magic": lambda: encode_frame(process_record("h", "j", 1), magic=0x12345678),
    "bad_version": lambda: encode_frame(process_record("h", "j", 1), version=2),
    "bad_record_size": lambda: encode_frame(process_record("h", "j", 1), record_size=120),
    "too_many_records": lambda: header(MAX_RECORDS_PER_FRAME + 1),
    "truncated": lambda: encode_frame(process_record("h", "j", 1)) + header(10) + b"\0" * 300,
    "no_process": lambda: encode_frame(synthetic_events(2, nranks=2)),
    "garbage": lambda: bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_drops_only_that_connection(pipe, case, caplog):
    good, ev = _good(pipe, n=20)
    assert wait_until(lambda: pipe.metrics.decoded == len(ev))
    bad = _connect(pipe, 1)
    bad.sendall(BAD[case]())
    if case == "truncated":
        bad.shutdown(socket.SHUT_WR)
    reason = "bad_magic" if case == "garbage" else case
    assert wait_until(lambda: pipe.metrics.malformed[reason] == 1), pipe.metrics.malformed
    assert sum(pipe.metrics.malformed.values()) == 1
    # the server closed the bad connection ...
    bad.settimeout(5)
    assert bad.recv(10) == b""
    bad.close()
    # ... and logged one clear line naming the reason
    lines = [r.getMessage() for r in caplog.records if "dropping the connection" in r.getMessage()]
    assert len(lines) == 1
    # the good connection is still served
    more = synthetic_events(20, nranks=2, seed=9, pid_base=1000, seq_base=1000)
    more = more[more["rank"] == 0]
    good.sendall(encode_frames(more))
    assert wait_until(lambda: pipe.metrics.decoded == len(ev) + len(more))
    assert pipe.metrics.connections_open == 1
    good.close()


def test_flood_is_cut_off(quiet_config, sock_path):
    cfg = quiet_config.replace(receiver={"listen": (f"unix:{sock_path}",),
                                         "max_records_per_s_per_connection": 1000})
    with Pipeline(cfg) as p:
        s = _connect(p)
        ev = synthetic_events(1000, nranks=2)
        try:
            s.sendall(_hello() + encode_frames(ev, per_frame=500))
        except OSError:
            pass
        assert wait_until(lambda: p.metrics.malformed["flood"] == 1)
        assert p.metrics.dropped["flood"] > 0
        assert wait_until(lambda: p.metrics.connections_open == 0)
        s.close()


def test_delivery_gap_counted_across_reconnect(pipe):
    ev = synthetic_events(30, nranks=1, pid_base=77, seq_base=1)  # record_seq 1..30
    s = _connect(pipe)
    s.sendall(_hello(pid=77) + encode_frame(ev[:10]))
    assert wait_until(lambda: pipe.metrics.decoded == 10)
    s.close()
    # reconnect (same process): records 11..15 were lost in transit
    s = _connect(pipe, 1)
    s.sendall(_hello(pid=77) + encode_frame(ev[15:]))
    assert wait_until(lambda: pipe.metrics.decoded == 25)
    assert pipe.metrics.gap_records == {("job1", "nodeA"): 5}
    assert pipe.metrics.gaps == {("job1", "nodeA"): 1}
    # a different process (restart: new start_ns) starting anywhere is not a gap
    s2 = _connect(pipe)
    s2.sendall(_hello(pid=77, start_ns=2) + encode_frame(ev[20:]))
    assert wait_until(lambda: pipe.metrics.decoded == 35)
    assert pipe.metrics.gap_records == {("job1", "nodeA"): 5}
    s.close()
    s2.close()


def test_stats_records_become_plugin_metrics(pipe):
    s = _connect(pipe)
    st = stats_record(1000, records_sent=500, events_dropped_pool_full=7, records_dropped_ring_full=2)
    s.sendall(_hello() + encode_frame(st))
    assert wait_until(lambda: pipe.plugin_stats.totals())
    t = pipe.plugin_stats.totals()[("job1", "nodeA")]
    assert t["records_sent"] == 500 and t["events_dropped_pool_full"] == 7
    s.close()


def test_many_concurrent_connections(pipe):
    socks, total = [], 0
    for pid in range(2000, 2040):
        s, ev = _good(pipe, n=10, which=pid % 2, pid=pid)
        socks.append(s)
        total += len(ev)
    assert wait_until(lambda: pipe.metrics.decoded == total)
    assert pipe.metrics.connections_open == 40
    for s in socks:
        s.close()
    assert wait_until(lambda: pipe.metrics.connections_open == 0)


def test_queue_overflow_drops_and_counts(quiet_config):
    cfg = quiet_config.replace(window={"queue_max_records": 100})
    p = Pipeline(cfg)  # not started: the aggregator worker does not drain the queue
    ev = synthetic_events(30, nranks=2)
    assert p.source.push(ev, host="h", job_id="j") == 60
    assert p.source.push(ev, host="h", job_id="j") == 0
    assert p.metrics.dropped["queue_full"] == 60
    p.shutdown()
