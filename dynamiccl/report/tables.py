"""The numbers the report shows, derived from a :class:`dynamiccl.report.summary.RunSummary` (plain polars).

Every figure and table is built from these functions, and the tests check them (and the HTML
tables) against values recomputed directly from the parquet files.

Definitions: ``lat_mean_s`` = Σ duration / timed records; ``busbw_Bps`` = Σ(bytes × traffic
multiplier × busbw factor) / Σ duration over timed records (AllGather/ReduceScatter traffic =
bytes × nranks; factor 2(n−1)/n AllReduce, (n−1)/n AllGather/ReduceScatter/AlltoAll, else 1).
"""
from __future__ import annotations

import math
import polars as pl

from dynamiccl.detector.events import RegimeChange
from dynamiccl.report.summary import (RunSummary, algo_name, busbw_factor_expr, func_name,
                            proto_name)

__all__ = ["stream_series", "latency_hist", "mix", "config_changes", "stragglers", "change_rows",
           "truth_rows", "overview", "fmt_bytes", "fmt_seconds", "size_label", "rank_labels", "heatmap_ranks"]


def fmt_bytes(n: float | None) -> str:
    """>>> fmt_bytes(3 * 2**20), fmt_bytes(512), fmt_bytes(None)
    ('3 MiB', '512 B', '-')
    """
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.3g} PiB"  # pragma: no cover


def fmt_seconds(s: float | None) -> str:
    """>>> fmt_seconds(2.5e-5), fmt_seconds(0.0123), fmt_seconds(75.0), fmt_seconds(None)
    ('25 µs', '12.3 ms', '75 s', '-')
    """
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    a = abs(s)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if a < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s" if a < 1000 else f"{s:,.0f} s"


def size_label(bucket: int) -> str:
    """Label of log2 size bucket (its lower edge). >>> size_label(24), size_label(-1)
    ('16 MiB', '0 B')
    """
    return "0 B" if bucket < 0 else fmt_bytes(float(2 ** bucket))


