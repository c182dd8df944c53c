"""Parquet history writer cost: CPU-seconds per million records, this exporter vs the previous one.

Feeds the same seeded batches the end-to-end benchmark produces (8 ranks, 512-record batches as
the stream receiver delivers them) as fast as the exporter takes them, then shuts it down (all
part files finished). Baseline, in the same process: the previous in-process exporter (one Arrow
table per batch, concatenated and written with pyarrow defaults when a partition is flushed),
kept below as ``LegacyExporter``.

CPU is counted per side: ``consumer`` = the pipeline's parquet queue thread (the only part that
holds the collector's GIL), ``writer`` = the writer child process (``getrusage(RUSAGE_CHILDREN)``
after it is reaped; 0 in thread mode, where it is part of ``consumer``). Wall-clock throughput
is printed too but depends on the machine's load (printed). Last line: machine-readable key=value.
"""
from __future__ import annotations

import argparse
import glob
import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402


class LegacyExporter:
    """The exporter before this change (dynamiccl/collector/exporters/parquet.py at 5c2275a), trimmed to
    its work: per batch ``to_table``; per flush ``concat_tables`` + ``unify_dictionaries`` +
    ``write_table``."""

    def __init__(self, directory: str, *, flush_rows: int, compression: str):
        self.directory, self.flush_rows, self.compression = directory, flush_rows, compression
        self.parts: dict = {}
        self.rows_written = 0
        self.n = 0

    def _table(self, batch):
        import pyarrow as pa
        from dynamiccl.collector.exporters.parquet import RECORD_COLUMNS
        ev = batch.events
        n = len(ev)
        cols = {name: pa.array(np.ascontiguousarray(ev[name])) for name in RECORD_COLUMNS}
        zeros = pa.array(np.zeros(n, np.int32))
        for col, v in (("host", batch.host), ("job_id", batch.job_id)):
            cols[col] = pa.DictionaryArray.from_arrays(zeros, pa.array([v], pa.string()))
        ch = ev["comm_hash"]
        if n and (ch == ch[0]).all():
            cols["comm_name"] = pa.DictionaryArray.from_arrays(
                zeros, pa.array([batch.comm_names.get(int(ch[0]), "")], pa.string()))
        else:
            uniq, inv = np.unique(ch, return_inverse=True)
            cols["comm_name"] = pa.DictionaryArray.from_arrays(
                pa.array(inv.astype(np.int32)), pa.array([batch.comm_names.get(int(c), "") for c in uniq.tolist()]))
        return pa.table(cols)

    def consume(self, batch) -> None:
        from dynamiccl.collector.records import event_time_ns
        table = self._table(batch)
        hours = event_time_ns(batch.events) // (3600 * 10**9)
        key = (batch.job_id, int(hours.min()))  # the benchmark's data stays within one hour
        part = self.parts.setdefault(key, [])
        part.append(table)
        if sum(t.num_rows for t in part) >= self.flush_rows:
            self._write(key)

    def _write(self, key) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        tables = self.parts.pop(key)
        table = pa.concat_tables(tables).unify_dictionaries()
        self.n += 1
        pq.write_table(table, os.path.join(self.directory, f"legacy-{self.n}.parquet"),
                       compression=None if self.compression == "none" else self.compression)
        self.rows_written += table.num_rows

    def shutdown(self) -> None:
        for key in list(self.parts):
            self._write(key)


