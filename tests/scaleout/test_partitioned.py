"""One job split by communicator: nodes send a partial per partition, shards merge and detect per
partition, and the job's combiner hands the retuner what the single collector would have reported."""
from __future__ import annotations

import pytest

from dynamiccl.contracts.partition import comm_partition
from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
from dynamiccl.harness.scaleout_scenario import START_NS, Scenario, drop_then_straggler
from dynamiccl.scaleout.bus import InProcessBus, Outbox, partition_of
from dynamiccl.scaleout.central import CentralShard, detector_loop
from dynamiccl.scaleout.combiner import ChangeCombiner, CombinerConfig, Note, decode_note, encode_note
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, units
from dynamiccl.scaleout.node import NodeCollector, NodeConfig
from tests.scaleout.helpers import PER_NODE, Clock, single_collector_changes

# benchmarks/fanin_detect.py's short timeline: rank 11 2 ms late from 16 s to 22 s, every duration x2.5 from 28 s
NRANKS, WINDOWS, WARMUP, STRAGGLER, RATE = 16, 36, 12, 11, 600.0
#: two communicators in each of the two partitions (contracts.partition: 0xA1, 0xA3 -> 0; 0xA2, 0xB1 -> 1)
COMMS = (0xA1, 0xA2, 0xA3, 0xB1)


def _scenario(seed=3):
    return drop_then_straggler(Scenario(NRANKS, 2, WINDOWS, RATE, 28.0, 2.5, 16.0, STRAGGLER, straggler_until_s=22.0,
                                        comm_hashes=COMMS), seed)


def _config():
    return DetectorConfig(baseline=BaselineConfig(warmup=WARMUP), autoencoder=AutoencoderConfig(enabled=False))


def _single_collector(ev):
    return single_collector_changes(ev, _config(), NRANKS)


