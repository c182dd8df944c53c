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


def test_two_nodes_and_the_merger_give_the_single_collectors_waits():
    from dynamiccl.scaleout.merger import MergerConfig, WindowMerger
    ev = untimed_job(6.0, seed=3, late_rank=11, late_from_s=3.0, timed_every=7)
    one, m = single(ev)
    merger = WindowMerger(MergerConfig({"j": frozenset({"node0", "node1"})}), lambda: 0.0)
    many = _by_start(scaled(ev, merger))
    compared = 0
    for wf in one:
        other = many[round(wf.window_start, 3)]
        if wf.waits is None:
            assert other.waits is None
            continue
        a, b = wf.waits.sort("func"), other.waits.sort("func")
        assert a["records"].to_list() == b["records"].to_list() and a["instances"].to_list() == b["instances"].to_list()
        assert np.allclose(a["lat_mean_s"].to_numpy(), b["lat_mean_s"].to_numpy(), rtol=1e-9)
        assert np.allclose(a["lat_max_s"].to_numpy(), b["lat_max_s"].to_numpy(), rtol=1e-9)
        for q in ("lat_p50_s", "lat_p90_s", "lat_p99_s"):    # the partials' histogram: within one bucket
            assert np.allclose(a[q].to_numpy(), b[q].to_numpy(), rtol=0.1)
        assert wf.ranks.sort("rank")["shortest_count"].to_list() == other.ranks.sort("rank")["shortest_count"].to_list()
        compared += 1
    assert compared >= 4
    merged = {k: sum(wf.counters.get(f"wait_{k}", 0) for wf in many.values()) for k in m.wait}
    assert merged == m.wait and m.wait["instances"] > 0
    assert {k: merger.counters[f"wait_{k}"] for k in m.wait} == m.wait


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
