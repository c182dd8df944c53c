"""Wait stand-ins on the scale-out path (scaleout/waits.py): two node collectors and the merger give the
single collector's wait streams on the same records, and the same changes on a late rank."""
from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import WindowConfig
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.collector.records import event_time_ns
from dynamiccl.collector.wire_format import EVENT_DTYPE, FUNCS, EventFlags, Kind, TimingSource
from dynamiccl.harness.collector_testing import SinkConsumer
from dynamiccl.scaleout.features import window_features
from dynamiccl.scaleout.node import NodeCollector, NodeConfig
from dynamiccl.scaleout.partials import merge_partials, node_partial
from dynamiccl.scaleout.wire import encode_partial, frames_of, read_partial

T0 = 1_700_000_000_000_000_000
NRANKS, PER_NODE, PERIOD_S = 16, 8, 0.01


def untimed_job(seconds: float, *, seed: int = 0, late_rank: int | None = None, late_from_s: float = 0.0,
                late_s: float = 2e-3, timed_every: int = 0) -> np.ndarray:
    """16 ranks on 2 nodes, an AllReduce every 10 ms, ranks enqueueing with ~0.2 ms of jitter, every record
    untimed (NCCL 2.31+ after a send/recv) except every ``timed_every``-th instance; from ``late_from_s``
    ``late_rank`` enqueues ``late_s`` later."""
    rng = np.random.default_rng(seed)
    n = int(seconds / PERIOD_S)
    t = np.arange(n) * PERIOD_S
    arrive = t[:, None] + rng.exponential(2e-4, (n, NRANKS))
    if late_rank is not None:
        arrive[:, late_rank] += np.where(t >= late_from_s, late_s, 0.0)
    ev = np.zeros((n, NRANKS), EVENT_DTYPE)
    ev["kind"], ev["func"], ev["algo"], ev["proto"], ev["datatype"] = Kind.COLL, FUNCS.index("AllReduce"), 1, 2, 6
    ev["rank"], ev["nranks"], ev["nnodes"] = np.arange(NRANKS), NRANKS, 2
    ev["pid"] = 100 + np.arange(NRANKS)
    ev["comm_hash"], ev["bytes"], ev["count"] = 0xABC, 1 << 18, 1 << 16
    ev["seq_number"] = np.arange(n)[:, None]
    enq = T0 + (arrive * 1e9).astype(np.int64)
    ev["enqueue_ns"] = enq
    timed = (np.arange(n) % timed_every == 0)[:, None] & np.ones(NRANKS, bool) if timed_every else \
        np.zeros((n, NRANKS), bool)
    ev["timing_source"] = np.where(timed, TimingSource.KERNEL_GPU, TimingSource.NONE)
    ev["gpu_start_ns"] = np.where(timed, enq + 5000, 0)
    ev["gpu_end_ns"] = np.where(timed, enq + 1_005_000, 0)
    ev["flags"] = np.where(timed, 0, EventFlags.TIMING_SUSPECT)
    return ev.reshape(-1)


def _node(ev, n):
    return ev[ev["rank"] // PER_NODE == n]


def single(ev) -> tuple[list, SelfMetrics]:
    """One collector receiving both nodes' records, in 0.1 s slices of event time."""
    sink, m = SinkConsumer(), SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=1.0, allowed_lateness_s=30.0), next_consumer=sink, metrics=m)
    t = (event_time_ns(ev) - T0) // 100_000_000
    for s in np.unique(t).tolist():
        for n in (0, 1):
            part = _node(ev[t == s], n)
            if len(part):
                agg.consume(RecordBatch(part, f"node{n}", "j", {}))
    agg.shutdown()
    return [r.features for r in sink.items], m


def node_partials(ev, **kw) -> dict[int, list]:
    w = event_time_ns(ev) // 1_000_000_000
    return {win: [node_partial(_node(ev[w == win], n), node=f"node{n}", job_id="j", window=win, window_s=1.0,
                               waits=True, **kw) for n in (0, 1) if len(_node(ev[w == win], n))]
            for win in np.unique(w).tolist()}


def scaled(ev, merger=None, **kw) -> list:
    """The merger's windows of the two nodes' partials, through the wire (``merger``: a WindowMerger
    expecting both nodes; else merged directly)."""
    out = []
    for w, parts in sorted(node_partials(ev, **kw).items()):
        raws = [read_partial(encode_partial(p, "j")) for p in parts]
        if merger is None:
            out.append(window_features(merge_partials([frames_of(raws)])))
            continue
        for r in raws:
            merger.add("j", r)
        out.extend(wf for _, wf in merger.due())
    return out


def _by_start(wfs):
    return {round(wf.window_start, 3): wf for wf in wfs}


