"""The Python wire sender applies the runtime-directory rule of the C sender (issue 18 #8)."""
from __future__ import annotations

import logging
import os
import socket

from dynamiccl.collector.sources.wire_sender import Comm, SenderConfig, WireSender


def _squatted(tmp_path, mode: int) -> tuple[socket.socket, dict]:
    """A listening socket at the job's default path, in a runtime directory of mode ``mode``."""
    env = {"XDG_RUNTIME_DIR": str(tmp_path), "DYNAMICCL_JOB_ID": "j1"}
    d = tmp_path / "dynamiccl"
    d.mkdir(mode=0o700)
    os.chmod(d, mode)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(d / "collector-j1.sock"))
    srv.listen()
    srv.setblocking(False)
    return srv, env


def _sender(env: dict) -> WireSender:
    s = WireSender(SenderConfig.from_env(env, host="h0"))
    comm = Comm(comm_hash=0xABC, name="world", rank=0, nranks=2, nnodes=1)
    s.register_comm(comm)
    for i in range(3):
        s.queue.append((comm, 1, 1, 6, 0, 256, 1024, i, 1_000, 51_000, 2))
    return s


def _accepted(srv: socket.socket) -> bool:
    try:
        srv.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def test_default_socket_in_a_group_writable_directory_is_not_connected(tmp_path, caplog):
    """Before: the Python sender connected to whatever listened at the default path, so another user who
    could write the directory received the job's records (the C sender refuses it)."""
    srv, env = _squatted(tmp_path, 0o777)
    s = _sender(env)
    assert s.config.collector == f"unix:{tmp_path}/dynamiccl/collector-j1.sock"
    with caplog.at_level(logging.WARNING, logger="dynamiccl.collector.sources.wire_sender"):
        assert s.flush_once() == 3
        s._next_connect = 0.0     # due again: refused again, logged once
        s.flush_once()
    assert not _accepted(srv) and not s.connected
    assert s.counters()["records_undelivered"] == 3
    lines = [r.getMessage() for r in caplog.records if "not connecting" in r.getMessage()]
    assert len(lines) == 1 and "writable by group or others" in lines[0]
    srv.close()


def test_default_socket_in_a_private_directory_is_connected(tmp_path):
    srv, env = _squatted(tmp_path, 0o700)
    s = _sender(env)
    assert s.flush_once() == 3
    assert _accepted(srv) and s.counters()["records_sent"] == 3
    s.close()
    srv.close()


def test_an_explicit_socket_elsewhere_is_used_as_given(tmp_path):
    """The rule covers the runtime directory only: an explicitly configured path is the user's choice."""
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(d / "c.sock"))
    srv.listen()
    srv.setblocking(False)
    s = _sender({"XDG_RUNTIME_DIR": str(tmp_path), "DYNAMICCL_COLLECTOR": f"unix:{d}/c.sock"})
    assert s.flush_once() == 3 and _accepted(srv)
    s.close()
    srv.close()
