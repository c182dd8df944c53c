"""Per-peer network timing in the collector (dynamiccl/collector/processors/peers.py): PEER records
summed per (job, host, comm, rank, peer, direction) and window; bounded Prometheus rows (top_k by
proxy-state time, the rest counted); a parquet table; every refusal counted."""
from __future__ import annotations

import os

import numpy as np
import polars as pl
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dynamiccl.collector.config import PeerConfig, WindowConfig
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.processors.peers import PeerBatch, PeerStage, PeerWindows
from dynamiccl.collector.wire_format import PEER_DTYPE, Kind

T0 = 1_700_000_000 * 10**9  # event time of the first window (ns)
WIN = WindowConfig(window_s=1.0, allowed_lateness_s=2.0, idle_flush_s=3.0)


class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def peers(n, *, rank=0, peer=1, is_send=1, t_ns=T0, bytes_=4096, states=(10, 20, 30), comm=0xC0):
    p = np.zeros(n, PEER_DTYPE)
    p["kind"], p["rank"], p["peer"], p["is_send"], p["comm_hash"] = Kind.PEER, rank, peer, is_send, comm
    p["enqueue_ns"], p["bytes"], p["proxy_ops"], p["steps"] = t_ns, bytes_, 2, 4
    p["state_ns"] = states
    return p


def stage(tmp_path=None, **cfg):
    m, clock = SelfMetrics(), Clock()
    reg = CollectorRegistry()
    s = PeerStage(PeerConfig(**cfg), WIN, metrics=m, gauge_ttl_s=15.0, parquet_dir=str(tmp_path) if tmp_path else None,
                  registry=reg, clock=clock, wall_clock=lambda: T0 * 1e-9 + 100)
    return s, m, clock, reg


def closed(s: PeerStage) -> list[tuple[float, pl.DataFrame]]:
    out = []
    s.windows.on_window.append(lambda start, df: out.append((start, df)))
    return out


def test_sums_per_peer_and_direction_then_close_on_watermark():
    s, m, _, _ = stage()
    out = closed(s)
    s.consume(PeerBatch(np.concatenate([peers(3), peers(2, peer=2, is_send=0, bytes_=100)]), "h0", "j"))
    assert out == []  # the window stays open until the newest event time is 2 s past its end
    s.consume(PeerBatch(peers(1, t_ns=T0 + 3 * 10**9), "h0", "j"))
    (start, df), = out
    assert start == pytest.approx(T0 * 1e-9)
    send = df.filter(pl.col("direction") == "send").row(0, named=True)
    recv = df.filter(pl.col("direction") == "recv").row(0, named=True)
    assert (send["peer"], send["records"], send["bytes"], send["proxy_ops"], send["steps"]) == (1, 3, 3 * 4096, 6, 12)
    assert send["state2_s"] == pytest.approx(90e-9) and recv["bytes"] == 200 and recv["records"] == 2
    assert m.peer_records == 5


def test_refusals_are_counted():
    s, m, _, _ = stage()
    bad = peers(2)
    bad["is_send"] = 7
    future = peers(3, t_ns=T0 + 3600 * 10**9)  # an hour past the wall clock: would close every window
    s.consume(PeerBatch(np.concatenate([bad, future, peers(1)]), "h0", "j"))
    s.consume(PeerBatch(peers(1, t_ns=T0 + 5 * 10**9), "h0", "j"))  # closes T0's window
    s.consume(PeerBatch(peers(4), "h0", "j"))  # for a closed window
    assert (m.dropped["peer_invalid"], m.dropped["peer_clock_range"], m.dropped["peer_late"]) == (2, 3, 4)


def test_a_window_holds_at_most_max_pairs_rows_the_busiest():
    s, m, _, _ = stage(max_pairs=4)
    out = closed(s)
    busy = [peers(1, peer=i, states=(i, i, i)) for i in range(10)]
    for b in busy:  # one batch each: the window compacts and cuts while it fills
        s.consume(PeerBatch(b, "h0", "j"))
    s.shutdown()
    (_, df), = out
    assert sorted(df["peer"].to_list()) == [6, 7, 8, 9]
    assert m.dropped["peer_pairs_full"] == 6 and m.peer_records == 4


