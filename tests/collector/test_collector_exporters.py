"""Parquet history (atomic parts, replay round trip), /metrics over HTTP, feature stream sockets."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import urllib.request

import numpy as np
import polars as pl
import pytest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import ParquetConfig
from dynamiccl.collector.exporters.parquet import RECORD_COLUMNS, ParquetExporter
from dynamiccl.collector.features import subscribe
from dynamiccl.collector.metrics import BY_NAME, METRICS, SelfMetrics
from dynamiccl.collector.pipeline import Pipeline
from dynamiccl.collector.receivers.replay import read_batches
from dynamiccl.harness.collector_testing import SinkConsumer, synthetic_events

from collector_helpers import quiet_config, sock_path, wait_until  # noqa: F401 (fixtures)

HOUR = 3600 * 10**9


def test_parquet_parts_are_atomic_partitioned_and_bounded(tmp_path):
    now = [0.0]
    m = SelfMetrics()
    exp = ParquetExporter(ParquetConfig(directory=str(tmp_path), flush_rows=1000, flush_interval_s=5,
                                        max_buffered_rows=1500), metrics=m, clock=lambda: now[0])
    exp.start()
    t0 = 1_700_000_000 * 10**9 // HOUR * HOUR  # an hour boundary
    ev = synthetic_events(300, nranks=2, start_ns=t0 + HOUR - 10**8, rate_per_s=1000)  # spans 2 hours
    exp.consume(RecordBatch(ev, "h1", "job/../1", {}))
    assert m.parquet_files == 0  # 600 rows: below flush_rows, not old enough
    now[0] = 6.0
    exp.tick()
    assert exp.sync(30)  # the writer (a child process) has finished what it was given
    files = sorted(glob.glob(str(tmp_path / "**" / "*.parquet"), recursive=True))
    assert len(files) == 2 and m.parquet_rows == 600
    assert all(re.search(r"job_id=job_.._1/date=2023-11-1\d/hour=\d\d/part-\d+-\d+-\d+\.parquet$", f) for f in files)
    assert not glob.glob(str(tmp_path / "**" / "*.tmp.*"), recursive=True)
    # flush by size and by the memory bound
    exp.consume(RecordBatch(synthetic_events(600, nranks=2, start_ns=t0 + 10**9), "h1", "j2", {}))
    assert exp.sync(30)
    assert m.parquet_files == 3  # 1200 rows >= flush_rows
    exp.shutdown()
    table = pl.read_parquet(files[0])
    assert set(RECORD_COLUMNS) | {"host", "job_id", "comm_name"} == set(table.columns)
    assert table["job_id"].cast(pl.String).unique().to_list() == ["job/../1"]


def test_parquet_round_trip_through_replay(tmp_path, quiet_config):
    cfg = quiet_config.replace(parquet={"directory": str(tmp_path / "pq")})
    ev = synthetic_events(500, nranks=4, seed=3)
    names = {0x1111_2222_3333_4444: "world"}
    with Pipeline(cfg) as p:
        live = p.subscribe()
        for host, rank_sel in (("hA", [0, 1]), ("hB", [2, 3])):
            p.source.push(ev[np.isin(ev["rank"], rank_sel)], host=host, job_id="jobR", comm_names=names)
    live_wf = live.get(timeout=5)
    got = [b for f in sorted(glob.glob(str(tmp_path / "pq" / "**" / "*.parquet"), recursive=True))
           for b in read_batches(f)]
    back = np.concatenate([b.events for b in got])
    order = np.lexsort((back["rank"], back["record_seq"]))
    ref = np.lexsort((ev["rank"], ev["record_seq"]))
    for name in RECORD_COLUMNS:
        np.testing.assert_array_equal(back[name][order], ev[name][ref], err_msg=name)
    assert {b.host for b in got} == {"hA", "hB"} and {b.job_id for b in got} == {"jobR"}
    assert got[0].comm_names == names
    # the replay receiver feeds the pipeline and reproduces the live window
    cfg2 = quiet_config.replace(replay=(str(tmp_path / "pq"),))
    with Pipeline(cfg2) as p2:
        sub = p2.subscribe()
        assert p2.replay.done.wait(10)
    wf = sub.get(timeout=5)
    assert wf.keys.sort(wf.keys.columns).equals(live_wf.keys.sort(live_wf.keys.columns))
    assert wf.ranks.sort(["comm_hash", "rank"]).equals(live_wf.ranks.sort(["comm_hash", "rank"]))


@pytest.fixture
def served(quiet_config, tmp_path):
    import tempfile
    fpath = os.path.join(tempfile.mkdtemp(prefix="dcf"), "f.sock")
    cfg = quiet_config.replace(prometheus={"address": "127.0.0.1:0"},
                               features={"address": f"unix:{fpath}", "queue_max_windows": 2},
                               window={"idle_flush_s": 0.2})
    p = Pipeline(cfg).start()
    yield p
    p.shutdown()


def _scrape(p) -> str:
    with urllib.request.urlopen(f"http://{p.addresses['metrics']}/metrics", timeout=5) as r:
        return r.read().decode()


def _family_names(text: str) -> set[str]:
    return {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")}


def test_metrics_scrape_names_match_declarations(served):
    text = _scrape(served)
    assert "dynamiccl_collector_records_received_total 0.0" in text
    for reason in ("late", "queue_full", "invalid"):
        assert f'dynamiccl_collector_records_dropped_total{{reason="{reason}"}} 0.0' in text
    ev = synthetic_events(200, nranks=4, straggler_rank=1)
    served.source.push(ev, host="h0", job_id="j0", comm_names={0x1111_2222_3333_4444: "world"})
    assert wait_until(lambda: served.metrics.windows_emitted >= 1)
    # the collective families are rendered once per window, off the scrape: a scrape during that
    # render serves the previous window's text
    assert wait_until(lambda: "dynamiccl_collective_duration_seconds_count" in _scrape(served))
    text = _scrape(served)
    declared = {m.name: m for m in METRICS}
    names = {n for n in _family_names(text) if not n.startswith("process_")}   # prometheus_client's own
    assert names == set(declared), names ^ set(declared)
    for line in text.splitlines():
        if line.startswith("#") or not line or line.startswith("process_"):
            continue
        labels = set(re.findall(r'(\w+)="', line))
        base = re.match(r"[a-z_:]+", line).group(0)
        fam = next(n for n in sorted(declared, key=len, reverse=True) if base.startswith(n))
        assert labels - {"le"} == set(declared[fam].labels), line
        assert not labels & {"job", "instance"}
    assert 'dynamiccl_collector_records_received_total 800.0' in text
    hist_count = sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                     if ln.startswith("dynamiccl_collective_duration_seconds_count"))
    timed = int((ev["timing_source"] != 0).sum())
    assert hist_count == timed
    assert 'le="1e-05"' in text and 'le="10.48576"' in text
    assert "rank=" not in "".join(ln for ln in text.splitlines() if "duration_seconds" in ln)
    assert re.search(r'dynamiccl_bus_bandwidth_bytes_per_second\{.*comm="world"', text)


def test_promtool_check_metrics(served):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    served.source.push(synthetic_events(50, nranks=2), host="h0", job_id="j0")
    assert wait_until(lambda: served.metrics.windows_emitted >= 1)
    out = subprocess.run([promtool, "check", "metrics"], input=_scrape(served), text=True,
                         capture_output=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_feature_stream_over_a_socket_and_slow_subscriber(served):
    stream = subscribe(served.addresses["features"], timeout=10)
    assert wait_until(lambda: served.metrics.feature_subscribers == 1)
    slow = served.subscribe()  # in process, never read: queue of 2
    for i in range(4):
        ev = synthetic_events(40, nranks=2, seed=i, start_ns=10**18 + i * 10 * 10**9)
        served.source.push(ev, host="h", job_id="j")
        assert wait_until(lambda: served.metrics.windows_emitted == i + 1)
    got = [next(stream) for _ in range(4)]
    assert [w.window_start for w in got] == [1e9 + 10 * i for i in range(4)]
    assert all(w.keys["records"].sum() == 80 for w in got)
    assert got[0].ranks.schema["comm_hash"] == pl.UInt64
    assert got[0].counters["records"] == 80
    assert slow.dropped == 2 and served.metrics.feature_windows_dropped == 2
    assert [slow.get(0).window_start, slow.get(0).window_start] == [1e9 + 20, 1e9 + 30]
    stream.close()


def test_feature_stream_refuses_beyond_max_subscribers_and_evicts_a_stalled_client(tmp_path):
    import socket

    from dynamiccl.collector.config import FeaturesConfig
    from dynamiccl.collector.exporters.feature_stream import FeatureStream
    from dynamiccl.collector.metrics import SelfMetrics
    from collector_helpers import wait_until

    m = SelfMetrics()
    fs = FeatureStream(FeaturesConfig(address="tcp:127.0.0.1:0", max_subscribers=2, stall_timeout_s=0.2),
                       metrics=m)
    fs.start()
    host, port = fs.address[4:].rsplit(":", 1)
    try:
        a, b, c = (socket.create_connection((host, int(port))) for _ in range(3))
        assert wait_until(lambda: m.refusals["subscriber_limit"] == 1)
        server = fs._server
        with server._lock:  # the first client has left a window unread for a while
            first = next(iter(server._clients.values()))
            first.backlog_since = 0.0
        d = socket.create_connection((host, int(port)))
        assert wait_until(lambda: m.refusals["subscriber_stalled"] == 1 and server.n_clients == 2)
        for s in (a, b, c, d):
            s.close()
    finally:
        fs.shutdown()