def _assert_same_waits(one: list, many: dict) -> int:
    """Per window of one collector, the merger's window has the same ``waits`` rows (records and instances
    equal, mean / max within 1e-9, quantiles within the partials' histogram) and the same votes; the number
    of windows with waits compared."""
    compared = 0
    for wf in one:
        other = many[round(wf.window_start, 3)]
        assert (wf.waits is None) == (other.waits is None), f"window {wf.window_start}: waits on one path only"
        if wf.waits is None:
            continue
        a, b = wf.waits.sort("comm_hash", "func"), other.waits.sort("comm_hash", "func")
        assert a["comm_hash"].to_list() == b["comm_hash"].to_list()
        assert a["records"].to_list() == b["records"].to_list() and a["instances"].to_list() == b["instances"].to_list()
        assert np.allclose(a["lat_mean_s"].to_numpy(), b["lat_mean_s"].to_numpy(), rtol=1e-9)
        assert np.allclose(a["lat_max_s"].to_numpy(), b["lat_max_s"].to_numpy(), rtol=1e-9)
        for q in ("lat_p50_s", "lat_p90_s", "lat_p99_s"):    # the partials' histogram: within one bucket
            assert np.allclose(a[q].to_numpy(), b[q].to_numpy(), rtol=0.1)
        on = ["comm_hash", "rank"]
        assert wf.ranks.sort(on)["shortest_count"].to_list() == other.ranks.sort(on)["shortest_count"].to_list()
        compared += 1
    return compared


def test_two_nodes_and_the_merger_give_the_single_collectors_waits():
    from dynamiccl.scaleout.merger import MergerConfig, WindowMerger
    ev = untimed_job(6.0, seed=3, late_rank=11, late_from_s=3.0, timed_every=7)
    one, m = single(ev)
    merger = WindowMerger(MergerConfig({"j": frozenset({"node0", "node1"})}), lambda: 0.0)
    many = _by_start(scaled(ev, merger))
    assert _assert_same_waits(one, many) >= 4
    merged = {k: sum(wf.counters.get(f"wait_{k}", 0) for wf in many.values()) for k in m.wait}
    assert merged == m.wait and m.wait["instances"] > 0
    assert {k: merger.counters[f"wait_{k}"] for k in m.wait} == m.wait


def _two_comms_one_losing(seconds: float = 9.0, late_every: int = 20):
    """Communicators 0xABC and 0xDEF of job j, 16 ranks each on 2 nodes, every record untimed; from 3 s on
    every ``late_every``-th instance of 0xABC (every rank's record) is delivered 3 s late. Returns the
    records, the on-time / held masks and each record's delivery slice (0.1 s)."""
    a, b = untimed_job(seconds, seed=13), untimed_job(seconds, seed=14)
    b["comm_hash"], b["pid"] = 0xDEF, b["pid"] + 100
    ev = np.concatenate([a, b])
    t = (event_time_ns(ev) - T0) // 100_000_000
    held = (t >= 30) & (ev["comm_hash"] == 0xABC) & (ev["seq_number"] % late_every == 0)
    return ev, held, np.where(held, t + 30, t)


def _deliveries(ev, held, slot):
    """(slice, node, records) in delivery order: per 0.1 s slice, each node's on-time records, then each
    node's held ones."""
    for s in range(int(slot.max()) + 1):
        for sel in (~held, held):
            for n in (0, 1):
                part = _node(ev[sel & (slot == s)], n)
                if len(part):
                    yield n, part


