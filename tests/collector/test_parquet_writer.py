"""Parquet history through the writer process: round trip, saturation, shutdown, write errors."""
from __future__ import annotations

import glob
import os
import signal

import numpy as np
import pyarrow.parquet as pq
import pytest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import ParquetConfig, default_config
from dynamiccl.collector.exporters.parquet import RECORD_COLUMNS, ParquetExporter
from dynamiccl.collector.exporters.parquet_writer import SCHEMA
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.pipeline import Pipeline
from dynamiccl.collector.records import event_time_ns
from dynamiccl.harness.collector_testing import synthetic_events

from collector_helpers import quiet_config, wait_until  # noqa: F401 (fixture)

HOUR = 3600 * 10**9
T0 = 1_700_000_000 * 10**9 // HOUR * HOUR


def _files(d) -> list[str]:
    return sorted(glob.glob(os.path.join(str(d), "**", "*.parquet"), recursive=True))


def _tmp_files(d) -> list[str]:
    return glob.glob(os.path.join(str(d), "**", "*.tmp.*"), recursive=True)


def _read(d) -> dict[str, np.ndarray]:
    tables = [pq.read_table(f) for f in _files(d)]
    for t in tables:
        assert t.schema.equals(SCHEMA), t.schema
    cols = {}
    for name in tables[0].column_names:
        cols[name] = np.concatenate([t.column(name).to_numpy() if name in RECORD_COLUMNS
                                     else np.asarray(t.column(name).cast("string").to_pylist(), object)
                                     for t in tables])
    return cols