def test_prometheus_top_k_rows_the_rest_counted_and_gauges_expire():
    s, m, clock, reg = stage(top_k=2)
    s.consume(PeerBatch(np.concatenate([peers(1, peer=i, states=(0, 0, 100 * (i + 1))) for i in range(5)]), "h0", "j"))
    s.shutdown()
    text = generate_latest(reg).decode()
    rows = [ln for ln in text.splitlines() if ln.startswith("dynamiccl_peer_state_seconds{")]
    assert len(rows) == 2 * 3 and all('peer="4"' in r or 'peer="3"' in r for r in rows)
    net = [float(r.rsplit(" ", 1)[1]) for r in rows if 'peer="4"' in r and 'state="net_wait"' in r]
    assert net == [pytest.approx(500e-9)] and 'comm="00000000000000c0",direction="send"' in rows[0]  # no name: hex
    assert "dynamiccl_collector_peer_series_dropped_total 3.0" in text
    assert "dynamiccl_collector_peer_records_total 5.0" in text
    clock.t += 16.0  # past prometheus.gauge_ttl_s without a closed window
    text = generate_latest(reg).decode()
    assert "dynamiccl_peer_bytes{" not in text and "dynamiccl_collector_peer_records_total 5.0" in text


def test_one_series_per_label_set_even_from_two_hosts():
    s, _, _, reg = stage()
    s.consume(PeerBatch(peers(1), "h0", "j"))
    s.consume(PeerBatch(peers(2), "forged-host", "j"))  # same job, comm, rank, peer, direction
    s.shutdown()
    rows = [ln for ln in generate_latest(reg).decode().splitlines() if ln.startswith("dynamiccl_peer_bytes{")]
    assert len(rows) == 1 and float(rows[0].rsplit(" ", 1)[1]) == 3 * 4096


def test_comm_label_is_the_name_when_known():
    s, _, _, reg = stage()
    out = closed(s)
    s.consume(PeerBatch(peers(1, comm=0xC0), "h0", "j", {0xC0: "world"}))
    s.consume(PeerBatch(peers(1, comm=0xC1), "h0", "j"))
    s.shutdown()
    assert sorted(out[0][1]["comm"].to_list()) == ["00000000000000c1", "world"]
    assert 'comm="world"' in generate_latest(reg).decode()


def test_idle_flush_closes_open_windows():
    s, _, clock, _ = stage()
    out = closed(s)
    s.consume(PeerBatch(peers(2), "h0", "j"))
    s.tick(clock.t + 2.9)
    assert out == []
    s.tick(clock.t + 3.0)
    assert len(out) == 1


def test_parquet_table_per_job(tmp_path):
    s, _, clock, _ = stage(tmp_path, parquet_flush_s=10.0)
    s.consume(PeerBatch(peers(3), "h0", "job/a"))
    s.consume(PeerBatch(peers(2, rank=1), "h1", "b"))
    s.windows.shutdown()  # windows closed, rows buffered
    assert not (tmp_path / "peers").exists()
    s.tick(clock.t + 10.0)
    files = sorted(p for p in (tmp_path / "peers").rglob("*") if p.is_file())
    assert [f.parent.name for f in files] == ["job_id=b", "job_id=job_a"]
    assert not any(f.name.endswith(".tmp") for f in files)
    df = pl.read_parquet(files[1])
    assert df["job_id"].to_list() == ["job/a"] and df["records"].to_list() == [3]
    assert set(df.columns) >= {"window_start_s", "host", "comm_hash", "rank", "peer", "direction", "bytes",
                               "state0_s", "state1_s", "state2_s"}


def test_parquet_write_failure_is_counted(tmp_path):
    s, m, _, _ = stage(tmp_path)
    (tmp_path / "peers").write_text("not a directory")
    s.consume(PeerBatch(peers(3), "h0", "j"))
    s.shutdown()
    assert m.dropped["parquet_write_failed"] == 3
    assert os.path.isfile(tmp_path / "peers")


def test_peer_windows_alone_need_no_sink():
    w = PeerWindows(PeerConfig(), WIN, metrics=SelfMetrics(), on_window=[], wall_clock=lambda: T0 * 1e-9)
    w.consume(PeerBatch(peers(1), "h", "j"))
    w.shutdown()