def _timed(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns((pl.col("bytes_timed").cast(pl.Float64)
                            * busbw_factor_expr(pl.col("func"), pl.col("nranks"))).alias("bus_bytes"))


def _rates(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(
        pl.when(pl.col("n_timed") > 0).then(pl.col("dur_sum") / pl.col("n_timed")).alias("lat_mean_s"),
        pl.when(pl.col("dur_sum") > 0).then(pl.col("bus_bytes") / pl.col("dur_sum")).alias("busbw_Bps"))


def stream_series(s: RunSummary) -> pl.DataFrame:
    """Per (t_bin, func, size_bucket, nranks): records, mean latency, bus bandwidth."""
    df = _timed(s.streams).group_by("t_bin", "func", "size_bucket", "nranks").agg(
        pl.col("n", "n_timed", "dur_sum", "bus_bytes", "bytes_sum").sum())
    return _rates(df).sort("func", "size_bucket", "nranks", "t_bin")


def latency_hist(s: RunSummary) -> pl.DataFrame:
    """Per (t_bin, func, lat_bin): timed record counts (lat_bin = floor(log10(s) × per_decade))."""
    return (s.streams.filter(pl.col("lat_bin").is_not_null())
            .group_by("t_bin", "func", "lat_bin").agg(pl.col("n").sum()).sort("func", "t_bin", "lat_bin"))


def mix(s: RunSummary) -> pl.DataFrame:
    """The job's collective mix per (func, size_bucket): records, bytes (Σ per-rank message
    bytes), time (Σ per-rank durations, rank-seconds), mean latency, bus bandwidth, shares."""
    df = _timed(s.streams).group_by("func", "size_bucket").agg(
        pl.col("n").sum().alias("records"), pl.col("n_timed").sum(), pl.col("bytes_sum").sum().alias("bytes"),
        pl.col("dur_sum").sum(), pl.col("bus_bytes").sum())
    df = _rates(df)
    tot_t = float(df["dur_sum"].sum() or 0.0)
    tot_b = float(df["bytes"].sum() or 0)
    return (df.with_columns((pl.col("dur_sum") / tot_t if tot_t else pl.lit(None, pl.Float64)).alias("time_share"),
                            (pl.col("bytes").cast(pl.Float64) / tot_b if tot_b else pl.lit(None, pl.Float64))
                            .alias("bytes_share"))
            .rename({"dur_sum": "time_s"}).sort("func", "size_bucket"))


def config_changes(s: RunSummary, limit: int = 50) -> tuple[list[dict], list[dict]]:
    """(tuner config versions seen: version, first/last time, records;
    algorithm/protocol switches of a stream: time, stream, from, to) — both from the records."""
    st = s.streams
    versions = (st.group_by("config_version").agg(pl.col("t_bin").min().alias("first"), pl.col("t_bin").max().alias("last"),
                                                  pl.col("n").sum().alias("records")).sort("first"))
    vrows = [{"version": r["config_version"], "first_s": r["first"] * s.bin_s, "last_s": (r["last"] + 1) * s.bin_s,
              "records": r["records"]} for r in versions.iter_rows(named=True)]
    dom = (st.group_by("t_bin", "func", "size_bucket", "nranks", "algo", "proto").agg(pl.col("n").sum())
           .sort("n", "algo", "proto", descending=[True, False, False])
           .group_by("t_bin", "func", "size_bucket", "nranks", maintain_order=True).first()
           .sort("func", "size_bucket", "nranks", "t_bin"))
    prev = dom.select(pl.all().shift(1).over("func", "size_bucket", "nranks").name.suffix("_prev"))
    sw = pl.concat([dom, prev], how="horizontal").filter(
        pl.col("t_bin_prev").is_not_null()
        & ((pl.col("algo") != pl.col("algo_prev")) | (pl.col("proto") != pl.col("proto_prev"))))
    switches = []
    for r in sw.sort("t_bin").head(limit).iter_rows(named=True):
        switches.append({"t_s": r["t_bin"] * s.bin_s, "func": func_name(r["func"]), "size_bucket": r["size_bucket"],
                         "nranks": r["nranks"],
                         "from": f"{algo_name(r['algo_prev'])}/{proto_name(r['proto_prev'])}",
                         "to": f"{algo_name(r['algo'])}/{proto_name(r['proto'])}"})
    return vrows, switches


def rank_labels(s: RunSummary) -> dict[tuple, str]:
    """(job_id, comm_hash, rank) → 'world0 rank 5 (host:pid)'."""
    if s.rank_ids is None:
        return {}
    multi_job = s.rank_ids["job_id"].n_unique() > 1
    return {(r["job_id"], r["comm_hash"], r["rank"]):
            (f"{r['job_id']} " if multi_job else "") + f"{r['comm_name'] or hex(r['comm_hash'])} rank {r['rank']}"
            f" ({r['host']}:{r['pid']})" for r in s.rank_ids.iter_rows(named=True)}


def heatmap_ranks(s: RunSummary, limit: int = 256) -> list[tuple]:
    """Rows of the per-rank heatmap: every rank of the largest communicator(s) of each job
    (all communicators of the largest size, e.g. tp0 and tp1 when there is no world comm)."""
    if s.rank_ids is None or s.rank_ids.height == 0:
        return []
    top = s.rank_ids.with_columns(pl.col("nranks").max().over("job_id").alias("mx")).filter(pl.col("nranks") == pl.col("mx"))
    return [tuple(r) for r in top.select("job_id", "comm_hash", "rank").rows()][:limit]


def stragglers(s: RunSummary, *, rel_below: float = 0.5, gap_bins: int = 1, min_instances: int = 5) -> list[dict]:
    """Intervals in which a rank of a communicator was its straggler: in a time bin, the rank
    with the lowest relative latency (own duration / instance median; a late rank's own
    collectives are short because the others waited for it), if that is below ``rel_below`` ×
    the communicator's median rank; ranks seen in fewer than ``min_instances`` (sampled) instances
    of the bin are not judged. Consecutive bins (gaps up to ``gap_bins``) merge. A late GPU
    shows in every communicator it belongs to (e.g. world0 rank 5, tp0 rank 5, dp5 rank 0)."""
    if s.ranks is None or s.ranks.height == 0:
        return []
    key = ["t_bin", "job_id", "comm_hash"]
    p = s.ranks.filter(pl.col("rel_lat").is_not_null() & (pl.col("n_multi") >= min_instances))
    p = p.with_columns(pl.col("rel_lat").median().over(key).alias("med"), pl.len().over(key).alias("nr"))
    low = (p.filter(pl.col("nr") >= 2).sort("rel_lat").group_by(key, maintain_order=True).first()
           .filter(pl.col("rel_lat") < rel_below * pl.col("med")).sort("job_id", "comm_hash", "rank", "t_bin"))
    labels = rank_labels(s)
    runs: list[dict] = []
    cur = None
    for r in low.iter_rows(named=True):
        k = (r["job_id"], r["comm_hash"], r["rank"])
        if cur is not None and cur["key"] == k and r["t_bin"] - cur["last"] <= gap_bins + 1:
            cur["last"] = r["t_bin"]
            cur["rel"].append(r["rel_lat"])
            cur["lag"].append(r["arrival_lag_s"])
            continue
        cur = {"key": k, "first": r["t_bin"], "last": r["t_bin"], "rel": [r["rel_lat"]], "lag": [r["arrival_lag_s"]]}
        runs.append(cur)
    out = []
    for c in runs:
        lags = [x for x in c["lag"] if x is not None]
        out.append({"rank_label": labels.get(c["key"], f"{c['key'][1]:#x} rank {c['key'][2]}"), "job_id": c["key"][0],
                    "comm_hash": c["key"][1], "rank": c["key"][2],
                    "from_s": c["first"] * s.bin_s, "to_s": (c["last"] + 1) * s.bin_s, "bins": len(c["rel"]),
                    "rel_lat": sum(c["rel"]) / len(c["rel"]),
                    "arrival_lag_s": sum(lags) / len(lags) if lags else None})
    return sorted(out, key=lambda r: (r["from_s"], r["rank_label"]))


def _truth_abs(ev: dict) -> tuple[float, float]:
    a = ev.get("t_start_ns")
    b = ev.get("t_end_ns")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a / 1e9, b / 1e9
    return float(ev["t_start"]), float(ev["t_end"])


def _reference(ch: RegimeChange, ev: dict, slack_s: float) -> float | None:
    """The truth time a change is measured against, or None if it does not match the event.

    A non-recovery change matches a non-benign event if detected during it (at least 5 s
    counted, ``slack_s`` either side): reference = the event's onset. A recovery matches a
    ``recovery`` event or the end of an event with a duration, detected within 5 s (+ slack)
    after it: reference = that moment."""
    a, b = _truth_abs(ev)
    if ev.get("benign"):
        return None
    if ch.kind == "recovery":
        t = a if ev.get("kind") == "recovery" else (b if b > a else None)
        ok = t is not None and t - slack_s <= ch.detected_s <= t + 5.0 + slack_s
        return t if ok else None
    if ev.get("kind") == "recovery":
        return None
    return a if a - slack_s <= ch.detected_s <= max(b, a + 5.0) + slack_s else None


def _best(ch: RegimeChange, truth: list[dict], slack_s: float) -> tuple[dict, float] | None:
    """Explicit recovery events before event ends; then the closest reference."""
    cands = [(ev, t) for ev in truth if (t := _reference(ch, ev, slack_s)) is not None]
    if not cands:
        return None
    return min(cands, key=lambda c: (c[0].get("kind") != "recovery", abs(ch.detected_s - c[1])))


def change_rows(changes: list[RegimeChange], truth: list[dict], *, slack_s: float = 1.0) -> list[dict]:
    """Regime-change table rows: kind, onset, detection, delay, magnitude, where, and the ground
    truth event it matches (see :func:`_reference`) with the delay from the true onset (for a
    recovery: from the true end)."""
    rows = []
    for ch in sorted(changes, key=lambda c: c.detected_s):
        where = []
        if ch.comm_names or ch.comms:
            where.append("comms " + ", ".join(ch.comm_names or ch.comms))
        if ch.funcs:
            where.append(", ".join(ch.funcs))
        if ch.size_buckets:
            where.append("sizes " + ", ".join(size_label(b) for b in ch.size_buckets))
        if ch.ranks:
            where.append("ranks " + ", ".join(map(str, ch.ranks)))
        if ch.hosts:
            where.append("hosts " + ", ".join(ch.hosts))
        m = _best(ch, truth, slack_s)
        label = None
        if m is not None:
            ev = m[0]
            label = f"{ev['kind']} #{ev.get('id', '')}" + (" (end)" if ch.kind == "recovery" and ev.get("kind") != "recovery" else "")
        rows.append({"id": ch.id, "kind": ch.kind, "job_id": ch.job_id, "start_s": ch.start_s,
                     "detected_s": ch.detected_s, "delay_s": ch.delay_s, "magnitude": ch.magnitude,
                     "where": "; ".join(where), "recovers": ch.recovers, "truth": label,
                     "truth_delay_s": None if m is None else ch.detected_s - m[1]})
    return rows


def truth_rows(truth: list[dict], changes: list[RegimeChange], *, slack_s: float = 1.0) -> list[dict]:
    """Ground-truth rows with the first change that detected each event (onsets only: a recovery
    change is credited to a ``recovery`` event, never to another event's onset)."""
    out = []
    for ev in truth:
        a, b = _truth_abs(ev)
        onset_kind = ev.get("kind") == "recovery"
        hit = next((c for c in sorted(changes, key=lambda c: c.detected_s)
                    if (c.kind == "recovery") == onset_kind and _reference(c, ev, slack_s) is not None), None)
        out.append({"kind": ev["kind"], "benign": bool(ev.get("benign")), "start_s": a, "end_s": b,
                    "where": ", ".join(f"{k}={v}" for k, v in (ev.get("where") or {}).items()),
                    "detected_s": None if hit is None else hit.detected_s,
                    "delay_s": None if hit is None else hit.detected_s - a, "change": None if hit is None else hit.id})
    return out


def overview(s: RunSummary) -> dict:
    st = s.streams
    t_lo, t_hi = s.t_range_s
    return {"records": s.records, "timed": int(st["n_timed"].sum()),
            "files": len(s.inventory.files), "skipped_files": len(s.inventory.skipped),
            "jobs": sorted(x for x in st["job_id"].unique().to_list() if x is not None),
            "communicators": int(st["comm_hash"].n_unique()),
            "processes": 0 if s.rank_ids is None else s.rank_ids.select("job_id", "host", "pid").n_unique(),
            "hosts": 0 if s.rank_ids is None else int(s.rank_ids["host"].n_unique()),
            "start_s": t_lo, "end_s": t_hi, "bin_s": s.bin_s, "sample_k": s.sample_k}
