"""The node collector's per-window column buffers: what they hold equals the records' compact columns
through growth and reuse, and every window's partial equals the partial of that window's records."""
from __future__ import annotations

import numpy as np

from dynamiccl.collector.records import event_time_ns
from dynamiccl.scaleout.bus import InProcessBus, Outbox
from dynamiccl.scaleout.node import NodeCollector, NodeConfig
from dynamiccl.scaleout.node_agg import compact
from dynamiccl.scaleout.partials import node_partial
from dynamiccl.scaleout.window_store import MIN_CAPACITY, ColumnPool, WindowColumns
from dynamiccl.scaleout.wire import decode_partial, encode_partial
from tests.scaleout.helpers import events, node_of


def test_columns_grow_and_equal_the_compact_columns():
    ev = node_of(events(), 0)
    store = WindowColumns(16)
    for i in range(0, len(ev), 1000):
        store.append(ev[i:i + 1000], event_time_ns(ev[i:i + 1000]))
    assert store.n == len(ev) and store.capacity >= len(ev) > MIN_CAPACITY
    got, want = store.columns(), compact(ev)
    assert set(got) == set(want)
    for f in want:
        np.testing.assert_array_equal(got[f], want[f], err_msg=f)


def test_pool_reuses_a_store_from_empty_and_keeps_at_most_its_bound():
    pool = ColumnPool(keep=1)
    a, b = pool.take(), pool.take()
    ev = node_of(events(), 0)[:100]
    a.append(ev, event_time_ns(ev))
    pool.give(a)
    pool.give(b)                                 # over the bound: dropped
    again = pool.take()
    assert again is a and again.n == 0 and again.columns()["rank"].size == 0
    assert pool.take() is not b


def test_each_window_partial_equals_the_partial_of_its_records_across_reused_buffers():
    node = NodeCollector(NodeConfig("node0", "j", allowed_lateness_s=0.2),
                         Outbox(bus := InProcessBus(), max_messages=64))
    ev = node_of(events(6000), 0)
    for i in range(0, len(ev), 700):             # batches straddle window edges; stores are reused
        node.consume(ev[i:i + 700])
        node.tick()
    node.tick(flush_all=True)
    assert node.counters["dropped_late"] == 0 and node._pool._free   # windows closed while others filled
    win = event_time_ns(ev) // 1_000_000_000
    want = {w: decode_partial(encode_partial(node_partial(ev[win == w], node="node0", job_id="j", window=w,
                                                          window_s=1.0), "j"))[1]  # as the wire gives them
            for w in np.unique(win).tolist()}
    got = {p["window"]: p for p in (decode_partial(m.data)[1] for m in bus.drain())}
    assert sorted(got) == sorted(want) and len(want) >= 5
    for w, p in got.items():
        for frame in ("keys", "hist", "inst", "ranks"):
            cols = want[w][frame].columns
            assert p[frame].select(cols).sort(cols).equals(want[w][frame].sort(cols)), (w, frame)
