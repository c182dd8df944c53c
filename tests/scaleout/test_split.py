"""A partial over the bus's message limit travels in parts and merges exactly; an incomplete node is
missing, not half-counted; part headers are checked."""
from __future__ import annotations

import json
import random
import struct

import pytest

from dynamiccl.scaleout.bus import InProcessBus, Outbox
from dynamiccl.scaleout.central import CentralShard
from dynamiccl.scaleout.features import window_features
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, WindowMerger
from dynamiccl.scaleout.node import NodeCollector, NodeConfig
from dynamiccl.scaleout.partials import merge_partials
from dynamiccl.scaleout.wire import encode_messages, encode_partial, frames_of, peek_header, read_partial
from tests.scaleout.helpers import Clock, events, node_of, partials

LIMIT = 8192
CFG = MergerConfig({"j": frozenset({"node0", "node1"})}, lateness_s=2.0)


def _same(a, b):
    for frame in ("keys", "ranks"):
        x, y = getattr(a, frame), getattr(b, frame)
        cols = [c for c in x.columns if x[c].dtype.is_numeric() or c in ("host", "job_id")]
        assert x.select(cols).sort(cols).equals(y.select(cols).sort(cols)), frame


@pytest.mark.parametrize("ratio", [None, 0.3, 0.01, 5.0])      # no hint, about right, far off both ways
def test_split_parts_fit_the_limit_and_merge_to_the_whole_partial(ratio):
    parts = partials(events())
    w = sorted(parts)[1]
    msgs = [encode_messages(p, "j", LIMIT, ratio) for p in parts[w]]
    assert all(len(ms) > 1 for ms in msgs) and all(len(d) <= LIMIT for ms in msgs for d in ms)
    split = [read_partial(d) for ms in msgs for d in ms]
    k = len(msgs[0])
    assert [(r.part, r.parts) for r in split[:k]] == [(i, k) for i in range(k)]
    whole = [read_partial(encode_partial(p, "j")) for p in parts[w]]
    _same(window_features(merge_partials([frames_of(whole)])), window_features(merge_partials([frames_of(split)])))
    assert encode_messages(parts[w][0], "j") == [encode_partial(parts[w][0], "j")]    # fits: one message


def _node_messages(ev, node, limit):
    bus = InProcessBus()
    nc = NodeCollector(NodeConfig(node, "j", max_message_bytes=limit), Outbox(bus, max_messages=4096))
    nc.consume(ev)
    nc.tick(flush_all=True)
    return nc, bus.drain()


def _shard(clock, runs):
    class _Loop:
        def step(self, wf):
            runs.append(wf)
            return type("S", (), {"changes": []})()
    return CentralShard("s0", CFG, ShardTable(1.5, clock), {}, lambda job: _Loop(), clock)


def test_node_splits_and_the_shard_merges_shuffled_duplicated_parts_exactly():
    ev = events()
    runs_split, runs_whole, clock = [], [], Clock()
    split_shard, whole_shard = _shard(clock, runs_split), _shard(clock, runs_whole)
    split_shard.poll()
    whole_shard.poll()                               # each shard beats: it owns the job
    msgs_split, msgs_whole = [], []
    for n, node in enumerate(("node0", "node1")):
        nc, m = _node_messages(node_of(ev, n), node, LIMIT)
        assert nc.counters["split_partials"] >= 1 and all(len(x.data) <= LIMIT for x in m)
        msgs_split += m
        msgs_whole += _node_messages(node_of(ev, n), node, 1 << 20)[1]
    assert len({x.msg_id for x in msgs_split}) == len(msgs_split) > len(msgs_whole)
    random.Random(3).shuffle(msgs_split)
    for x in msgs_split + msgs_split[:5]:            # five parts delivered twice
        split_shard.handle(x)
    for x in msgs_whole:
        whole_shard.handle(x)
    split_shard.poll()
    whole_shard.poll()
    assert split_shard.merger.counters["duplicates"] == 5
    assert len(runs_split) == len(runs_whole) >= 3
    for a, b in zip(runs_split, runs_whole):
        _same(a, b)
        assert a.counters["nodes_missing"] == 0 and a.counters["nodes_reported"] == 2


def test_a_node_with_a_part_missing_is_counted_missing_and_left_out():
    parts = partials(events())
    w = sorted(parts)[1]
    clock = Clock()
    m = WindowMerger(CFG, clock)
    p0 = [read_partial(d) for d in encode_messages(parts[w][0], "j", LIMIT)]
    m.add("j", read_partial(encode_partial(parts[w][1], "j")))
    for r in p0[:-1]:                                # node0's last part never arrives
        m.add("j", r)
    m.add("j", read_partial(encode_partial(parts[w + 1][0], "j")))   # the bus has moved on
    assert m.due() == []                             # waits for the part
    clock.t = 2.5
    (job, wf), = [x for x in m.due() if x[1].window_start == float(w)]
    assert m.counters["nodes_missing"] == 1 and m.counters["incomplete_parts"] == len(p0) - 1
    only1 = window_features(merge_partials([parts[w][1]]))
    assert int(wf.keys["records"].sum()) == int(only1.keys["records"].sum())


def _rehead(data: bytes, **change) -> bytes:
    """The message with its header's fields changed (length prefix recomputed)."""
    n = struct.unpack_from("<I", data)[0]
    h = json.dumps({**json.loads(data[4:4 + n]), **change}).encode()
    return struct.pack("<I", len(h)) + h + data[4 + n:]


def test_part_headers_are_checked_and_inconsistent_counts_refused():
    parts = partials(events())
    w = sorted(parts)[1]
    d = encode_messages(parts[w][0], "j", LIMIT)
    assert peek_header(d[0])["parts"] == len(d) > 1
    for bad in ({"part": 3, "parts": 2}, {"part": -1, "parts": 2}, {"part": 0, "parts": 100_000}):
        with pytest.raises(ValueError, match="part"):
            peek_header(_rehead(d[0], **bad))
    m = WindowMerger(CFG, Clock())
    m.add("j", read_partial(d[0]))
    assert m.refusal("j", "node0", w, 1, len(d) + 1) == "inconsistent_parts"
    assert m.refusal("j", "node0", w, 0, len(d)) == "duplicates" and m.refusal("j", "node0", w, 1, len(d)) is None
    with pytest.raises(ValueError, match="do not fit"):
        encode_messages(parts[w][0], "j", 64)


def test_the_runner_reads_a_parts_window_from_its_message_id():
    """The shard runner acks a held message once its window ran, by the window in its id: a part's
    id must give the window, not the part (else it is acked before its window ran and lost on failover)."""
    from dynamiccl.scaleout.bus import msg_id, window_of
    assert window_of(msg_id("j", "node0", 41, 2, 3)) == 41 == window_of(msg_id("j", "node0", 41))
    assert window_of("j/node0") == -1 == window_of("j/node0/x/1of2")
