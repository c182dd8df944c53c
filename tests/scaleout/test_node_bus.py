"""Node collector → outbox → bus: windows close by event time, the outbox never blocks, drops count."""
from __future__ import annotations

import pytest

from dynamiccl.scaleout.bus import InProcessBus, Message, Outbox, subject
from dynamiccl.scaleout.node import NodeCollector, NodeConfig, registry
from dynamiccl.scaleout.wire import decode_partial, encode_partial
from tests.scaleout.helpers import events, node_of, partials


def _run(bus, outbox_max=64, batch=2000):
    node = NodeCollector(NodeConfig("node0", "j"), Outbox(bus, max_messages=outbox_max))
    ev = node_of(events(), 0)
    for i in range(0, len(ev), batch):
        node.consume(ev[i:i + batch])
        node.tick()
    node.tick(flush_all=True)
    return node, ev


def test_every_window_reaches_the_bus():
    bus = InProcessBus()
    node, ev = _run(bus)
    msgs = bus.drain()
    assert [decode_partial(m.data)[1]["window"] for m in msgs] == sorted(partials(events()))
    assert sum(int(decode_partial(m.data)[1]["keys"]["records"].sum()) for m in msgs) == len(ev)
    assert node.counters["aggregated"] == len(ev) == node.counters["received"]
    assert {m.subject for m in msgs} == {subject("j", "node0")}
    assert b"dynamiccl_node_partials_total{outcome=\"emitted\"} " in _expose(node)


def _expose(node):
    from prometheus_client import generate_latest
    return generate_latest(registry(node))


def test_unreachable_bus_drops_oldest_and_counts_never_blocks():
    class Down:
        def publish(self, msg):
            raise ConnectionError("no servers")

    node, _ = _run(Down(), outbox_max=2)
    c = node.outbox.counters
    assert c["emitted"] == 0 and len(node.outbox) == 2
    assert c["dropped"] == node.counters["windows"] - 2 > 0
    assert c["send_errors"] >= 1


def test_full_in_process_bus_keeps_message_in_outbox():
    bus = InProcessBus(max_messages=1)
    out = Outbox(bus)
    for i in range(3):
        out.offer(Message("s", b"x", str(i)))
    assert out.flush() == 1 and len(out) == 2 and out.counters["send_errors"] == 1
    bus.drain()
    assert out.flush() == 1


def test_wire_round_trip_and_refusals():
    p = next(iter(partials(events()).values()))[0]
    data = encode_partial(p, "j")
    job, q = decode_partial(data)
    assert job == "j"
    for k in ("keys", "hist", "inst", "ranks"):
        cols = p[k].columns
        a = p[k].sort(cols[:4])
        b = q[k].select(cols).cast(dict(p[k].schema)).sort(cols[:4])
        assert a.equals(b), k
    bad_cases = ((data[:-3], "body holds"), (data + b"x", "body holds"), (b"\x05\0\0\0{bad}", "bad header"),
                 (b"\xff\0\0\0{}", "truncated header"), (data[:40] + b"\0" * 9, "header|body"))
    for bad, why in bad_cases:
        with pytest.raises(ValueError, match=why):
            decode_partial(bad)


def test_bad_subject_tokens_refused():
    with pytest.raises(ValueError, match="subject token"):
        NodeConfig("node.0", "j").validate()


def test_a_window_framed_from_wire_partials_merges_as_the_decoded_ones():
    from dynamiccl.scaleout.features import window_features
    from dynamiccl.scaleout.partials import merge_partials
    from dynamiccl.scaleout.wire import decode_partial, encode_partial, frames_of, read_partial
    from tests.scaleout.helpers import events, partials

    parts = partials(events())
    w = sorted(parts)[1]
    data = [encode_partial(p, "j") for p in parts[w]]
    decoded = window_features(merge_partials([decode_partial(d)[1] for d in data]))
    batched = window_features(merge_partials([frames_of([read_partial(d) for d in data])]))
    assert decoded.keys.equals(batched.keys) and decoded.ranks.equals(batched.ranks)
    assert sorted(batched.ranks["host"].unique().to_list()) == ["node0", "node1"]
