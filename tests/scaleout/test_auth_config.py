"""Publisher authentication, without a server: the users and permissions written for nats-server,
the clients' credential files (private, well-formed, the secret never printed), and the shard's
refusal of a partial whose subject (what the server authorised) names another job or node."""
from __future__ import annotations

import json
import logging
import os

import pytest

from dynamiccl.cli import main
from dynamiccl.scaleout.auth import (AUTH_CONF, classify_refusal, load_credentials, node_permissions,
                                     shard_permissions, write_auth)
from dynamiccl.scaleout.bus import Message, msg_id, subject
from dynamiccl.scaleout.central import CentralShard
from dynamiccl.scaleout.merger import MergerConfig, ShardTable
from dynamiccl.scaleout.wire import encode_partial
from tests.scaleout.helpers import Clock, events, partials


def _conf(path):
    text = (path / AUTH_CONF).read_text()
    assert text.startswith("authorization: ")
    return {u["user"]: u for u in json.loads(text[len("authorization: "):])["users"]}


def test_each_node_may_publish_only_its_own_subjects(tmp_path):
    files = write_auth(tmp_path, {"a": frozenset({"n0", "n1"}), "b": frozenset({"n0"})}, ["s0"])
    users = _conf(tmp_path)
    assert sorted(users) == ["node.a.n0", "node.a.n1", "node.b.n0", "shard.s0"] == sorted(files)
    pub = users["node.a.n0"]["permissions"]["publish"]["allow"]
    assert pub == ["dynamiccl.partials.a.n0", "dynamiccl.partials.a.n0.*", "$KV.DYNAMICCL_LIVE.node.a.n0", "$JS.API.STREAM.INFO.KV_DYNAMICCL_LIVE",
                   "$JS.API.DIRECT.GET.DYNAMICCL_TUNER.dynamiccl.tuner.a"]    # reads its own job's tuner file only
    assert users["node.a.n0"]["permissions"]["subscribe"]["allow"] == ["_INBOX.node.a.n0.>", "dynamiccl.tunerlive.a"]
    assert not any("tuner" in p for p in users["node.b.n0"]["permissions"]["publish"]["allow"]
                   + users["node.b.n0"]["permissions"]["subscribe"]["allow"] if ".a" in p)
    shard = users["shard.s0"]["permissions"]["publish"]["allow"]
    assert not any(p.startswith("dynamiccl.partials") for p in shard)       # a shard publishes no partial
    assert "dynamiccl.tuner.*" in shard                                      # and the jobs' tuner files
    assert "$KV.DYNAMICCL_LIVE.shard.s0" in shard and "$KV.DYNAMICCL_LIVE.ckpt.*" in shard
    assert "$KV.DYNAMICCL_LIVE.comb.*" in shard               # a partitioned job's combiner state
    assert not any("comb" in p for p in users["node.a.n0"]["permissions"]["publish"]["allow"])
    assert node_permissions("a", "n0") == users["node.a.n0"]["permissions"]
    assert shard_permissions("s0") == users["shard.s0"]["permissions"]
    for p in [tmp_path / AUTH_CONF, *files.values()]:
        assert p.stat().st_mode & 0o777 == 0o600, p


def test_rewriting_keeps_existing_passwords_and_adds_new_users(tmp_path):
    secrets = iter(f"secret{i}" for i in range(100))
    write_auth(tmp_path, {"a": frozenset({"n0"})}, ["s0"], new_secret=lambda: next(secrets))
    before = load_credentials(tmp_path / "node.a.n0.yaml")
    write_auth(tmp_path, {"a": frozenset({"n0", "n1"})}, ["s0"], new_secret=lambda: next(secrets))
    assert load_credentials(tmp_path / "node.a.n0.yaml") == before
    users = _conf(tmp_path)
    assert users["node.a.n0"]["password"] == before.password
    assert users["node.a.n1"]["password"] not in (before.password, users["shard.s0"]["password"])


def test_credentials_refused_when_absent_public_or_malformed(tmp_path):
    p = tmp_path / "c.yaml"
    with pytest.raises(ValueError, match="No such file"):
        load_credentials(p)
    p.write_text("user: node.a.n0\npassword: hunter2\n")
    os.chmod(p, 0o644)
    with pytest.raises(ValueError, match="readable by group or others"):
        load_credentials(p)
    os.chmod(p, 0o600)
    c = load_credentials(p)
    assert c.connect_kwargs() == {"user": "node.a.n0", "password": "hunter2", "inbox_prefix": "_INBOX.node.a.n0"}
    assert "hunter2" not in repr(c)
    for bad in ("user: x\n", "user: a\npassword: b\nextra: c\n", "- a\n", "user: a>b\npassword: p\n", "{"):
        p.write_text(bad)
        with pytest.raises(ValueError, match="nats.credentials") as e:
            load_credentials(p)
        assert "hunter2" not in str(e.value)


