"""Hostile peers on the record port: idle and slow connections, connection caps, re-attribution."""
from __future__ import annotations

import socket

import numpy as np
import pytest

from dynamiccl.collector.pipeline import Pipeline
from dynamiccl.harness.collector_testing import encode_frame, encode_frames, process_record, synthetic_events
from dynamiccl.collector.wire_format import EVENT_DTYPE

from collector_helpers import connect, quiet_config, sock_path, wait_until  # noqa: F401 (fixtures)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _pipe(quiet_config, sock_path, clock=None, **receiver):
    cfg = quiet_config.replace(receiver={"listen": (f"unix:{sock_path}", "tcp:127.0.0.1:0"), **receiver})
    return Pipeline(cfg, clock=clock or Clock()).start()


def _connect(p, which):
    return connect(p.addresses["listen"][which])


def _hello(host="nodeA", job="job1", pid=1000):
    return encode_frame(process_record(host, job, pid, start_ns=1).view(EVENT_DTYPE))


def test_idle_connections_hold_no_receive_buffer(quiet_config, sock_path):
    p = _pipe(quiet_config, sock_path)
    try:
        socks = [_connect(p, 1) for _ in range(50)]
        assert wait_until(lambda: p.stream.connections == 50)
        # before: every connection pre-allocated one max frame + recv_chunk_bytes (2 MiB)
        assert all(len(c.pending) == 0 for c in p.stream._conns.values())
        assert not any(hasattr(c, "buf") for c in p.stream._conns.values())
    finally:
        for s in socks:
            s.close()
        p.shutdown()


def test_handshake_idle_and_slow_loris_timeouts_close_and_count(quiet_config, sock_path):
    clock = Clock()
    p = _pipe(quiet_config, sock_path, clock, handshake_timeout_s=5.0, idle_timeout_s=30.0,
              frame_timeout_s=10.0)
    try:
        silent = _connect(p, 1)                        # never says who it is
        idle = _connect(p, 1)
        idle.sendall(_hello(pid=1))                    # says hello, then nothing
        loris = _connect(p, 0)
        loris.sendall(_hello(pid=2) + encode_frames(synthetic_events(4, nranks=1))[:40])  # a frame begun
        assert wait_until(lambda: p.stream.connections == 3 and p.metrics.received >= 2)
        clock.t += 6
        assert wait_until(lambda: p.metrics.refusals["handshake_timeout"] == 1)
        clock.t += 6
        assert wait_until(lambda: p.metrics.refusals["frame_timeout"] == 1)
        clock.t += 30
        assert wait_until(lambda: p.metrics.refusals["idle_timeout"] == 1)
        assert wait_until(lambda: p.stream.connections == 0)
        for s in (silent, idle, loris):
            s.close()
    finally:
        p.shutdown()


def test_connection_cap_keeps_reserved_local_slots_and_counts_refusals(quiet_config, sock_path):
    p = _pipe(quiet_config, sock_path, max_connections=8, reserved_local_connections=2)
    socks = []
    try:
        socks = [_connect(p, 1) for _ in range(10)]     # tcp: 6 fit, 4 refused
        assert wait_until(lambda: p.metrics.refusals["connection_limit"] == 4)
        assert p.stream.connections == 6
        local = _connect(p, 0)                          # the local plugin still gets in
        socks.append(local)
        local.sendall(_hello() + encode_frames(synthetic_events(10, nranks=1)))
        assert wait_until(lambda: p.metrics.decoded == 10)
    finally:
        for s in socks:
            s.close()
        p.shutdown()


def test_process_record_mid_connection_cannot_reattribute(quiet_config, sock_path):
    p = _pipe(quiet_config, sock_path)
    sub = p.subscribe()
    try:
        s = _connect(p, 0)
        ev = synthetic_events(10, nranks=1)
        forged = encode_frame(np.concatenate([ev[:5], process_record("victim", "other", 7).view(EVENT_DTYPE),
                                              ev[5:]]))
        s.sendall(_hello() + forged)
        assert wait_until(lambda: p.metrics.malformed["process_changed"] == 1)
        s.close()
    finally:
        p.shutdown()
    hosts = set()
    while (wf := sub.get(timeout=0.1)) is not None:
        hosts |= set(wf.ranks["host"].to_list())
    assert "victim" not in hosts


def test_a_socket_of_another_user_is_not_taken_over(tmp_path):
    import os

    from dynamiccl.collector.net import listen
    if os.geteuid() != 0:
        pytest.skip("needs root to create a socket owned by another user")
    path = str(tmp_path / "s.sock")
    squatter = socket.socket(socket.AF_UNIX)
    squatter.bind(path)
    os.chown(path, 12345, 12345)
    with pytest.raises(OSError, match="belongs to uid 12345"):   # before: probed, unlinked or EADDRINUSE
        listen(f"unix:{path}", key="listen")
    squatter.close()


def test_the_default_socket_directory_is_created_private_and_a_squatted_one_refused(tmp_path, monkeypatch):
    """Issue 18 #8: the default socket lives in a per-user 0700 directory; a group/other-writable one
    (another user could plant a socket there) is refused with a message naming it."""
    import os
    import stat

    from dynamiccl.collector.net import listen
    from dynamiccl.contracts import runtime_paths
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("DYNAMICCL_JOB_ID", "j1")
    path = runtime_paths.default_socket()
    assert path == f"{tmp_path}/dynamiccl/collector-j1.sock"
    sock, kind, bound = listen(f"unix:{path}", key="listen")
    sock.close()
    assert stat.S_IMODE(os.stat(tmp_path / "dynamiccl").st_mode) == 0o700 and bound == f"unix:{path}"
    os.unlink(path)
    os.chmod(tmp_path / "dynamiccl", 0o777)
    with pytest.raises(OSError, match="writable by group or others"):
        listen(f"unix:{path}", key="listen")


def test_records_sent_to_a_previous_collector_are_counted_and_logged(quiet_config, sock_path, caplog):
    """Issue 18 #6: after a collector restart the records a plugin had sent to the dead one were counted
    nowhere. The STATS that opens each connection carries its ordinal (reserved[0]) and records_sent."""
    import numpy as np

    from dynamiccl.harness.collector_testing import stats_record

    def opening(pid, ordinal, sent):
        st = stats_record(pid, records_sent=sent)
        st["reserved"][0][0] = ordinal
        return encode_frame(np.concatenate([process_record("nodeA", "job1", pid, start_ns=1).view(EVENT_DTYPE),
                                            st.view(EVENT_DTYPE)]))

    p = _pipe(quiet_config, sock_path)
    try:
        for pid, ordinal, sent in ((1000, 3, 500), (1000, 4, 900), (1001, 1, 0), (1002, 2, 0)):
            s = _connect(p, 0)
            s.sendall(opening(pid, ordinal, sent))
            s.close()
            assert wait_until(lambda: p.stream.connections == 0)
        # pid 1000 first seen on its 3rd connection: 500 sent to the predecessor; its 4th is ours (no count)
        assert wait_until(lambda: p.metrics.records_unconfirmed == 500), p.metrics.records_unconfirmed
        assert "500 records were sent on 2 earlier connection(s) to another collector" in caplog.text
    finally:
        p.shutdown()