def _exporter(d, metrics=None, **kw) -> ParquetExporter:
    cfg = ParquetConfig(directory=str(d), **{"row_group_rows": 1000, "max_buffered_rows": 3000, **kw})
    exp = ParquetExporter(cfg, metrics=metrics or SelfMetrics())
    exp.start()
    return exp


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_writer_round_trip_keeps_every_value(tmp_path, writer):
    """Several jobs, hosts, hours and communicators, batches straddling slabs and part files:
    every column of every row comes back exactly, host/job/comm name per row included."""
    rng = np.random.default_rng(7)
    names = {}
    batches = []
    seq = 0
    for i in range(40):
        ev = synthetic_events(int(rng.integers(1, 120)), nranks=4, seed=i,
                              start_ns=T0 + HOUR - 5 * 10**9 + i * 2 * 10**8, rate_per_s=50)  # crosses the hour
        ev["record_seq"] = np.arange(seq, seq + len(ev))  # a unique row id
        ev["count"] = rng.integers(0, 2**63, len(ev), dtype=np.uint64)  # full-width values survive
        seq += len(ev)
        for h in np.unique(ev["comm_hash"]).tolist():
            names.setdefault(h, f"comm-{len(names)}")
        batches.append(RecordBatch(ev, f"host{i % 3}", f"job{i % 2}", names if i % 4 else {}))
    exp = _exporter(tmp_path, writer=writer, flush_rows=2500)
    assert exp.writer_kind == writer
    for b in batches:
        exp.consume(b)
    exp.shutdown()
    assert exp.metrics.parquet_rows == seq and not _tmp_files(tmp_path)
    assert len(_files(tmp_path)) >= 4  # 2 jobs × 2 hours, and flush_rows splits the rest
    got = _read(tmp_path)
    order = np.argsort(got["record_seq"])
    ref = np.concatenate([b.events for b in batches])
    for name in RECORD_COLUMNS:
        np.testing.assert_array_equal(got[name][order], ref[name], err_msg=name)
    hosts = np.concatenate([[b.host] * len(b) for b in batches])
    jobs = np.concatenate([[b.job_id] * len(b) for b in batches])
    assert (got["host"][order] == hosts).all() and (got["job_id"][order] == jobs).all()
    assert (got["comm_name"][order] == np.array([names[h] for h in ref["comm_hash"].tolist()])).all()
    # partitions: job and hour of the event time, as before
    for f in _files(tmp_path):
        t = pq.read_table(f, columns=["job_id", "timing_source", "enqueue_ns", "gpu_start_ns"])
        job = set(t.column("job_id").cast("string").to_pylist())
        hours = set((event_time_ns({c: t.column(c).to_numpy() for c in t.column_names[1:]}) // HOUR).tolist())
        assert len(job) == 1 and len(hours) == 1 and f"job_id={job.pop()}" in f


def test_shutdown_flushes_everything_and_stops_the_writer(tmp_path):
    exp = _exporter(tmp_path, flush_rows=10**6, flush_interval_s=3600)
    pid = exp.writer_pid
    ev = synthetic_events(150, nranks=2, start_ns=T0 + 10**9)  # 300 rows: below every threshold
    exp.consume(RecordBatch(ev, "h", "j", {}))
    assert not _files(tmp_path)  # nothing is due yet
    exp.shutdown()
    assert len(_files(tmp_path)) == 1 and exp.metrics.parquet_rows == 300
    assert exp.writer_pid is None and not os.path.exists(f"/proc/{pid}")  # exited and reaped
    exp.shutdown()  # idempotent


def test_saturated_writer_drops_and_counts_never_blocks(tmp_path, quiet_config):
    """The writer is stopped (SIGSTOP): the slabs fill, the exporter waits for one, the parquet
    queue fills, and every further batch is dropped and counted, while ingest stays non-blocking
    and aggregation gets everything."""
    cfg = quiet_config.replace(parquet={"directory": str(tmp_path), "row_group_rows": 500,
                                        "max_buffered_rows": 1000, "queue_max_records": 1000})
    p = Pipeline(cfg).start()
    exp = p.parquet
    pid = exp.writer_pid
    batch = lambda i: synthetic_events(125, nranks=4, seed=i, start_ns=T0 + 10**9 + i * 10**8)  # 500 rows
    os.kill(pid, signal.SIGSTOP)
    q = p.queues["parquet"]
    try:
        for i in range(2):  # each fills a slab, which goes to the (stopped) writer
            p.source.push(batch(i), host="h", job_id="j")
            assert wait_until(lambda: q.pending == 0, 30)
        p.source.push(batch(2), host="h", job_id="j")  # no slab comes back: the exporter waits
        assert wait_until(lambda: exp.waiting_for_slab and q.pending == 500, 30)
        p.source.push(batch(3), host="h", job_id="j")  # queued: 1000 of 1000
        for i in range(4, 9):  # dropped at once
            p.source.push(batch(i), host="h", job_id="j")
        assert p.metrics.dropped["parquet_queue_full"] == 2500 and q.pending == 1000
    finally:
        os.kill(pid, signal.SIGCONT)
    p.shutdown()
    assert p.metrics.parquet_rows == 2000 and p.metrics.dropped["parquet_queue_full"] == 2500
    assert p.metrics.aggregated == 4500 and p.metrics.parquet_writer_deaths == 0
    assert len(_read(tmp_path)["rank"]) == 2000


def test_write_error_counts_the_file_and_its_rows(tmp_path):
    (tmp_path / "job_id=bad").write_text("a file where the partition directory should be")
    m = SelfMetrics()
    exp = _exporter(tmp_path, metrics=m)
    exp.consume(RecordBatch(synthetic_events(100, nranks=2, start_ns=T0 + 10**9), "h", "bad", {}))
    exp.consume(RecordBatch(synthetic_events(50, nranks=2, start_ns=T0 + 10**9), "h", "good", {}))
    exp.shutdown()
    assert m.parquet_errors == 1 and m.dropped["parquet_write_failed"] == 200
    assert m.parquet_files == 1 and m.parquet_rows == 100
    assert m.parquet_writer_deaths == 0 and not _tmp_files(tmp_path)


def test_config_rejects_bad_writer_settings():
    with pytest.raises(ValueError, match="parquet.writer must be process or thread"):
        ParquetConfig(writer="fork").validate()
    with pytest.raises(ValueError, match="row_group_rows must be > 0"):
        ParquetConfig(row_group_rows=0).validate()
    with pytest.raises(ValueError, match="parquet.row_group_rows must be an integer"):
        ParquetConfig(row_group_rows=1.5).validate()
    assert default_config().parquet.writer == "process"
