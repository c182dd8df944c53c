"""A shard runs the single-machine loop on merged windows: its regime changes equal the single
collector's on the same records (a bandwidth drop on every rank, then a straggler)."""
from __future__ import annotations

import pytest

from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
from dynamiccl.harness.collector_testing import synthetic_events
from dynamiccl.harness.scaleout_scenario import START_NS, Scenario, drop_then_straggler
from dynamiccl.scaleout.bus import Message, msg_id, subject
from dynamiccl.scaleout.central import CentralShard, detector_loop
from dynamiccl.scaleout.merger import MergerConfig, ShardTable
from dynamiccl.scaleout.wire import encode_partial
from tests.scaleout.helpers import Clock, partials, single_collector_changes

NRANKS, WINDOWS, DROP_AT, STRAGGLER_AT, STRAGGLER = 16, 70, 40, 55, 11


def _scenario(seed=3):
    """70 s, 150 instances/s of 16 ranks on 2 nodes; every duration x2.5 from 40 s (a bandwidth
    drop), rank 11 arriving 2 ms late from 55 s."""
    return drop_then_straggler(Scenario(NRANKS, 2, WINDOWS, 150.0, DROP_AT, 2.5, STRAGGLER_AT, STRAGGLER), seed)


def _key(c):
    return (c.kind, round(c.detected_s, 6), round(c.start_s, 6), tuple(c.ranks))


def _config():
    return DetectorConfig(baseline=BaselineConfig(warmup=20), autoencoder=AutoencoderConfig(enabled=False))


def _single_collector(ev):
    return single_collector_changes(ev, _config(), NRANKS)


def _shard(ev, silent_from=None):
    changes = []
    clock = Clock()
    cfg = MergerConfig({"j": frozenset({"node0", "node1"})})
    shard = CentralShard("s0", cfg, ShardTable(1.5, clock), {}, detector_loop(_config(), sinks=lambda job: [changes.append]),
                         clock)
    for w, parts in sorted(partials(ev).items()):
        for p in parts:
            if silent_from is not None and p["node"] == "node1" and w >= silent_from:
                continue
            shard.handle(Message(subject("j", p["node"]), encode_partial(p, "j"), msg_id("j", p["node"], w)))
        clock.t += 0.5
        shard.poll()
        clock.t += 0.5
        shard.poll()
        clock.t += 1.5                        # past the lateness: a window without node1 merges
        shard.poll()
    clock.t += cfg.max_lateness_s             # the last window: nothing later comes
    shard.poll()
    return changes, shard


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 5])
def test_shard_changes_equal_single_collector(seed):
    ev = _scenario(seed)
    single = _single_collector(ev)
    sharded, shard = _shard(ev)
    assert shard.counters["windows_run"] >= WINDOWS - 1
    kinds = {c.kind for c in single}
    assert single and kinds - {"recovery"}, f"the scenario must make the detector report a change: {single}"
    assert [_key(c) for c in sharded] == [_key(c) for c in single]


@pytest.mark.slow
def test_a_silent_node_is_reported_missing_not_as_a_change():
    kw = dict(nranks=NRANKS, nnodes=2, rate_per_s=150.0, untimed_fraction=0.0, log2_bytes=(20, 22),
              comm_hashes=(0x1111_2222_3333_4444,), funcs=("AllReduce",))
    ev = synthetic_events(150 * WINDOWS, seed=3, **kw)
    silent_from = START_NS // 1_000_000_000 + DROP_AT
    changes, shard = _shard(ev, silent_from=silent_from)
    assert shard.counters["windows_run"] >= WINDOWS - 1
    assert shard.merger.counters["nodes_missing"] >= WINDOWS - DROP_AT - 1
    assert changes == []