def test_a_communicator_losing_records_withholds_the_same_waits_on_both_paths():
    """0xABC loses 5 % of its records as late on both nodes: one collector and 2 node collectors + the merger
    (through the wire) withhold 0xABC's waits in the same windows and keep 0xDEF's in every window, with the
    same waits and the same outcome counts (withheld ones by scope: communicator). Before: the nodes marked
    the whole window lossy and the merger withheld 0xDEF's waits too."""
    from dynamiccl.scaleout.bus import Outbox
    from dynamiccl.scaleout.merger import MergerConfig, WindowMerger
    ev, held, slot = _two_comms_one_losing()
    sink, m = SinkConsumer(), SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=1.0, allowed_lateness_s=0.5), next_consumer=sink, metrics=m)
    sent: list = []

    class Bus:
        def publish(self, msg):
            sent.append(msg)

    nodes = [NodeCollector(NodeConfig(f"node{n}", "j", allowed_lateness_s=0.5), Outbox(Bus())) for n in (0, 1)]
    for n, part in _deliveries(ev, held, slot):
        agg.consume(RecordBatch(part, f"node{n}", "j", {}))
        nodes[n].consume(part)
        nodes[n].tick()
    agg.shutdown()
    for node in nodes:
        node.tick(flush_all=True)
    merger = WindowMerger(MergerConfig({"j": frozenset({"node0", "node1"})}), lambda: 0.0)
    for msg in sent:
        merger.add("j", read_partial(msg.data))
    many = _by_start([wf for _, wf in merger.due()])
    one = [r.features for r in sink.items]
    assert m.dropped["late"] > 0 and sum(node.counters["dropped_late"] for node in nodes) == m.dropped["late"]
    assert _assert_same_waits(one, many) >= 8
    comms = [set(wf.waits["comm_hash"].to_list()) if wf.waits is not None else set() for wf in one]
    assert all(0xDEF in c for c in comms), "0xDEF's waits withheld for 0xABC's losses"
    assert sum(0xABC not in c for c in comms) >= 3, "0xABC's lossy windows still gave waits"
    assert {k: merger.counters[f"wait_{k}"] for k in m.wait} == m.wait and m.wait["withheld"] > 0
    assert merger.counters["wait_lossy_communicator"] == m.wait_lossy_scope["communicator"] == m.wait_lossy["j"]
    assert merger.counters["wait_lossy_job"] == 0
    assert all(node.counters["waits_lossy_comms"] >= 3 and node.counters["waits_lossy_windows"] == 0
               for node in nodes)


def test_without_the_node_records_there_are_no_waits():
    """A partial without waits (the option off, or a version-1 node) gives the merger no waits frame."""
    ev = untimed_job(2.0, seed=4)
    w = event_time_ns(ev) // 1_000_000_000
    parts = [node_partial(_node(ev[w == w[0]], n), node=f"node{n}", job_id="j", window=int(w[0]), window_s=1.0)
             for n in (0, 1)]
    assert window_features(merge_partials(parts)).waits is None


def test_a_node_over_the_bound_sends_none_and_the_window_is_withheld():
    ev = untimed_job(2.0, seed=5)
    parts = node_partials(ev, max_wait_records=100)
    assert all(p["waits_cut"] > 0 and p["waits_lossy"] == 1 and p["waitq"].height == 0 for ps in parts.values()
               for p in ps)
    wfs = scaled(ev, max_wait_records=100)
    assert all(wf.waits is None for wf in wfs)


def test_a_lossy_node_withholds_the_windows_waits():
    ev = untimed_job(2.0, seed=5)
    wfs = scaled(ev, lossy=True)
    assert all(wf.waits is None for wf in wfs) and sum(wf.counters["wait_withheld"] for wf in wfs) > 0


@pytest.mark.parametrize("column,value,what", [("func", FUNCS.index("Send"), "not a collective"),
                                               ("rank", 99, "rank outside"), ("nranks", 0, "rank outside")])