def make_batches(records: int, ranks: int, frame: int, seed: int):
    from dynamiccl.collector.component import RecordBatch
    from dynamiccl.harness.collector_testing import advance, synthetic_events
    tick = 0.01
    per_tick = 5000  # 500,000 records/s in 10 ms ticks, as collector_e2e.py sends them
    inst = per_tick // ranks
    start = 1_700_000_000 * 10**9 // (3600 * 10**9) * 3600 * 10**9 + 10**9  # stays within one hour
    template = synthetic_events(inst, nranks=ranks, seed=seed, rate_per_s=inst / tick, start_ns=start)
    masks = [template["rank"] == r for r in range(ranks)]
    names = {int(h): f"comm{i}" for i, h in enumerate(np.unique(template["comm_hash"]).tolist())}
    out, n, step = [], 0, 0
    while n < records:
        ev = advance(template, step, period_ns=int(tick * 1e9), instances=inst)
        for r in range(ranks):
            mine = ev[masks[r]]
            for i in range(0, len(mine), frame):
                out.append(RecordBatch(mine[i:i + frame].copy(), f"node{r // 4}", "bench", names))
                n += len(out[-1])
        step += 1
    return out, n


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def proc_cpu(pid: int | None) -> float:
    """CPU seconds used so far by a live process (utime + stime from /proc)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(exp, batches) -> tuple[float, float, float, float]:
    """(consumer cpu s, writer-child cpu s, wall s, writer start-up cpu s) for feeding every batch
    and shutting down. The first batch is fed and acknowledged first, so the writer's start-up
    (importing numpy and pyarrow: a fixed cost, not per record) is measured apart."""
    k0 = children_cpu()
    startup = 0.0
    if hasattr(exp, "sync"):
        exp.consume(batches[0])
        exp._send_slab()
        exp.sync()
        startup = proc_cpu(exp.writer_pid)
        batches = batches[1:]
    c0, w0 = time.process_time(), time.perf_counter()
    for b in batches:
        exp.consume(b)
    exp.shutdown()
    return time.process_time() - c0, children_cpu() - k0 - startup, time.perf_counter() - w0, startup


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=4_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--frame", type=int, default=512, help="records per batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compression", default=None, help="default: the collector's")
    ap.add_argument("--writer", default=None, choices=("process", "thread"), help="default: the collector's")
    args = ap.parse_args()
    from dynamiccl.collector.config import ParquetConfig
    from dynamiccl.collector.exporters.parquet import ParquetExporter

    defaults = ParquetConfig()
    compression = args.compression or defaults.compression
    batches, n = make_batches(args.records, args.ranks, args.frame, args.seed)
    m = n / 1e6
    load = os.getloadavg()
    d = tempfile.mkdtemp(prefix="dcpq")
    try:
        legacy = LegacyExporter(os.path.join(d, "legacy"), flush_rows=defaults.flush_rows, compression=compression)
        os.makedirs(legacy.directory)
        lc, _, lw, _ = run(legacy, batches)
        legacy_bytes = sum(os.path.getsize(f) for f in glob.glob(os.path.join(legacy.directory, "*")))
        cfg = ParquetConfig(directory=os.path.join(d, "new"), compression=compression,
                            writer=args.writer or defaults.writer)
        exp = ParquetExporter(cfg)
        exp.start()
        kind = exp.writer_kind
        nc, nk, nw, startup = run(exp, batches)
        new_bytes = sum(os.path.getsize(f) for f in glob.glob(os.path.join(cfg.directory, "**", "*.parquet"),
                                                                recursive=True))
        rows = exp.metrics.parquet_rows
    finally:
        shutil.rmtree(d, ignore_errors=True)
    legacy_cpu = lc / m
    new_cons, new_writer = nc / m, nk / m
    new_cpu = new_cons + new_writer
    print(f"{n} records in {len(batches)} batches, compression={compression}, writer={kind}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"baseline (previous exporter, in process): {legacy_cpu:.3f} CPU-s per M records, "
          f"{n / lw:.0f} rec/s wall, {legacy_bytes / n:.1f} B/record")
    print(f"this exporter: consumer thread {new_cons:.3f} + writer {new_writer:.3f} = {new_cpu:.3f} CPU-s per M "
          f"records, {n / nw:.0f} rec/s wall, {new_bytes / n:.1f} B/record, rows written {rows}; "
          f"writer start-up {startup:.2f} CPU-s once")
    print(f"CPU ratio new/baseline: total {new_cpu / legacy_cpu:.3f}, on the collector's GIL "
          f"{new_cons / legacy_cpu:.3f}")
    print(f"records={n} compression={compression} writer={kind} baseline_cpu_s_per_m={legacy_cpu:.3f} "
          f"consumer_cpu_s_per_m={new_cons:.3f} writer_cpu_s_per_m={new_writer:.3f} total_cpu_s_per_m={new_cpu:.3f} "
          f"ratio_total={new_cpu / legacy_cpu:.3f} ratio_gil={new_cons / legacy_cpu:.3f} "
          f"rows_written={rows} lost={n - rows} load1={load[0]:.2f}")
    return 0 if rows == n else 1


if __name__ == "__main__":
    sys.exit(main())
