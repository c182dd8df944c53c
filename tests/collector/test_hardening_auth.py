"""Per-job tokens on the record stream: refused without, counted, bound to their job."""
from __future__ import annotations

import os

import numpy as np
import pytest

from dynamiccl.collector.auth import TokenTable, encode_preamble, sender_token
from dynamiccl.collector.pipeline import Pipeline
from dynamiccl.harness.collector_testing import encode_frame, encode_frames, process_record, synthetic_events
from dynamiccl.collector.wire_format import EVENT_DTYPE

from collector_helpers import connect, quiet_config, sock_path, wait_until  # noqa: F401 (fixtures)


def _tokens(tmp_path, text, mode=0o600):
    p = tmp_path / "tokens"
    p.write_text(text)
    os.chmod(p, mode)
    return str(p)


def _pipe(quiet_config, sock_path, tokens=None, **kw):
    cfg = quiet_config.replace(receiver={"listen": (f"unix:{sock_path}", "tcp:127.0.0.1:0"),
                                         "tokens_file": tokens, **kw})
    return Pipeline(cfg).start()


def _send(p, which, payload):
    s = connect(p.addresses["listen"][which])
    s.sendall(payload)
    return s


def _job(job="job1", n=10):
    hello = encode_frame(process_record("h", job, 1, start_ns=1).view(EVENT_DTYPE))
    return hello + encode_frames(synthetic_events(n, nranks=1))


def test_without_tokens_file_unauthenticated_and_preamble_both_work(quiet_config, sock_path):
    p = _pipe(quiet_config, sock_path)
    try:
        a = _send(p, 0, _job())
        b = _send(p, 1, encode_preamble("whatever") + _job())
        assert wait_until(lambda: p.metrics.decoded == 20)
        assert p.metrics.inputs_authenticated == 0
        a.close(), b.close()
    finally:
        p.shutdown()


def test_missing_wrong_and_misused_tokens_are_refused_and_counted(quiet_config, sock_path, tmp_path):
    p = _pipe(quiet_config, sock_path, _tokens(tmp_path, "# tokens\nanyjob-token\njob1 job1-token\n"))
    socks = []
    try:
        socks.append(_send(p, 1, _job()))                                       # no token
        socks.append(_send(p, 1, encode_preamble("guess") + _job()))           # wrong token
        socks.append(_send(p, 0, encode_preamble("job1-token") + _job("job2")))  # another job's token
        assert wait_until(lambda: p.metrics.refusals["auth"] == 3)
        assert p.metrics.decoded == 0
        socks.append(_send(p, 1, encode_preamble("job1-token") + _job("job1")))
        socks.append(_send(p, 0, encode_preamble("anyjob-token") + _job("job3")))
        assert wait_until(lambda: p.metrics.decoded == 20)
        assert p.metrics.inputs_authenticated == 1
    finally:
        for s in socks:
            s.close()
        p.shutdown()


def test_tokens_file_readable_by_others_is_refused_at_start(quiet_config, sock_path, tmp_path):
    path = _tokens(tmp_path, "t0ken\n", mode=0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        TokenTable.load(path)
    with pytest.raises(PermissionError):
        _pipe(quiet_config, sock_path, path)


def test_sender_token_from_file_or_env(tmp_path):
    path = _tokens(tmp_path, "from-file\n")
    assert sender_token({"DYNAMICCL_TOKEN_FILE": path, "DYNAMICCL_TOKEN": "env"}) == "from-file"
    assert sender_token({"DYNAMICCL_TOKEN": "env"}) == "env"
    assert sender_token({}) is None
    with pytest.raises(PermissionError):
        sender_token({"DYNAMICCL_TOKEN_FILE": _tokens(tmp_path, "x", mode=0o640)})


def test_wire_sender_opens_with_the_token_and_the_collector_accepts_it(quiet_config, sock_path, tmp_path):
    from dynamiccl.collector.sources.wire_sender import Comm, SenderConfig, WireSender

    p = _pipe(quiet_config, sock_path, _tokens(tmp_path, "job1 s3cret\n"))
    (tmp_path / "job").mkdir()
    try:
        cfg = SenderConfig.from_env({"DYNAMICCL_COLLECTOR": p.addresses["listen"][1], "DYNAMICCL_JOB_ID": "job1",
                                     "DYNAMICCL_TOKEN_FILE": _tokens(tmp_path / "job", "s3cret\n")})
        assert "s3cret" not in repr(cfg)  # never printed
        s = WireSender(cfg)
        comm = Comm(comm_hash=0xABC, name="world", rank=0, nranks=2, nnodes=1)
        s.register_comm(comm)
        s.queue.append((comm, 1, 1, 6, 0, 256, 1024, 0, 1_000, 51_000, 2))
        s.flush_once()
        assert wait_until(lambda: p.metrics.decoded == 1)
        assert p.metrics.refusals["auth"] == 0
        s.close()
    finally:
        p.shutdown()


def test_non_loopback_listen_needs_allow_remote():
    import argparse

    from dynamiccl.collector.cli import config_from_args, register
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    base = ["collector", "--metrics", "off", "--features", "off", "--parquet", "off"]
    with pytest.raises(ValueError, match="--allow-remote"):
        config_from_args(ap.parse_args(base + ["--listen", "tcp:0.0.0.0:9470"]))
    with pytest.raises(ValueError, match="--allow-remote"):
        config_from_args(ap.parse_args(["collector", "--metrics", "0.0.0.0:9464", "--listen", "off"]))
    assert config_from_args(ap.parse_args(base + ["--listen", "tcp:127.0.0.1:9470"]))
    assert config_from_args(ap.parse_args(base + ["--listen", "tcp:0.0.0.0:9470", "--allow-remote"]))