def _node_messages(ev, partitions):
    """Every node collector's messages for the records (window by window, as they close)."""
    bus = InProcessBus()
    for n in range(NRANKS // PER_NODE):
        node = NodeCollector(NodeConfig(f"node{n}", "j", partitions=partitions), Outbox(bus, max_messages=1 << 20))
        node.consume(ev[ev["rank"] // PER_NODE == n])
        node.tick(flush_all=True)
    return bus.drain()


def _partitioned(ev, partitions=2, shards=("s0",), kill=None):
    """The shards' per-unit loops, their notes through the combiner; (released changes, shards, units run).
    ``kill``: (window, shard) — that shard stops beating and handling from that window on."""
    clock = Clock()
    notes: list[bytes] = []
    cfg = MergerConfig(units({"j": frozenset(f"node{n}" for n in range(NRANKS // PER_NODE))}, {"j": partitions}))
    table, ckpt = ShardTable(1.5, clock), {}
    run = {s: CentralShard(s, cfg, table, ckpt, detector_loop(_config()), clock) for s in shards}
    msgs = _node_messages(ev, partitions)
    by_window: dict[int, list] = {}
    for m in msgs:
        by_window.setdefault(int(m.msg_id.split("/")[2]), []).append(m)
    combiner = ChangeCombiner("j", CombinerConfig(partitions), clock)
    released, ran = [], {}
    dead = set()

    def round_():
        for s, shard in run.items():
            if s in dead:
                continue
            for u, step in shard.poll():
                ran.setdefault(u, []).append(s)
                wf = step.window
                notes.append(encode_note(Note("j", partition_of(u) or 0, wf.window_start + wf.window_s, tuple(step.changes))))
        while notes:
            released.extend(combiner.offer(decode_note(notes.pop(0))))

    for w in sorted(by_window):
        if kill is not None and w >= kill[0]:
            dead.add(kill[1])
        for m in by_window[w]:
            for s, shard in run.items():
                if s not in dead and shard.handle(m) != "not_owned":
                    break
        for s in run:
            if s not in dead:
                table.beat(s)
        for dt in (0.5, 0.5, 1.5):
            clock.t += dt
            round_()
    clock.t += cfg.max_lateness_s
    round_()
    released.extend(combiner.flush())
    return released, run, ran, combiner


def _key(c, window_s=1.0):
    return c.kind, round(c.start_s / window_s), tuple(c.ranks[:1]) if c.kind == "straggler" else ()


def test_partitioned_node_sends_each_partition_a_partial_and_p1_keeps_todays_subjects():
    ev = _scenario()[:int(RATE) * NRANKS * 3]               # 3 s of records
    one = _node_messages(ev, 1)
    assert {m.subject for m in one} == {"dynamiccl.partials.j.node0", "dynamiccl.partials.j.node1"}
    assert all(m.msg_id.startswith("j/") for m in one)
    two = _node_messages(ev, 2)
    assert {m.subject for m in two} == {f"dynamiccl.partials.j.node{n}.{p}" for n in (0, 1) for p in (0, 1)}
    assert len(two) == 2 * len(one)                  # every window: one partial per partition
    assert {m.msg_id.split("/")[0] for m in two} == {"j.0", "j.1"}
    only = ev[ev["comm_hash"] == COMMS[0]]           # a partition without records still gets its (empty) partial
    assert {m.subject for m in _node_messages(only, 2)} >= {"dynamiccl.partials.j.node0.1"}


def _where(c):
    return c.kind, c.start_s, c.detected_s, tuple(c.ranks[:1])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 5])
def test_two_partitions_report_what_one_unit_and_the_single_collector_report(seed):
    ev = _scenario(seed)
    assert {comm_partition(c, 2) for c in COMMS} == {0, 1}
    combined, run, ran, combiner = _partitioned(ev)
    whole, _, _, _ = _partitioned(ev, partitions=1)
    assert sorted(ran) == ["j.0", "j.1"] and min(map(len, ran.values())) >= WINDOWS - 1
    # against the same merged partials unsplit: the same changes, the straggler's rank first
    assert [_where(c) for c in combined] == [_where(c) for c in whole]
    assert [c.kind for c in combined] == ["straggler", "recovery", "bandwidth"]
    assert combined[0].ranks[0] == STRAGGLER
    assert all(len(c.evidence["merged"]) == 2 for c in combined)    # each seen by both partitions, passed once
    assert set(combined[2].comms) == {f"0x{c:x}" for c in COMMS}     # the drop's where: both partitions' comms
    # against the single collector on the same records: every change at the same onset, detected within
    # one window. (Its kind for the straggler is "latency" on these 4 communicators, as the unpartitioned
    # shard's is "straggler": the partials' per-rank means, docs/scale-out.md; not the partitioning.)
    single = _single_collector(ev)
    assert [c.start_s for c in combined] == [c.start_s for c in single]
    assert all(abs(a.detected_s - b.detected_s) <= 1.0 for a, b in zip(combined, single))
    assert [c.kind for c in combined[1:]] == [c.kind for c in single[1:]]


def test_the_combiner_passes_a_job_wide_drop_once_and_keeps_one_partitions_two_changes():
    from dataclasses import replace

    from dynamiccl.detector.events import RegimeChange
    clock = Clock()
    comb = ChangeCombiner("j", CombinerConfig(2, tolerance_s=2.0), clock)

    def rc(i, kind, start, det, comms, ranks=()):
        return RegimeChange(id=f"rc-j-{i}", kind=kind, job_id="j", start_s=start, detected_s=det, magnitude=2.5,
                            comms=list(comms), ranks=list(ranks))
    out = comb.offer(Note("j", 0, 41.0, (rc(1, "bandwidth", 40.0, 41.0, ["0xa1"]),)))
    assert out == []                                  # partition 1 has not run past 41 + 2 yet
    out += comb.offer(Note("j", 1, 42.0, (rc(1, "bandwidth", 41.0, 42.0, ["0xa2"]),
                                          rc(2, "bandwidth", 41.5, 42.0, ["0xb1"]))))
    out += comb.offer(Note("j", 0, 45.0))
    out += comb.offer(Note("j", 1, 45.0))
    assert [(c.kind, c.start_s, c.comms) for c in out] == [("bandwidth", 40.0, ["0xa1", "0xa2"]),
                                                          ("bandwidth", 41.5, ["0xb1"])]
    assert [m["partition"] for m in out[0].evidence["merged"]] == [0, 1]
    rec = comb.offer(Note("j", 1, 60.0, (RegimeChange(id="r", kind="recovery", job_id="j", start_s=58.0,
                                                      detected_s=59.0, magnitude=0.4, recovers="rc-j-1"),)))
    clock.t += 10.0                                   # partition 0 never catches up: released by age
    rec += comb.due()
    assert [c.recovers for c in rec] == [out[0].id] and comb.counters["forced"] == 1
    slow = (rc(7, "bandwidth", 80.0, 82.0, ["0xa1"]), rc(8, "latency", 80.0, 82.0, ["0xa2"]))
    # partition 0's slope is significant and positive, partition 1's slightly negative and noisy: pooled, positive
    slow[0].evidence["size_response"] = {"slope_per_doubling": 0.02, "slope_se": 0.005}
    slow[1].evidence["size_response"] = {"slope_per_doubling": -0.004, "slope_se": 0.006}
    one = comb.offer(Note("j", 0, 90.0, slow[:1])) + comb.offer(Note("j", 1, 90.0, slow[1:]))
    assert [(c.kind, c.comms) for c in one] == [("bandwidth", ["0xa1", "0xa2"])]   # one slowdown
    slow[1].evidence["size_response"] = {"slope_per_doubling": -0.05, "slope_se": 0.005}
    one = comb.offer(Note("j", 0, 99.0, (replace(slow[0], start_s=95.0, detected_s=97.0),)))
    one += comb.offer(Note("j", 1, 99.0, (replace(slow[1], start_s=95.0, detected_s=97.0),)))
    assert [c.kind for c in one] == ["latency"]                                   # the pooled slope is negative
    assert comb.offer(Note("k", 0, 1.0)) == [] and comb.offer(Note("j", 2, 1.0)) == []
    assert comb.counters["dropped"] == 2
    with pytest.raises(ValueError, match="change note"):
        decode_note(b'{"v": 1, "job": "j", "partition": 0}')


@pytest.mark.slow
def test_a_partitions_shard_dying_moves_only_that_partition():
    ev = _scenario(3)
    from dynamiccl.scaleout.merger import owner
    shards = ["s1", "s2", "s3"]                       # rendezvous: j.0 -> s3, j.1 -> s1
    victim = owner("j.0", shards)
    assert owner("j.1", shards) != victim, "pick shard names that split the partitions"
    combined, run, ran, _ = _partitioned(ev, shards=tuple(shards), kill=(START_NS // 10**9 + 20, victim))
    assert set(ran["j.1"]) == {owner("j.1", shards)}                     # the other partition never moved
    assert ran["j.0"][0] == victim and set(ran["j.0"]) - {victim}        # this one moved to a survivor
    assert sum(s.counters["windows_run"] for s in run.values()) >= 2 * (WINDOWS - 1) - 4
    assert [c.kind for c in combined] == ["straggler", "recovery", "bandwidth"]


def test_a_partial_must_come_on_its_partitions_subject_and_name_a_configured_partition():
    from dynamiccl.scaleout.bus import Message
    ev = _scenario()[:int(RATE) * NRANKS * 2]
    msgs = [m for m in _node_messages(ev, 2) if m.subject.endswith("node0.1")]
    clock = Clock()
    shard = CentralShard("s0", MergerConfig(units({"j": frozenset({"node0", "node1"})}, {"j": 2})),
                         ShardTable(1.5, clock), {}, detector_loop(_config()), clock)
    moved = Message(msgs[0].subject[:-1] + "0", msgs[0].data, msgs[0].msg_id)   # partition 1's body on 0's subject
    assert shard.handle(moved) == "malformed" and shard.counters["subject_mismatch"] == 1
    assert shard.handle(msgs[0]) == "filed"
    three = _node_messages(ev, 3)                     # a node configured with 3 partitions: unit j.2 is unknown
    assert {shard.handle(m) for m in three if m.subject.endswith(".2")} == {"refused"}
    assert shard.merger.counters["unknown_job"] >= 1


def test_a_runner_round_returns_the_windows_its_first_poll_ran():
    """The partitions' notes (and checkpoints) come from the round's steps: a window already due when
    the round starts must be among them (it was dropped, and the combiner never heard of its changes)."""
    import asyncio
    from types import SimpleNamespace

    from dynamiccl.scaleout.service import ShardRunner

    class Js:
        async def pull_subscribe(self, *a, **k):
            return SimpleNamespace(fetch=self.fetch)

        async def fetch(self, *a, **k):
            return []

        async def consumer_info(self, *a, **k):
            return SimpleNamespace(num_pending=0, num_ack_pending=0)

    clock = Clock()
    shard = CentralShard("s0", MergerConfig(units({"j": frozenset({"node0", "node1"})}, {"j": 2})),
                         ShardTable(1.5, clock), {}, detector_loop(_config()), clock)
    ev = _scenario()[:int(RATE) * NRANKS * 2]
    for m in _node_messages(ev, 2):
        assert shard.handle(m) == "filed"
    clock.t += 60.0                                   # every window due before the round starts
    steps = asyncio.run(ShardRunner(shard, Js(), clock=clock).step())
    assert sorted({u for u, _ in steps}) == ["j.0", "j.1"] and len(steps) == shard.counters["windows_run"]


def test_a_partition_seeing_a_job_wide_drop_seconds_later_joins_the_released_change():
    """The detector's merge rule across partitions: a change of the same event detected within merge_s
    after another partition's released one is that change (before: the job got the drop twice)."""
    from dynamiccl.detector.events import RegimeChange
    comb = ChangeCombiner("j", CombinerConfig(2, tolerance_s=2.0, merge_s=5.0), Clock())

    def rc(i, kind, start, det, recovers=None):
        return RegimeChange(id=f"rc-j-{i}", kind=kind, job_id="j", start_s=start, detected_s=det, magnitude=2.0,
                            comms=["0xa"], recovers=recovers)
    out = comb.offer(Note("j", 0, 27.0, (rc(1, "bandwidth", 26.0, 27.0),)))
    out += comb.offer(Note("j", 0, 29.0)) + comb.offer(Note("j", 1, 29.0))   # both ran past 27 + 2: released alone
    assert [c.id for c in out] == ["rc-j-combined-1"]
    late = comb.offer(Note("j", 1, 30.0, (rc(1, "latency", 29.0, 30.0),)))   # same slowdown, 3 s later
    late += comb.offer(Note("j", 0, 33.0)) + comb.offer(Note("j", 1, 33.0))
    assert late == [] and comb.counters["merged_late"] == 1
    rec = comb.offer(Note("j", 1, 50.0, (rc(2, "recovery", 48.0, 49.0, recovers="rc-j-1"),)))
    rec += comb.offer(Note("j", 0, 52.0)) + comb.offer(Note("j", 1, 52.0))
    assert [c.recovers for c in rec] == ["rc-j-combined-1"]     # partition 1's recovery names the combined change
    again = comb.offer(Note("j", 1, 60.0, (rc(3, "bandwidth", 58.0, 59.0),)))
    again += comb.offer(Note("j", 0, 62.0)) + comb.offer(Note("j", 1, 62.0))
    assert [c.id for c in again] == ["rc-j-combined-3"]         # beyond merge_s: a change of its own
    assert ChangeCombiner("j", CombinerConfig(2), Clock()).config.merge_s == 5.0   # the detector's incidents.merge_s
    with pytest.raises(ValueError, match="merge_s"):
        CombinerConfig(2, merge_s=-1.0).validate()


def test_a_member_whose_own_slope_decided_still_gives_its_most_affected_size():
    """The combiner's fallback (pooled slope not significant: the most affected member's size) needs that
    size from a member whose own fit was significant too: the detector records it always (before: only
    when its own slope did not decide, so the combiner fell back on a stream count and called a job-wide
    4 MiB drop 'latency' where the single collector said 'bandwidth')."""
    import numpy as np

    from dynamiccl.detector.classify import classify_size_response
    kind, ev = classify_size_response(np.array([4096.0, 65536.0, 4194304.0]), np.array([1.3, 1.1, 0.95]),
                                      np.array([0.01, 0.01, 0.01]))
    assert kind == "latency" and "slope_per_doubling" in ev      # its own slope decided
    assert ev["fallback_bytes"] == 4096.0                       # and its most affected stream is still named