def test_cli_writes_the_files_and_refuses_bad_credentials_at_start_up(tmp_path, capsys):
    assert main(["nats-auth", "--job", "j=n0,n1", "--shard", "s0", "--out", str(tmp_path / "auth")]) == 0
    out = capsys.readouterr().out
    secret = load_credentials(tmp_path / "auth" / "node.j.n0.yaml").password
    assert "node.j.n1.yaml" in out and secret not in out
    bad = tmp_path / "public.yaml"
    bad.write_text(f"user: node.j.n0\npassword: {secret}\n")
    os.chmod(bad, 0o644)
    assert main(["node", "--node", "n0", "--job", "j", "--credentials", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "readable by group or others" in err and secret not in err
    assert main(["central", "--shard", "s0", "--job", "j=n0", "--credentials", str(tmp_path / "nope")]) == 2
    assert "nats.credentials" in capsys.readouterr().err
    assert main(["nats-auth", "--job", "j=n 0", "--shard", "s0", "--out", str(tmp_path / "x")]) == 2


def test_the_servers_refusals_are_classified():
    import nats.errors
    assert classify_refusal(nats.errors.AuthorizationError()) == "auth_refused"
    assert classify_refusal(nats.errors.Error("nats: 'Authorization Violation'")) == "auth_refused"
    assert classify_refusal(nats.errors.Error('nats: permissions violation for publish to "x"')) == "publish_refused"
    assert classify_refusal(nats.errors.Error('nats: permissions violation for subscription to "x"')) == "subscribe_refused"
    assert classify_refusal(nats.errors.Error("nats: stale connection")) is None


def test_shard_refuses_a_partial_whose_subject_names_another_node(caplog):
    parts = partials(events())
    w = sorted(parts)[0]
    p = parts[w][0]                                   # node0's partial of job j
    clock = Clock()
    shard = CentralShard("s0", MergerConfig({"j": frozenset({"node0", "node1"})}), ShardTable(1.5, clock), {},
                         lambda job: None, clock)
    shard.poll()
    data = encode_partial(p, "j")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):                            # node1's subject, node0's partial: a spoof
            assert shard.handle(Message(subject("j", "node1"), data, msg_id("j", "node0", w))) == "malformed"
    assert shard.counters["subject_mismatch"] == 3
    assert len([r for r in caplog.records if "carries a partial" in r.getMessage()]) == 2     # at 1 and 2
    assert shard.merger.counters.get("partials", 0) == 0
    assert shard.handle(Message(subject("j", "node0"), data, msg_id("j", "node0", w))) == "filed"


def test_node_metrics_expose_the_servers_refusals():
    from prometheus_client import generate_latest

    from dynamiccl.scaleout.bus import Outbox
    from dynamiccl.scaleout.node import NodeCollector, NodeConfig, registry
    node = NodeCollector(NodeConfig("n0", "j"), Outbox(None))
    node.counters["publish_refused"] = 3
    text = generate_latest(registry(node)).decode()
    assert 'dynamiccl_node_bus_refusals_total{why="publish_refused"} 3.0' in text
    assert 'dynamiccl_node_bus_refusals_total{why="auth_refused"} 0.0' in text


def test_a_node_says_its_partials_are_authenticated_only_when_every_peer_presents_a_token():
    import argparse

    from dynamiccl.collector.config import ReceiverConfig
    from dynamiccl.scaleout import cli
    from dynamiccl.scaleout.config import NodeServiceConfig
    from dynamiccl.scaleout.node import NodeConfig
    from dynamiccl.scaleout.wire import peek_header
    ns = dict(node="n0", job="j", listen=["unix:/tmp/x.sock"], window=1.0, lateness=2.0, max_message=1 << 20,
              nats=None, replicas=1, metrics="off", credentials=None)
    assert not cli.node_config(argparse.Namespace(**ns, tokens_file=None)).peers_authenticated
    assert cli.node_config(argparse.Namespace(**ns, tokens_file="/etc/tokens")).peers_authenticated
    open_unix = NodeServiceConfig(NodeConfig("n0", "j"), ReceiverConfig(listen=("unix:/tmp/x.sock",),
                                                                        tokens_file="/etc/tokens", auth_unix=False))
    assert not open_unix.peers_authenticated
    p = partials(events())
    w = sorted(p)[0]
    assert peek_header(encode_partial(p[w][0], "j", authenticated=True))["auth"] is True
    assert peek_header(encode_partial(p[w][0], "j"))["auth"] is False
