"""Reduce a recorded run (parquet part files) to the small tables the report draws.

Two polars lazy scans over the part files, each run by polars' streaming engine (memory bounded
by its morsels and by the number of groups, not by the number of records):

1. **streams** — every valid record, grouped by (time bin, communicator, collective, algorithm,
   protocol, size bucket, tuner config version, nranks, latency bin). Sums, minima and maxima
   only, so partial results of several schema groups merge exactly. Everything about bandwidth,
   latency, the latency heatmap, config changes and the collective mix comes from it.
2. **instances** — a systematic sample of whole collective instances (every record whose
   ``seq_number`` hashes into 1 of ``k`` buckets; all ranks of an instance share it), at most
   ``sample_records`` records, so ``k`` = 1 (everything) for runs up to that size. From it:
   the cross-rank spread (max − min duration over the ranks of one instance) and, per process,
   the relative latency (own duration / the instance's median) and the arrival lag (own
   start − the instance's first start) of every rank of every communicator, which single out
   straggler ranks.

Definitions follow the collector (``dynamiccl/collector/records.py``, docs/architecture.md): event time =
``gpu_start_ns`` for KERNEL_GPU records else ``enqueue_ns``; duration = GPU end − start
(KERNEL_GPU) or CPU end − enqueue (KERNEL_CPU), none otherwise; size bucket = floor(log2(bytes));
bus bandwidth of a set of records = Σ(traffic × busbw factor) / Σ duration over the timed ones
(the nccl-tests definition applied to the mean duration).

>>> import tempfile
>>> from dynamiccl.harness.synthetic_run import write_run
>>> with tempfile.TemporaryDirectory() as d:
...     _ = write_run(d + "/parquet", records=40_000, seed=2)
...     s = summarise(d + "/parquet")
>>> s.records, s.sample_k, int(s.streams["n"].sum()), s.bin_s
(40000, 1, 40000, 1)
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from dynamiccl.collector.wire_format import ALGOS, FUNCS, PROTOS
from dynamiccl.contracts.collectives import BUSBW_ALLREDUCE, BUSBW_N_MINUS_1, COLLECTIVES

from dynamiccl.report.inventory import OPTIONAL, Inventory, PartFile, take_inventory

__all__ = ["ScanConfig", "RunSummary", "summarise", "NICE_BINS_S", "func_name", "algo_name", "proto_name"]

log = logging.getLogger(__name__)

MAX_BINS = 20_000  # time bins per report (plots stay responsive); the packed key allows 2^20
NICE_BINS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
_U = pl.UInt64


def func_name(code: int) -> str:
    return FUNCS[code] if 0 <= code < len(FUNCS) else f"func{code}"


def algo_name(code: int) -> str:
    return ALGOS[code] if 0 <= code < len(ALGOS) else "UNKNOWN"


def proto_name(code: int) -> str:
    return PROTOS[code] if 0 <= code < len(PROTOS) else "UNKNOWN"


@dataclass(frozen=True)
class ScanConfig:
    """How to reduce a run. ``bin_s=None`` picks a round bin giving about ``target_bins`` bins."""
    bin_s: float | None = None
    target_bins: int = 400
    sample_records: int = 1_000_000
    lat_bins_per_decade: int = 10
    sample_seed: int = 0

    def validate(self) -> "ScanConfig":
        if self.bin_s is not None and not (isinstance(self.bin_s, (int, float)) and self.bin_s >= 0.001):
            raise ValueError(f"bin_s must be >= 0.001 s, got {self.bin_s!r}")
        for name in ("target_bins", "sample_records", "lat_bins_per_decade"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.lat_bins_per_decade > 20:
            raise ValueError("lat_bins_per_decade must be <= 20")
        return self


@dataclass
class RunSummary:
    directory: str
    inventory: Inventory
    bin_s: float
    records: int = 0             # valid records reduced
    invalid: int = 0             # rows that no plugin could produce (bad enum codes, rank ≥ nranks)
    sample_k: int = 1            # 1 in k instances sampled for spread / per-rank tables
    streams: pl.DataFrame | None = None
    spread: pl.DataFrame | None = None
    ranks: pl.DataFrame | None = None     # per (t_bin, job, comm, rank): relative latency, arrival lag
    rank_ids: pl.DataFrame | None = None  # per (job, comm, rank): comm_name, nranks, host, pid
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.streams is None or self.streams.height == 0

    @property
    def t_range_s(self) -> tuple[float, float]:
        tb = self.streams["t_bin"]
        return float(tb.min()) * self.bin_s, (float(tb.max()) + 1) * self.bin_s


# ---------------------------------------------------------------------------------------------
_DEFAULT_TYPES = {"kind": pl.UInt8, "algo": pl.UInt8, "proto": pl.UInt8, "cpu_end_ns": pl.UInt64,
                  "tuner_config_version": pl.UInt32, "pid": pl.UInt32, "n_channels": pl.UInt8, "nnodes": pl.Int32}


def _canonical(f: PartFile) -> list[pl.Expr]:
    """Expressions giving every file of a schema group the columns the queries use: missing
    optional columns become typed defaults, strings become categoricals. Numeric columns stay in
    their stored type (casting 100 M rows costs time); the queries cast what they emit, so the
    per-group results have one schema."""
    cols = set(f.columns)
    out = [pl.col(c) for c in f.columns if c not in ("host", "comm_name", "job_id")]
    out += [pl.lit(d, _DEFAULT_TYPES[c]).alias(c) for c, d in OPTIONAL.items() if c not in cols]
    for c in ("host", "comm_name"):
        out.append(pl.col(c).cast(pl.Categorical) if c in cols
                   else pl.lit("", pl.String).cast(pl.Categorical).alias(c))
    if "job_id" in cols:
        out.append(pl.col("job_id").cast(pl.Categorical))
    else:
        out.append(pl.lit(f.job_hint, pl.String).cast(pl.Categorical).alias("job_id"))
    return out


def _derived(bin_ns: int, lat_per_decade: int) -> list[pl.Expr]:
    ts = pl.col("timing_source")
    gpu = ts == 1
    start = pl.when(gpu).then(pl.col("gpu_start_ns")).otherwise(pl.col("enqueue_ns")).cast(pl.Int64)
    end = pl.when(gpu).then(pl.col("gpu_end_ns")).otherwise(pl.col("cpu_end_ns")).cast(pl.Int64)
    dur = pl.when(ts.is_in([1, 2]) & (end >= start)).then((end - start).cast(pl.Float64) * 1e-9)
    b = pl.col("bytes")
    sb = pl.when(b > 0).then(b.cast(pl.Float64).log(2).floor().cast(pl.Int64)).otherwise(-1)
    return [start.alias("ev_ns"), dur.alias("dur"), sb.alias("sb")]


def _valid() -> pl.Expr:
    """dynamiccl.collector.records.valid_mask, as a polars expression."""
    a, p = pl.col("algo"), pl.col("proto")
    return (pl.col("kind").is_in([1, 2]) & (pl.col("func") >= 0) & (pl.col("func") < len(FUNCS))
            & ((a < len(ALGOS)) | (a == 255)) & ((p < len(PROTOS)) | (p == 255))
            & (pl.col("timing_source") <= 2) & (pl.col("nranks") > 0) & (pl.col("rank") >= 0)
            & (pl.col("rank") < pl.col("nranks")))


def _records(group: list[PartFile], cfg: ScanConfig, bin_ns: int) -> pl.LazyFrame:
    lf = pl.scan_parquet([f.path for f in group], hive_partitioning=False,
                         extra_columns="ignore", missing_columns="insert")
    return (lf.select(_canonical(group[0])).filter(_valid())
            .with_columns(_derived(bin_ns, cfg.lat_bins_per_decade)))


# The streams key: one u64 per record (with comm_hash the group key), from the top bit:
#   time bin − b0 (20 bits) | latency code (9) | func (4) | algo (3, 7 = unknown) | proto (2, 3 = unknown)
#   | size bucket + 1 (7) | tuner config version mod 2^19 (19)
# latency code: 0 untimed, 1 zero duration, else floor(log10(s) × per_decade) + 256 (clipped to 2..511).
_TB_BITS = 20
_LAT_UNTIMED, _LAT_ZERO, _LAT_OFFSET = 0, 1, 256


def _streams_query(lf: pl.LazyFrame, bin_ns: int, b0: int, lpd: int) -> pl.LazyFrame:
    d = pl.col("dur")
    lat = (pl.when(d.is_null()).then(_LAT_UNTIMED).when(d <= 0).then(_LAT_ZERO)
           .otherwise((d.log10() * lpd).floor().clip(2 - _LAT_OFFSET, 511 - _LAT_OFFSET).cast(pl.Int64) + _LAT_OFFSET))
    tb = pl.col("ev_ns") // bin_ns - b0
    a, p = pl.col("algo"), pl.col("proto")
    key = (tb.cast(_U) * (1 << 44) + lat.cast(_U) * (1 << 35) + pl.col("func").cast(_U) * (1 << 31)
           + pl.when(a == 255).then(7).otherwise(a).cast(_U) * (1 << 28)
           + pl.when(p == 255).then(3).otherwise(p).cast(_U) * (1 << 26)
           + (pl.col("sb") + 1).cast(_U) * (1 << 19) + pl.col("tuner_config_version").cast(_U) % (1 << 19))
    return (lf.filter((tb >= 0) & (tb < (1 << _TB_BITS)))
            .select(pl.col("comm_hash").cast(_U), key.alias("k"), d, pl.col("bytes"), pl.col("job_id"),
                    pl.col("comm_name"), pl.col("nranks"))
            .group_by("comm_hash", "k")
            .agg(pl.len().alias("n"), d.sum().alias("dur_sum"), pl.col("bytes").sum().cast(_U).alias("bytes_sum"),
                 pl.col("job_id").first(), pl.col("comm_name").first(), pl.col("nranks").max().cast(pl.Int32)))


def _unpack_streams(df: pl.DataFrame, b0: int) -> pl.DataFrame:
    """Merge partial results (several schema groups) and decode the packed keys."""
    df = df.group_by("comm_hash", "k").agg(
        pl.col("n", "dur_sum", "bytes_sum").sum(), pl.col("job_id").first(), pl.col("comm_name").first(),
        pl.col("nranks").max())
    # one name per communicator (the first non-empty one seen)
    names = (df.filter(pl.col("comm_name").cast(pl.String) != "").group_by("comm_hash")
             .agg(pl.col("comm_name").cast(pl.String).first().alias("cn")))
    k = pl.col("k")
    lat = (k // (1 << 35) % 512).cast(pl.Int32)
    algo = (k // (1 << 28) % 8).cast(pl.Int32)
    proto = (k // (1 << 26) % 4).cast(pl.Int32)
    timed = lat != _LAT_UNTIMED
    return (df.join(names, on="comm_hash", how="left").select(
        (k // (1 << 44)).cast(pl.Int64) + b0, pl.col("job_id").cast(pl.String),
        pl.col("cn").fill_null("").alias("comm_name"), "comm_hash",
        (k // (1 << 31) % 16).cast(pl.Int32).alias("func"),
        pl.when(algo == 7).then(255).otherwise(algo).alias("algo"),
        pl.when(proto == 3).then(255).otherwise(proto).alias("proto"),
        ((k // (1 << 19) % 128).cast(pl.Int32) - 1).alias("size_bucket"),
        (k % (1 << 19)).cast(pl.Int64).alias("config_version"), pl.col("nranks").cast(pl.Int32),
        pl.when(lat >= 2).then(lat - _LAT_OFFSET).alias("lat_bin"),
        "n", pl.when(timed).then(pl.col("n")).otherwise(0).alias("n_timed"), pl.col("dur_sum").fill_null(0.0),
        "bytes_sum", pl.when(timed).then(pl.col("bytes_sum")).otherwise(0).alias("bytes_timed"))
        .rename({"k": "t_bin"}).sort("t_bin", "comm_hash", "func", "size_bucket", "lat_bin"))


def _sample_query(lf: pl.LazyFrame, k: int, seed: int, bin_ns: int) -> pl.LazyFrame:
    if k > 1:
        lf = lf.filter(pl.col("seq_number").cast(_U).hash(seed) % k == 0)
    return lf.select((pl.col("ev_ns") // bin_ns).alias("t_bin"), "job_id", pl.col("comm_hash").cast(_U),
                     (pl.col("func").cast(_U) * (1 << 40) + pl.col("seq_number").cast(_U) % (1 << 40)).alias("ik"),
                     pl.col("func").cast(pl.Int32), pl.col("sb").cast(pl.Int32), pl.col("rank").cast(pl.Int32),
                     pl.col("nranks").cast(pl.Int32), "host", pl.col("pid").cast(pl.Int64), "comm_name", "dur", "ev_ns")


def _instance_tables(s: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """spread per (t_bin, func, size bucket); per (t_bin, communicator, rank) straggler stats;
    (communicator, rank) → name, nranks, host, pid."""
    ik = ["job_id", "comm_hash", "ik"]
    d = pl.col("dur")
    s = s.with_columns(d.median().over(ik).alias("dmed"), d.min().over(ik).alias("dmin"),
                       d.max().over(ik).alias("dmax"), d.count().over(ik).alias("nt"),
                       pl.col("ev_ns").min().over(ik).alias("ev0"), pl.len().over(ik).alias("nrec"),
                       pl.col("rank").min().over(ik).alias("rank0"))
    first = s.filter(pl.col("rank") == pl.col("rank0"))
    spread = (first.group_by("t_bin", "func", pl.col("sb").alias("size_bucket"))
              .agg(pl.len().alias("instances"), (pl.col("nrec") >= pl.col("nranks")).sum().alias("complete"),
                   (pl.col("dmax") - pl.col("dmin")).filter(pl.col("nt") >= 2).alias("sp"))
              .with_columns(pl.col("sp").list.len().alias("multi"), pl.col("sp").list.mean().alias("spread_mean_s"),
                            pl.col("sp").list.median().alias("spread_p50_s"), pl.col("sp").list.max().alias("spread_max_s"))
              .drop("sp").sort("t_bin", "func", "size_bucket"))
    multi = (pl.col("nt") >= 2) & d.is_not_null()
    ranks = (s.group_by("t_bin", "job_id", "comm_hash", "rank")
             .agg(pl.len().alias("n"), (d / pl.col("dmed")).filter(multi & (pl.col("dmed") > 0)).mean().alias("rel_lat"),
                  ((pl.col("ev_ns") - pl.col("ev0")).cast(pl.Float64) * 1e-9).filter(pl.col("nrec") >= 2).mean()
                  .alias("arrival_lag_s"),
                  (multi & (d == pl.col("dmin")) & (pl.col("dmin") < pl.col("dmax"))).sum().alias("shortest"),
                  multi.sum().alias("n_multi"))
             .with_columns(pl.col("job_id").cast(pl.String)).sort("t_bin", "job_id", "comm_hash", "rank"))
    ids = (s.group_by("job_id", "comm_hash", "rank")
           .agg(pl.col("comm_name").first(), pl.col("nranks").max(), pl.col("host").first(), pl.col("pid").first())
           .with_columns(pl.col("job_id", "comm_name", "host").cast(pl.String))
           .sort("job_id", "nranks", "comm_name", "comm_hash", "rank", descending=[False, True, False, False, False]))
    return spread, ranks, ids


def choose_bin_s(span_s: float, target_bins: int) -> float:
    """Smallest round bin giving at most ``target_bins`` bins.

    >>> choose_bin_s(90, 400), choose_bin_s(3 * 3600, 400), choose_bin_s(1e9, 400)
    (1, 30, 86400)
    """
    want = span_s / target_bins
    return next((b for b in NICE_BINS_S if b >= want), NICE_BINS_S[-1])


# errors a damaged file raises (plan errors — bugs — propagate)
_DATA_ERRORS = (pl.exceptions.ComputeError, OSError)


def _collect(q: pl.LazyFrame) -> pl.DataFrame:
    return q.collect(engine="streaming")


def _run_groups(groups, build, what: str, problems: list[str]) -> list[pl.DataFrame]:
    """Run ``build(files)`` per schema group; a group that fails is retried file by file so one
    damaged file costs only itself."""
    out = []
    for group in groups:
        try:
            out.append(_collect(build(group)))
            continue
        except _DATA_ERRORS as exc:  # a damaged file inside the group
            log.warning("%s: scan of %d files failed (%s); retrying file by file", what, len(group), exc)
        for f in group:
            try:
                out.append(_collect(build([f])))
            except _DATA_ERRORS as exc:
                msg = f"{f.path}: unreadable data ({str(exc).splitlines()[0]}); skipped"
                if msg not in problems:
                    problems.append(msg)
    return out


def summarise(directory: str | os.PathLike, config: ScanConfig | None = None, *,
              inventory: Inventory | None = None) -> RunSummary:
    """Reduce the run under ``directory``; never raises for bad files (they are listed in
    ``problems``). Raises FileNotFoundError if the directory does not exist."""
    import time
    cfg = (config or ScanConfig()).validate()
    t0 = time.perf_counter()
    inv = inventory or take_inventory(directory)
    timings = {"inventory_s": time.perf_counter() - t0}
    groups = inv.groups()
    problems = list(inv.problems)
    rng = None
    if groups:  # event-time range (GPU and host clocks may differ: part-file statistics are not enough)
        t = time.perf_counter()
        rparts = _run_groups(groups, lambda g: _records(g, cfg, 10**9).select(
            pl.col("ev_ns").min().alias("lo"), pl.col("ev_ns").max().alias("hi")), "range", problems)
        timings["range_s"] = time.perf_counter() - t
        r = pl.concat(rparts) if rparts else None
        if r is not None and r["lo"].drop_nulls().len():
            rng = (int(r["lo"].min()), int(r["hi"].max()))
    span_s = (rng[1] - rng[0]) / 1e9 if rng else 0.0
    bin_s = cfg.bin_s if cfg.bin_s is not None else choose_bin_s(span_s, cfg.target_bins)
    bin_ns = max(1, int(round(bin_s * 1e9)))
    if span_s / bin_s > MAX_BINS:
        raise ValueError(f"time bin {bin_s:g} s too small for a run of {span_s:,.1f} s "
                         f"({span_s / bin_s:,.0f} bins; at most {MAX_BINS:,})")
    b0 = rng[0] // bin_ns if rng else 0
    summ = RunSummary(os.fspath(directory), inv, bin_s, problems=problems, notes=list(inv.notes),
                      timings=timings)
    if rng is None:
        return summ
    lpd = cfg.lat_bins_per_decade
    t = time.perf_counter()
    parts = _run_groups(groups, lambda g: _streams_query(_records(g, cfg, bin_ns), bin_ns, b0, lpd),
                        "streams", summ.problems)
    timings["streams_s"] = time.perf_counter() - t
    if not parts:
        return summ
    summ.streams = _unpack_streams(pl.concat(parts), b0)
    summ.records = int(summ.streams["n"].sum())
    bad_files = {p.split(": unreadable", 1)[0] for p in summ.problems if ": unreadable data" in p}
    scanned_rows = sum(f.rows for f in inv.files if f.path not in bad_files)
    summ.invalid = max(0, scanned_rows - summ.records)
    if summ.invalid:
        summ.notes.append(f"{summ.invalid:,} row(s) with values no plugin produces (enum codes out of "
                          "range, rank ≥ nranks) left out")
    k = max(1, math.ceil(summ.records / cfg.sample_records))
    summ.sample_k = k
    t = time.perf_counter()
    sparts = _run_groups(groups, lambda g: _sample_query(_records(g, cfg, bin_ns), k, cfg.sample_seed, bin_ns),
                         "sample", summ.problems)
    timings["sample_scan_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if sparts:
        sample = pl.concat(sparts)
        summ.spread, summ.ranks, summ.rank_ids = _instance_tables(sample)
        timings["sample_records"] = sample.height
        del sample
    timings["instances_s"] = time.perf_counter() - t
    if k > 1:
        summ.notes.append(f"cross-rank spread and per-rank tables use a systematic sample of 1 in {k} "
                          f"collective instances ({timings.get('sample_records', 0):,} records)")
    return summ


def busbw_factor_expr(func: pl.Expr, nranks: pl.Expr) -> pl.Expr:
    """dynamiccl.collector.records: busbw factor × traffic multiplier (AllGather/ReduceScatter: × nranks)."""
    n = nranks.cast(pl.Float64)
    codes = {k: [c.code for c in COLLECTIVES if c.busbw == k] for k in (BUSBW_ALLREDUCE, BUSBW_N_MINUS_1)}
    factor = (pl.when(func.is_in(codes[BUSBW_ALLREDUCE])).then(2 * (n - 1) / n)
              .when(func.is_in(codes[BUSBW_N_MINUS_1])).then((n - 1) / n).otherwise(1.0))
    traffic = pl.when(func.is_in([c.code for c in COLLECTIVES if c.full_buffer])).then(n).otherwise(1.0)
    return factor * traffic


def lat_bin_edges(lat_bin: np.ndarray, per_decade: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper latency (s) of latency bins."""
    lb = np.asarray(lat_bin, np.float64)
    return 10 ** (lb / per_decade), 10 ** ((lb + 1) / per_decade)
