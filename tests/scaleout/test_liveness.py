"""Heartbeats and checkpoints from the key-value bucket, timed on the observer's clock; a silent node's
windows stop waiting for it."""
from __future__ import annotations

from dynamiccl.scaleout.liveness import Liveness, ckpt_key, node_key, shard_key
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, WindowMerger
from tests.scaleout.helpers import Clock, events, partials


def _live(clock, ckpt=None):
    return Liveness(ShardTable(1.5, clock), {} if ckpt is None else ckpt, node_ttl_s=5.0, clock=clock)


def test_shard_heartbeats_share_ownership_and_expire():
    clock = Clock()
    live = _live(clock)
    live.heard(shard_key("s0"))
    live.heard(shard_key("s1"))
    assert live.table.live() == ["s0", "s1"]
    for t in (0.5, 1.0, 1.5, 2.0):
        clock.t = t
        live.heard(shard_key("s1"))
    assert live.table.live() == ["s1"]


def test_silent_node_and_checkpoints_and_malformed_keys():
    clock, ckpt = Clock(), {}
    live = _live(clock, ckpt)
    live.heard(node_key("j", "n0"))
    live.heard(node_key("j", "n1"))
    clock.t = 4.0
    live.heard(node_key("j", "n0"))
    clock.t = 6.0
    assert live.silent("j", {"n0", "n1", "n2"}) == {"n1"}      # n2 never heard: waited for, not silent
    live.heard(ckpt_key("j"), b"7")
    live.heard(ckpt_key("j"), b"5")                              # an older checkpoint never moves it back
    assert ckpt == {"j": 7}
    for bad in ("ckpt.j", "node.j", "other.x"):
        live.heard(bad, b"x")
    assert live.counters["malformed"] == 3


def test_a_window_does_not_wait_for_a_silent_node():
    parts = partials(events())
    clock = Clock()
    m = WindowMerger(MergerConfig({"j": frozenset({"node0", "node1"})}, lateness_s=2.0), clock)
    w = sorted(parts)[1]
    m.add("j", parts[w][0])
    assert m.due() == []
    m.set_silent("j", frozenset({"node1"}))
    (_, wf), = m.due()                      # at once, not after the lateness
    assert wf.counters["missing_nodes"] == ["node1"]