def test_a_hostile_nodes_wait_records_are_refused_clearly(column, value, what):
    ev = untimed_job(1.0, seed=6)
    p = node_partial(_node(ev, 0), node="node0", job_id="j", window=int(T0 // 10**9), window_s=1.0, waits=True)
    import polars as pl
    p["waitq"] = p["waitq"].with_columns(pl.lit(value, pl.Int64).alias(column))
    with pytest.raises(ValueError, match=what):
        read_partial(encode_partial(p, "j"))


def test_a_version_1_header_with_waits_fields_is_refused():
    ev = untimed_job(1.0, seed=6)
    p = node_partial(_node(ev, 0), node="node0", job_id="j", window=int(T0 // 10**9), window_s=1.0)
    data = encode_partial(p, "j")
    forged = data.replace(b'"auth": 0', b'"auth": 0, "waits_lossy": 1')
    import struct
    forged = struct.pack("<I", struct.unpack_from("<I", forged)[0] + len(b', "waits_lossy": 1')) + forged[4:]
    with pytest.raises(ValueError, match="waits_lossy"):
        read_partial(forged)


def _forge(data: bytes, **head) -> bytes:
    """The message with its header's fields replaced (None: removed)."""
    import json
    import struct
    n = struct.unpack_from("<I", data)[0]
    h = json.loads(data[4:4 + n])
    h.update(head)
    h = json.dumps({k: v for k, v in h.items() if v is not None}).encode()
    return struct.pack("<I", len(h)) + h + data[4 + n:]


def test_lossy_communicators_travel_on_the_wire_and_are_checked():
    from dynamiccl.collector.processors.wait import MAX_LOSSY_COMMS
    ev = untimed_job(1.0, seed=6)
    kw = dict(node="node0", job_id="j", window=int(T0 // 10**9), window_s=1.0, waits=True)
    p = node_partial(_node(ev, 0), lossy_comms=[0xABC, 2**64 - 1], **kw)
    assert p["waits_lossy"] == 0
    assert frames_of([read_partial(encode_partial(p, "j"))])["waits_lossy_comms"] == [0xABC, 2**64 - 1]
    over = node_partial(_node(ev, 0), lossy_comms=range(MAX_LOSSY_COMMS + 1), **kw)
    assert over["waits_lossy"] == 1 and over["waits_lossy_comms"] == []     # past the bound: the whole window
    data = encode_partial(p, "j")
    for bad in ([-1], [2**64], ["abc"], [True], 7, list(range(MAX_LOSSY_COMMS + 1))):
        with pytest.raises(ValueError, match="lossy_comms"):
            read_partial(_forge(data, lossy_comms=bad))
    v1 = encode_partial(node_partial(_node(ev, 0), **{**kw, "waits": False}), "j")
    with pytest.raises(ValueError, match="lossy_comms"):
        read_partial(_forge(v1, lossy_comms=[1]))


def test_a_partitioned_node_sends_each_partition_its_own_lossy_communicators():
    from dynamiccl.contracts.partition import comm_partition
    from dynamiccl.scaleout.partials import split_partial
    ev = untimed_job(1.0, seed=6)
    comms = list(range(1, 40))
    p = node_partial(_node(ev, 0), node="node0", job_id="j", window=int(T0 // 10**9), window_s=1.0, waits=True,
                     lossy_comms=comms)
    parts = split_partial(p, 4)
    assert sorted(c for q in parts for c in q["waits_lossy_comms"]) == comms
    assert all(comm_partition(c, 4) == q["partition"] for q in parts for c in q["waits_lossy_comms"])


def test_the_node_collector_marks_the_communicator_that_lost_records():
    from dynamiccl.scaleout.bus import Outbox
    sent: list = []

    class Sink:
        def publish(self, m):
            sent.append(m)

    ev, held, slot = _two_comms_one_losing(6.0)
    node = NodeCollector(NodeConfig("node0", "j", allowed_lateness_s=0.5), Outbox(Sink()))
    for n, part in _deliveries(ev, held, slot):
        if n == 0:
            node.consume(part)
            node.tick()
    node.tick(flush_all=True)
    marks = [read_partial(m.data).waits_lossy_comms for m in sent]
    assert node.counters["dropped_late"] > 0 and node.counters["waits_lossy_windows"] == 0
    assert [c for c in marks if c] and all(c in ([], [0xABC]) for c in marks)
    assert node.counters["waits_lossy_comms"] == sum(map(len, marks))


def test_the_node_collector_sends_its_waits_and_counts_cuts():
    from dynamiccl.scaleout.bus import Outbox
    sent: list = []

    class Sink:
        def publish(self, m):
            sent.append(m)

    ev = untimed_job(3.0, seed=8)
    node = NodeCollector(NodeConfig("node0", "j", wait_streams=True, max_wait_records=500), Outbox(Sink()))
    node.consume(_node(ev, 0))
    node.tick(flush_all=True)
    assert node.counters["waits_cut"] > 0 and node.counters["waits_lossy_windows"] >= 1


def _changes(wfs) -> list:
    from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
    from dynamiccl.scaleout.central import detector_loop
    changes: list = []
    cfg = DetectorConfig(baseline=BaselineConfig(warmup=20), autoencoder=AutoencoderConfig(enabled=False))
    loop = detector_loop(cfg, sinks=lambda job: [changes.append])("j")
    for wf in sorted(wfs, key=lambda wf: wf.window_start):
        loop.step(wf)
    return changes


def test_a_late_rank_on_an_untimed_job_gives_the_same_changes_as_one_collector():
    """Rank 11 (node 1) enqueues 2 ms late from 30 s: a straggler on AllReduce:wait, rank 11 first, the same
    change from the merger as from one collector (before: the merger's windows had no waits, no change)."""
    ev = untimed_job(45.0, seed=9, late_rank=11, late_from_s=30.0)
    one, many = _changes(single(ev)[0]), _changes(scaled(ev))
    key = [(c.kind, round(c.detected_s, 3), c.ranks[:1], c.funcs) for c in one]
    assert key and key[0][0] == "straggler" and key[0][2] == [11] and key[0][3] == ["AllReduce:wait"]
    assert [(c.kind, round(c.detected_s, 3), c.ranks[:1], c.funcs) for c in many] == key


@pytest.mark.parametrize("flag,on", [([], True), (["--no-wait-streams"], False), (["--wait-streams"], True)])
def test_the_node_cli_sets_the_wait_streams(flag, on):
    import argparse

    from dynamiccl.scaleout.cli import node_config, register
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(["node", "--node", "n0", "--job", "j", *flag])
    assert node_config(args).node.wait_streams is on
