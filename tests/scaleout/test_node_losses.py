"""The node collector: records lost before it (its queue full, the receiver's floods and record_seq jumps,
told as notes: collector/processors/wait_losses.py) mark the partials the merger withholds waits by
(``lossy_comms`` per communicator, ``waits_lossy`` for the whole node-window)."""
from __future__ import annotations

import numpy as np

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.processors.wait_losses import LossNote
from dynamiccl.scaleout.bus import Outbox
from dynamiccl.scaleout.node import NodeCollector, NodeConfig
from dynamiccl.scaleout.wire import read_partial

from tests.scaleout.test_waits import PER_NODE, T0, untimed_job


def _node_run(lose=None, note=None):
    """Node 0's ranks of two communicators (0xABC, 0xDEF) in 0.1 s slices, one batch per communicator;
    ``lose(lo, comm)``: that batch is lost (``note(batch)`` tells it, before the next batch)."""
    sent: list = []

    class Sink:
        def publish(self, m):
            sent.append(m)

    a = untimed_job(6.0, seed=8)
    b = untimed_job(6.0, seed=9)
    b["comm_hash"] = 0xDEF
    node = NodeCollector(NodeConfig("node0", "j", allowed_lateness_s=0.5), Outbox(Sink()))
    told = None
    for lo in range(0, 6000, 100):
        for ev in (a, b):
            ev = ev[ev["rank"] // PER_NODE == 0]
            t = (ev["enqueue_ns"].astype(np.int64) - T0) // 1_000_000
            part = ev[(t >= lo) & (t < lo + 100)]
            comm = int(part["comm_hash"][0])
            if lose is not None and lose(lo, comm):
                told = RecordBatch(part, "node0", "j", {})
                continue
            if told is not None:
                note(node, told, part)
                told = None
            node.consume(part)
            node.tick()
    node.tick(flush_all=True)
    heads = [read_partial(m.data) for m in sent]
    return {h.window: (h.waits_lossy, h.waits_lossy_comms) for h in heads}, node.counters


def _at_3s(lo, comm):
    return lo == 3000 and comm == 0xABC


W3 = T0 // 10**9 + 3          # the node-window (1 s) of the lost batch


def test_a_batch_the_nodes_queue_refused_marks_its_communicator_in_its_window():
    """Fails before: the node's queue_full drop was only counted; the partial of window 3 marked nothing."""
    from dynamiccl.scaleout.service import NodeIngest
    clean, _ = _node_run()
    marks, c = _node_run(_at_3s, lambda node, lost, nxt: NodeIngest(node).dropped(lost))
    assert all(v == (0, []) for v in clean.values())
    assert marks[W3] == (0, [0xABC]) and all(v == (0, []) for w, v in marks.items() if w != W3)
    assert c["dropped_queue_full"] == 80 and c["waits_lossy_noted"] == 80 and c["waits_lossy_comms"] == 1


def test_a_record_seq_jump_marks_the_whole_node_window_open_at_it():
    """Fails before: a jump never reached the node's rule. Its records' communicator is unknown, so the
    node-windows open at the jump (up to the first record after it) say ``waits_lossy`` (the merger withholds
    the window's waits); the others are as with no loss."""
    def gap(node, lost, nxt):
        node.losses.note(LossNote("delivery_gap", "j", len(lost), t_hi_ns=int(nxt["enqueue_ns"].max())))
    marks, c = _node_run(_at_3s, gap)
    lossy = {w for w, (whole, _) in marks.items() if whole}
    assert W3 in lossy and lossy <= {W3 - 1, W3}
    assert all(comms == [] for _, comms in marks.values()) and c["waits_lossy_noted"] == 80
    other_job, c2 = _node_run(_at_3s, lambda node, lost, nxt: node.losses.note(LossNote("delivery_gap", "k", 32)))
    assert all(v == (0, []) for v in other_job.values()) and c2["waits_lossy_noted"] == 0


def test_a_forged_jump_of_2_to_the_40_records_is_a_count_at_the_node():
    """Fails before: the node held a jump per record (np.full(n)): a MemoryError closing the window."""
    def gap(node, lost, nxt):
        node.losses.note(LossNote("delivery_gap", "j", 1 << 40, t_hi_ns=int(nxt["enqueue_ns"].max())))
    marks, c = _node_run(_at_3s, gap)
    assert marks[W3][0] == 1 and c["waits_lossy_noted"] == 1 << 40
