"""A seeded synthetic recorded run, written through the collector's own parquet exporter.

Used by ``benchmarks/report_scale.py`` (100 M records) and the tests. The job looks like a small
tensor/data-parallel training job: 16 ranks on 2 hosts, communicators ``world0`` (16 ranks,
small AllReduce), ``tp0``/``tp1`` (8 ranks each, AllReduce / AllGather / ReduceScatter of
1–64 MiB) and ``dp0``…``dp7`` (2 ranks across the hosts, 16–64 MiB AllReduce). Injected
regimes (fractions of the run): inter-node bandwidth drop (``dp*`` 2.5× slower) from 30 % to
45 %, a tuner config change (version 1; ``tp*`` 1–4 MiB AllReduce switch to LL128) at 55 %,
a straggler (global rank 5, 2 ms late everywhere) from 70 % to 80 %. ``truth.jsonl`` (the
simulator's ground-truth format) is written next to the parquet directory.

>>> import tempfile, polars as pl
>>> with tempfile.TemporaryDirectory() as d:
...     info = write_run(d + "/parquet", records=50_000, seed=1)
...     info["records"], pl.scan_parquet(d + "/parquet/**/*.parquet").select(pl.len()).collect().item()
(50000, 50000)
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynamiccl.contracts.atomic import atomic_write

__all__ = ["write_run", "COMMS", "START_NS"]

START_NS = 1_767_225_600 * 10**9  # 2026-01-01 00:00:00 UTC
JOB_ID = "synthetic-job"
N_RANKS = 16
RANKS_PER_HOST = 8


@dataclass(frozen=True)
class _Comm:
    name: str
    comm_hash: int
    global_ranks: tuple[int, ...]
    funcs: tuple[str, ...]
    log2_bytes: tuple[int, int]
    weight: float  # share of instances


def _comms() -> tuple[_Comm, ...]:
    out = [_Comm("world0", 0x5EED_0000_0000_0001, tuple(range(16)), ("AllReduce",), (3, 10), 0.06)]
    for t in range(2):
        out.append(_Comm(f"tp{t}", 0x5EED_0000_0000_0100 + t, tuple(range(8 * t, 8 * t + 8)),
                         ("AllReduce", "AllGather", "ReduceScatter"), (20, 26), 0.35))
    for d in range(8):
        out.append(_Comm(f"dp{d}", 0x5EED_0000_0001_0000 + d, (d, d + 8), ("AllReduce",), (24, 26), 0.03))
    return tuple(out)


COMMS = _comms()
BW_DROP = (0.30, 0.45, 2.5)
CONFIG_CHANGE = 0.55
STRAGGLER = (0.70, 0.80, 5, 2e-3)


def _fix_config(ev: np.ndarray, changed: np.ndarray) -> None:
    """Deterministic algo/proto per size like NCCL's tuner; after the config change (version 1),
    1–4 MiB AllReduce on the tp comms uses LL128."""
    b = ev["bytes"]
    ev["algo"] = np.where(b >= 65536, 1, 0)  # RING / TREE
    ev["proto"] = np.where(b >= 1 << 20, 2, np.where(b >= 65536, 1, 0))  # SIMPLE / LL128 / LL
    ev["tuner_config_version"] = changed.astype(np.uint32)
    m = changed & (ev["func"] == 1) & (b >= 1 << 20) & (b < 1 << 22) & (ev["nranks"] == 8)
    ev["proto"][m] = 1


def _chunk(rng_seed: int, t0_ns: int, span_s: float, n_records: int, run: tuple[int, float],
           seq_base: dict[int, int]) -> np.ndarray:
    """About ``n_records`` records with instances spread over [t0, t0 + span); regimes are applied
    per instance from its time as a fraction of the run (``run`` = (start_ns, duration_s))."""
    from dynamiccl.harness.collector_testing import synthetic_events

    parts = []
    run_start, run_s = run
    for i, c in enumerate(COMMS):
        nr = len(c.global_ranks)
        n_inst = max(1, int(np.ceil(n_records * 1.01 * c.weight / nr)))
        ev = synthetic_events(n_inst, nranks=nr, nnodes=1 + (max(c.global_ranks) >= RANKS_PER_HOST),
                              seed=rng_seed * 1000 + i, start_ns=t0_ns + i * 37_000,
                              rate_per_s=n_inst / span_s, comm_hashes=(c.comm_hash,), funcs=c.funcs,
                              log2_bytes=c.log2_bytes, untimed_fraction=0.01, cpu_timed_fraction=0.0, seq_base=0)
        ev["seq_number"] += np.uint64(seq_base.get(c.comm_hash, 0))
        seq_base[c.comm_hash] = seq_base.get(c.comm_hash, 0) + n_inst
        g = np.asarray(c.global_ranks, np.int64)[ev["rank"]]
        ev["pid"] = 1000 + g
        # instance time as a fraction of the run (records of an instance are consecutive)
        t_inst = ev["enqueue_ns"].reshape(n_inst, nr)[:, 0].astype(np.int64)
        frac = np.repeat((t_inst - run_start) / (run_s * 1e9), nr)
        timed = ev["gpu_end_ns"] > 0
        if c.name.startswith("dp"):
            m = timed & (frac >= BW_DROP[0]) & (frac < BW_DROP[1])
            d = ((ev["gpu_end_ns"][m] - ev["gpu_start_ns"][m]).astype(np.float64) * (BW_DROP[2] - 1)).astype(np.uint64)
            ev["gpu_end_ns"][m] += d
            ev["cpu_end_ns"][m] += d
        if STRAGGLER[2] in c.global_ranks:
            # the straggler starts late; everyone else waits for it, so every rank ends later
            late = np.uint64(int(STRAGGLER[3] * 1e9))
            m = timed & (frac >= STRAGGLER[0]) & (frac < STRAGGLER[1])
            ev["gpu_end_ns"][m] += late
            ev["cpu_end_ns"][m] += late
            s = m & (g == STRAGGLER[2])
            ev["gpu_start_ns"][s] += late
            ev["enqueue_ns"][s] += late
        _fix_config(ev, frac >= CONFIG_CHANGE)
        parts.append(ev)
    return np.concatenate(parts)


def truth_rows(duration_s: float, start_ns: int = START_NS) -> list[dict]:
    """Ground truth of the injected regimes, in the simulator's ``truth.jsonl`` format."""
    def row(i, kind, a, b, mag, where, regime):
        return {"id": i, "kind": kind, "t_start": a * duration_s, "t_end": b * duration_s,
                "t_start_ns": start_ns + int(a * duration_s * 1e9), "t_end_ns": start_ns + int(b * duration_s * 1e9),
                "magnitude": mag, "where": where, "benign": False, "regime": regime, "params": {}}
    return [row(0, "bw_drop", BW_DROP[0], BW_DROP[1], 1 / BW_DROP[2], {"nodes": "all"}, "R1"),
            row(1, "recovery", BW_DROP[1], BW_DROP[1], 0.0, {}, "baseline"),
            row(2, "straggler", STRAGGLER[0], STRAGGLER[1], STRAGGLER[3] * 1e6, {"ranks": [STRAGGLER[2]]}, "R5")]


