"""Real PEER records through the collector's peer path: what DynamICCL's profiler emitted inside NCCL
2.28.9 on an H200 (validate-nccl's probe_peer launch, ranks 0 and 1 of 4; tests/collector/data/), summed
per window, exported to Prometheus and parquet with nothing refused or lost."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
from prometheus_client import CollectorRegistry, generate_latest

from dynamiccl.collector.config import PeerConfig, WindowConfig
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.processors.peers import PeerBatch, PeerStage

DATA = Path(__file__).with_name("data") / "h200_nccl_2289_peer_records.npz"


def test_real_nccl_peer_records_sum_exactly_per_rank_peer_and_direction(tmp_path):
    data = np.load(DATA)
    recs, n = data["peers"], json.loads(str(data["meta"]))["nranks"]
    last_s = int(recs["enqueue_ns"].max()) * 1e-9
    m, reg = SelfMetrics(), CollectorRegistry()
    stage = PeerStage(PeerConfig(), WindowConfig(window_s=1.0, allowed_lateness_s=2.0, idle_flush_s=3.0),
                      metrics=m, gauge_ttl_s=1e9, parquet_dir=str(tmp_path), registry=reg,
                      clock=lambda: 0.0, wall_clock=lambda: last_s + 1.0)
    # as a collector receives them: each rank's records in its own batches, the ranks interleaved in time
    ordered = recs[np.argsort(recs["enqueue_ns"], kind="stable")]
    for chunk in np.array_split(ordered, 24):
        for rank in (0, 1):
            stage.consume(PeerBatch(chunk[chunk["rank"] == rank], f"rank{rank}", "validate-probe_peer"))
    stage.shutdown()
    assert not {k: v for k, v in m.dropped.items() if v}, {k: v for k, v in m.dropped.items() if v}
    df = pl.read_parquet(tmp_path / "peers" / "**" / "*.parquet")
    assert df["records"].sum() == len(recs)
    for rank in (0, 1):
        for is_send, direction in ((1, "send"), (0, "recv")):
            mine = recs[(recs["rank"] == rank) & (recs["is_send"] == is_send)]
            got = df.filter((pl.col("rank") == rank) & (pl.col("direction") == direction))
            assert got["bytes"].sum() == int(mine["bytes"].sum()) > 0
            assert set(got["peer"].to_list()) == set(mine["peer"].tolist())
        # a ring: every rank talks to its two neighbours only
        assert set(df.filter(pl.col("rank") == rank)["peer"].to_list()) == {(rank + 1) % n, (rank - 1) % n}
    text = generate_latest(reg).decode()
    exported = sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("dynamiccl_peer_bytes{"))
    assert exported > 0
