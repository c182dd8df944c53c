"""Merging node partials gives the window features one collector computes over all the records."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import WindowConfig
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.collector.records import event_time_ns
from dynamiccl.harness.collector_testing import SinkConsumer, synthetic_events
from dynamiccl.scaleout.features import window_features
from dynamiccl.scaleout.partials import merge_partials, node_partial

NRANKS, PER_NODE, STRAGGLER = 16, 8, 11
EXACT_KEYS = ["records", "instances", "bytes_total", "lat_mean_s", "lat_max_s", "spread_p50_s",
              "spread_max_s", "nranks", "nnodes", "tuner_config_version"]
EXACT_RANKS = ["records", "lat_mean_s", "shortest_count", "instances_complete", "host"]


def _events():
    return synthetic_events(3000, nranks=NRANKS, nnodes=2, seed=7, rate_per_s=1000.0,
                            straggler_rank=STRAGGLER, untimed_fraction=0.05)


def _node(rank):
    return f"node{rank // PER_NODE}"


def _single_collector(ev):
    sink = SinkConsumer()
    agg = WindowAggregator(WindowConfig(window_s=1.0), next_consumer=sink)
    for node in ("node0", "node1"):
        agg.consume(RecordBatch(ev[ev["rank"] // PER_NODE == int(node[-1])], host=node, job_id="j"))
    agg.shutdown()
    return {int(round(r.features.window_start)): r.features for r in sink.items}


def _partials(ev):
    w = event_time_ns(ev) // 1_000_000_000
    out = {}
    for win in np.unique(w).tolist():
        parts = [node_partial(ev[(w == win) & (ev["rank"] // PER_NODE == n)], node=f"node{n}", job_id="j",
                              window=win, window_s=1.0) for n in (0, 1)]
        out[win] = parts
    return out


def _sorted(df, cols):
    return df.sort(["comm_hash", "func", "algo", "proto", "size_bucket"])[cols]


def test_merged_partials_equal_one_collector():
    ev = _events()
    single = _single_collector(ev)
    merged = {w: window_features(merge_partials(p)) for w, p in _partials(ev).items()}
    assert sorted(single) == sorted(merged) and len(merged) >= 3
    for w, wf in single.items():
        a, b = _sorted(wf.keys, EXACT_KEYS), _sorted(merged[w].keys, EXACT_KEYS)
        for col in EXACT_KEYS:
            np.testing.assert_allclose(a[col].cast(pl.Float64).to_numpy(), b[col].cast(pl.Float64).to_numpy(),
                                       rtol=1e-7, err_msg=f"window {w} keys.{col}")
        ra = wf.ranks.sort(["comm_hash", "rank"])
        rb = merged[w].ranks.sort(["comm_hash", "rank"])
        assert ra["rank"].to_list() == rb["rank"].to_list()
        for col in EXACT_RANKS:
            if col == "host":
                assert ra[col].to_list() == rb[col].to_list()
            else:
                np.testing.assert_allclose(ra[col].cast(pl.Float64).to_numpy(),
                                           rb[col].cast(pl.Float64).to_numpy(), rtol=1e-9,
                                           err_msg=f"window {w} ranks.{col}")


def test_straggler_named_from_partials():
    ev = _events()
    parts = _partials(ev)
    w = sorted(parts)[1]
    ranks = window_features(merge_partials(parts[w])).ranks
    top = ranks.group_by("rank").agg(pl.col("shortest_count").sum()).sort("shortest_count", descending=True)
    assert top["rank"][0] == STRAGGLER


def test_merge_is_associative_and_order_free():
    parts = _partials(_events())
    w = sorted(parts)[1]
    a, b = parts[w]
    one = window_features(merge_partials([a, b]))
    two = window_features(merge_partials([merge_partials([b]), merge_partials([a])]))
    assert one.keys.equals(two.keys) and one.ranks.equals(two.ranks)


def test_merge_refuses_mixed_windows():
    parts = _partials(_events())
    w0, w1 = sorted(parts)[:2]
    with pytest.raises(ValueError, match="different windows"):
        merge_partials([parts[w0][0], parts[w1][0]])