def write_run(directory: str | os.PathLike, *, records: int, seed: int = 0, rate_per_s: float = 10_000.0,
              chunk_records: int = 1_000_000, start_ns: int = START_NS, compression: str = "zstd",
              flush_rows: int = 1_000_000, batch_records: int = 8192, truth: bool = True, progress=None) -> dict:
    """Write about ``records`` records (exactly, after trimming) of the synthetic job into
    ``directory`` with :class:`dynamiccl.collector.exporters.parquet.ParquetExporter`. Event time spans
    ``records / rate_per_s`` seconds. Returns a summary dict."""
    from dynamiccl.collector.component import RecordBatch
    from dynamiccl.collector.config import ParquetConfig
    from dynamiccl.collector.exporters.parquet import ParquetExporter

    directory = Path(directory)
    duration_s = records / rate_per_s
    n_chunks = max(1, -(-records // chunk_records))
    span = duration_s / n_chunks
    exp = ParquetExporter(ParquetConfig(directory=str(directory), flush_rows=flush_rows,
                                        max_buffered_rows=max(flush_rows * 2, chunk_records * 2),
                                        compression=compression), clock=lambda: 0.0)
    exp.start()
    names = {c.comm_hash: c.name for c in COMMS}
    seq_base: dict[int, int] = {}
    written = 0
    for k in range(n_chunks):
        want = min(chunk_records, records - written)
        ev = _chunk(seed * 100_003 + k, start_ns + int(k * span * 1e9), span, want,
                    (start_ns, duration_s), seq_base)
        ev = ev[:want]  # the per-comm rounding can overshoot by a few records
        # arrive as the collector sees them: small batches per host, interleaved in event time
        ev = ev[np.argsort(ev["enqueue_ns"], kind="stable")]
        host = ev["pid"] - 1000 >= RANKS_PER_HOST
        for lo in range(0, len(ev), batch_records):
            part, hpart = ev[lo:lo + batch_records], host[lo:lo + batch_records]
            for h in (0, 1):
                m = hpart == h
                if m.any():
                    exp.consume(RecordBatch(part[m], f"node{h}", JOB_ID, names))
        written += len(ev)
        if progress:
            progress(written)
    exp.shutdown()
    if truth:
        path = directory.parent / "truth.jsonl"
        atomic_write(path, "".join(json.dumps(row) + "\n" for row in truth_rows(duration_s, start_ns)))
    return {"records": written, "duration_s": duration_s, "start_ns": start_ns, "job_id": JOB_ID,
            "files": exp.metrics.parquet_files}
