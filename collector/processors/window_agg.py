"""Event-time window aggregation: RecordBatch in, one WindowResult per closed window out.

Hot path (``consume``): a handful of numpy expressions per batch — event time, duration,
bandwidth, packed group keys — then the batch's compact columns are appended to its window.
Window close (``_aggregate``): grouping by packed u64 keys with sort/bincount segment
reductions, and a polars group_by for the per-rank table. Nothing loops over records in Python.

Packed keys (all u64):
  key  = gcomm<<27 | func<<23 | algo<<15 | proto<<7 | (size_bucket+1)   (the `keys` row)
  ikey = gcomm<<44 | func<<40 | (seq_number mod 2^40)                   (one instance)
where gcomm is a dense code for (job_id, comm_hash) (at most 2^20 live codes).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import numpy as np
import polars as pl

from collector.component import RecordBatch, WindowResult
from collector.config import WindowConfig
from collector.features import KEYS_SCHEMA, RANKS_SCHEMA, WindowFeatures
from collector.metrics import DURATION_BUCKETS_S, SelfMetrics
from collector.records import busbw_factor, duration_s, event_time_ns, size_bucket, traffic_bytes
from collector.wire_format import ALGOS, FUNCS, PROTOS

__all__ = ["WindowAggregator", "aggregate_window"]

log = logging.getLogger(__name__)

_U = np.uint64
_MAX_GCOMM = 1 << 20
_M40 = _U((1 << 40) - 1)
_M48 = _U((1 << 48) - 1)
_BOUNDS = np.asarray(DURATION_BUCKETS_S)
N_BUCKETS = len(_BOUNDS) + 1  # + overflow (+Inf)
_FUNC_NAMES = np.array(list(FUNCS) + ["UNKNOWN"] * (16 - len(FUNCS)), dtype=object)
_ALGO_NAMES = np.array([ALGOS[i] if i < len(ALGOS) else "UNKNOWN" for i in range(256)], dtype=object)
_PROTO_NAMES = np.array([PROTOS[i] if i < len(PROTOS) else "UNKNOWN" for i in range(256)], dtype=object)


class Interner:
    """str/tuple → dense int code (bounded: ``get`` returns -1 when full)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.codes: dict = {}
        self.values: list = []

    def get(self, value) -> int:
        code = self.codes.get(value)
        if code is None:
            if len(self.values) >= self.limit:
                return -1
            code = len(self.values)
            self.codes[value] = code
            self.values.append(value)
        return code


class _Chunks:
    __slots__ = ("parts", "n")

    def __init__(self):
        self.parts: list[dict[str, np.ndarray]] = []
        self.n = 0


COLUMNS = ("key", "ikey", "host", "rank", "nranks", "nnodes", "bytes", "dur", "traffic", "event_ns")


class WindowAggregator:
    """Processor: RecordBatch → WindowResult per closed event-time window.

    Not thread-safe: call ``consume``/``tick`` from one thread (the pipeline's worker).
    """

    def __init__(self, config: WindowConfig, *, next_consumer, metrics: SelfMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic):
        config.validate()
        if next_consumer is None:
            raise ValueError("next_consumer must not be None")
        self.config = config
        self.next_consumer = next_consumer
        self.metrics = metrics or SelfMetrics()
        self._clock = clock
        self._window_ns = int(round(config.window_s * 1e9))
        self._lateness_ns = int(round(config.allowed_lateness_s * 1e9))
        self.jobs = Interner(1 << 16)
        self.hosts = Interner(1 << 16)
        self.gcomms = Interner(_MAX_GCOMM)  # (job_code, comm_hash) → code
        self.comm_names: dict[tuple[int, int], str] = {}
        self._open: dict[int, _Chunks] = {}
        self._closed_upto: int | None = None  # windows < this index are closed
        self._watermark_ns: int | None = None   # event time up to which every active source has reported
        self._skew_ns = int(round(min(config.max_skew_s, max(0, config.max_open_windows - 2) * config.window_s) * 1e9))
        self._src_max: dict[int, int] = {}      # host code -> newest event time seen from it
        self._src_seen: dict[int, float] = {}   # host code -> wall time of its last batch
        self._last_arrival = clock()
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        """Close every open window (flush)."""
        with self._lock:
            self._close_all()

    # -- hot path ------------------------------------------------------------------------------
    def consume(self, batch: RecordBatch) -> None:
        ev = batch.events
        if len(ev) == 0:
            return
        with self._lock:
            self._consume(batch, ev)

    def _consume(self, batch: RecordBatch, ev: np.ndarray) -> None:
        m = self.metrics
        self._last_arrival = self._clock()
        job = self.jobs.get(batch.job_id)
        host = self.hosts.get(batch.host)
        if job < 0 or host < 0:
            m.drop("invalid", len(ev))
            return
        comm_hash = ev["comm_hash"]
        gcomm = self._gcomm_codes(job, comm_hash)
        for ch, name in batch.comm_names.items():
            if name:
                self.comm_names[(job, int(ch))] = name
        t = event_time_ns(ev)
        widx = t // self._window_ns
        keep = gcomm >= 0
        n_bad = len(ev) - int(keep.sum())
        if n_bad:
            m.drop("invalid", n_bad)
        if self._closed_upto is not None:
            late = widx < self._closed_upto
            n_late = int((late & keep).sum())
            if n_late:
                m.drop("late", n_late)
                keep &= ~late
        if self._watermark_ns is not None and self._open:
            newest = max(self._src_max.values(), default=self._watermark_ns)
            limit = newest // self._window_ns + self.config.max_open_windows
            early = widx > limit
            n_early = int((early & keep).sum())
            if n_early:
                m.drop("too_early", n_early)
                keep &= ~early
        if not keep.all():
            ev, t, widx, gcomm = ev[keep], t[keep], widx[keep], gcomm[keep]
            if len(ev) == 0:
                return
        cols = self._columns(ev, t, gcomm, host)
        lo, hi = int(widx.min()), int(widx.max())
        if lo == hi:
            self._append(lo, cols)
        else:
            order = np.argsort(widx, kind="stable")
            sw = widx[order]
            cuts = np.flatnonzero(np.diff(sw)) + 1
            for part_idx, w in zip(np.split(order, cuts), sw[np.r_[0, cuts]]):
                self._append(int(w), {k: v[part_idx] for k, v in cols.items()})
        tmax = int(t.max())
        if tmax > self._src_max.get(host, -1):
            self._src_max[host] = tmax
        self._src_seen[host] = self._last_arrival
        self._advance_watermark()
        self._close_ready()

    def _advance_watermark(self) -> None:
        """Per-source watermark: min over active sources, capped at max_skew behind the newest."""
        now = self._last_arrival
        idle = self.config.idle_flush_s
        for h in [h for h, seen in self._src_seen.items() if now - seen > idle]:
            del self._src_seen[h]       # a silent source no longer holds windows open
            del self._src_max[h]
        if not self._src_max:
            return
        newest = max(self._src_max.values())
        wm = max(min(self._src_max.values()), newest - self._skew_ns)
        if self._watermark_ns is None or wm > self._watermark_ns:
            self._watermark_ns = wm

    def _gcomm_codes(self, job: int, comm_hash: np.ndarray) -> np.ndarray:
        """Dense (job, comm) codes; a process has few communicators, so peel them off one
        vectorised comparison at a time (no sort), falling back to np.unique for many."""
        out = np.full(len(comm_hash), -1, np.int64)
        todo = np.ones(len(comm_hash), bool)
        i = 0
        for _ in range(16):
            ch = comm_hash[i]
            m = comm_hash == ch
            out[m] = self.gcomms.get((job, int(ch)))
            todo &= ~m
            rest = np.flatnonzero(todo)
            if len(rest) == 0:
                return out
            i = int(rest[0])
        uniq, inv = np.unique(comm_hash[todo], return_inverse=True)
        out[todo] = np.array([self.gcomms.get((job, int(c))) for c in uniq], np.int64)[inv]
        return out

    @staticmethod
    def _columns(ev: np.ndarray, t: np.ndarray, gcomm: np.ndarray, host: int) -> dict[str, np.ndarray]:
        func = ev["func"]
        nranks = ev["nranks"]
        nbytes = ev["bytes"]
        sb = size_bucket(nbytes)
        g = gcomm.astype(_U)
        key = ((g << _U(27)) | (func.astype(_U) << _U(23)) | (ev["algo"].astype(_U) << _U(15))
               | (ev["proto"].astype(_U) << _U(7)) | (sb + 1).astype(_U))
        ikey = (g << _U(44)) | (func.astype(_U) << _U(40)) | (ev["seq_number"] & _M40)
        dur = duration_s(ev)
        return {"key": key, "ikey": ikey, "host": np.full(len(ev), host, np.uint16),
                "rank": np.ascontiguousarray(ev["rank"]), "nranks": np.ascontiguousarray(nranks),
                "nnodes": np.ascontiguousarray(ev["nnodes"]), "bytes": nbytes.astype(np.int64),
                "dur": dur, "traffic": traffic_bytes(func, nbytes, nranks), "event_ns": t}

    def _append(self, w: int, cols: dict[str, np.ndarray]) -> None:
        chunks = self._open.get(w)
        if chunks is None:
            chunks = self._open[w] = _Chunks()
        chunks.parts.append(cols)
        chunks.n += len(cols["key"])

    # -- closing -------------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        """Idle flush: close everything when nothing arrived for ``idle_flush_s`` (wall time)."""
        now = self._clock() if now is None else now
        with self._lock:
            if self._open and now - self._last_arrival >= self.config.idle_flush_s:
                self._close_all()
                self._watermark_ns = None
                self._src_max.clear()
                self._src_seen.clear()

    def _close_ready(self) -> None:
        wm = self._watermark_ns
        for w in sorted(self._open):
            if (w + 1) * self._window_ns + self._lateness_ns <= wm:
                self._close(w)
            else:
                break

    def _close_all(self) -> None:
        for w in sorted(self._open):
            self._close(w)

    def _close(self, w: int) -> None:
        chunks = self._open.pop(w)
        self._closed_upto = max(self._closed_upto or 0, w + 1)
        cols = {k: np.concatenate([p[k] for p in chunks.parts]) for k in COLUMNS}
        chunks.parts.clear()
        try:
            result = aggregate_window(cols, window_start_ns=w * self._window_ns,
                                      window_s=self.config.window_s, aggregator=self)
        except Exception:
            log.exception("window %d: aggregation failed (%d records dropped)", w, chunks.n)
            self.metrics.drop("aggregation_error", chunks.n)
            return
        m = self.metrics
        m.add("aggregated", chunks.n)
        m.add("windows_emitted", 1)
        with m._lock:
            m.last_window_end_s = (w + 1) * self.config.window_s
        result.features.counters.update(_counters(m, chunks.n))
        self.next_consumer.consume(result)

    # -- code → string tables used by aggregate_window -------------------------------------------
    def gcomm_table(self, codes: np.ndarray) -> tuple[list[str], np.ndarray, list[str]]:
        """job_id, comm_hash (u64), comm_name for each gcomm code."""
        jobs, hashes, names = [], np.zeros(len(codes), _U), []
        for i, c in enumerate(codes.tolist()):
            job, ch = self.gcomms.values[c]
            jobs.append(self.jobs.values[job])
            hashes[i] = ch
            names.append(self.comm_names.get((job, ch), ""))
        return jobs, hashes, names


def _counters(m: SelfMetrics, n: int) -> dict:
    snap = m.snapshot()
    out = {"records": n}
    for k, v in snap.items():
        if isinstance(v, dict):
            for reason, count in v.items():
                out[f"{k}:{reason}"] = count
        else:
            out[k] = v
    return out


def _segments(gid: np.ndarray, values: np.ndarray, ngroups: int):
    """Sort ``values`` (≥ 0, finite) within groups: returns sorted values, starts, counts.

    One u64 sort of (gid << (64-g) | top (64-g) bits of the float), g = bits needed for the
    group id. With ≤ 2^24 groups the order is exact up to a relative 2^-28 (~4e-9) and values
    are gathered back from the truncated bits; more groups fall back to an exact lexsort.
    """
    counts = np.bincount(gid, minlength=ngroups)
    starts = np.zeros(ngroups, np.int64)
    if ngroups > 1:
        np.cumsum(counts[:-1], out=starts[1:])
    gbits = max(1, int(ngroups - 1).bit_length())
    if gbits <= 24:
        shift = _U(gbits)
        comp = values.view(_U) >> shift
        comp |= gid.astype(_U) << _U(64 - gbits)
        comp.sort()
        comp <<= shift
        vals = comp.view(np.float64)
    else:
        vals = values[np.lexsort((values, gid))]
    return vals, starts, counts


def _median_bandwidth(kid, dur, traffic, timed, nk, dvals, dstarts, dcounts) -> np.ndarray:
    """Median per key of traffic/duration, exact, mostly without another sort.

    Where every timed record of a key moves the same traffic and no duration is 0 (the usual
    case: one size per key), bandwidth is a decreasing function of duration, so its two middle
    elements are traffic over the two middle durations already sorted for the latency quantiles.
    Other keys' records are sorted by bandwidth directly.
    """
    ok = timed & (dur > 0)
    k_ok, t_ok = kid[ok], traffic[ok]
    bcounts = np.bincount(k_ok, minlength=nk)
    tmin = np.full(nk, np.inf)
    tmax = np.full(nk, -np.inf)
    np.minimum.at(tmin, k_ok, t_ok)
    np.maximum.at(tmax, k_ok, t_ok)
    out = np.full(nk, np.nan)
    uni = (bcounts > 0) & (tmin == tmax) & (bcounts == dcounts)
    if uni.any():
        c = dcounts[uni]
        d_lo = dvals[dstarts[uni] + (c - 1) // 2]
        d_hi = dvals[dstarts[uni] + c // 2]
        out[uni] = 0.5 * (tmin[uni] / d_lo + tmin[uni] / d_hi)
    mixed = (bcounts > 0) & ~uni
    if mixed.any():
        sel = ok & mixed[kid]
        bvals, bstarts, bc = _segments(kid[sel], traffic[sel] / dur[sel], nk)
        out[mixed] = _quantile(bvals, bstarts, bc, 0.5)[mixed]
    return out


def _quantile(vals, starts, counts, q: float) -> np.ndarray:
    """Linear-interpolated quantile per segment (numpy's default method); NaN when empty."""
    out = np.full(len(counts), np.nan)
    ok = counts > 0
    pos = q * (counts[ok] - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, counts[ok] - 1)
    frac = pos - lo
    a = vals[starts[ok] + lo]
    b = vals[starts[ok] + hi]
    out[ok] = a + (b - a) * frac
    return out


def _nan_to_null(a: np.ndarray) -> pl.Series:
    return pl.Series(values=a, dtype=pl.Float64, nan_to_null=True)


def _dense(codes: np.ndarray, limit: int = 1 << 23) -> tuple[np.ndarray, np.ndarray]:
    """Dense ids for non-negative int codes without sorting ``codes``: (ids, sorted unique codes).

    Direct addressing through a bincount when the code range is small (the usual case: codes
    are built from small dense parts); a sort-based np.unique otherwise.
    """
    if len(codes) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    m = int(codes.max()) + 1
    if m > limit:
        uniq, inv = np.unique(codes, return_inverse=True)
        return inv.astype(np.int64), uniq.astype(np.int64)
    uniq = np.flatnonzero(np.bincount(codes, minlength=m))
    lut = np.empty(m, np.int64)
    lut[uniq] = np.arange(len(uniq))
    return lut[codes], uniq


def _first_index(ids: np.ndarray, n_ids: int) -> np.ndarray:
    """Index of the first record of each id (every id in 0..n_ids-1 must occur)."""
    first = np.empty(n_ids, np.int64)
    first[ids[::-1]] = np.arange(len(ids) - 1, -1, -1)
    return first


def aggregate_window(cols: dict[str, np.ndarray], *, window_start_ns: int, window_s: float,
                     aggregator: WindowAggregator) -> WindowResult:
    key, ikey, host, dur = cols["key"], cols["ikey"], cols["host"], cols["dur"]
    n = len(key)
    timed = ~np.isnan(dur)
    # ---- dense ids: communicator (window-local), key, (key, host) -------------------------------
    gl, ucodes = _dense((key >> _U(27)).astype(np.int64))
    func_r = ((key >> _U(23)) & _U(0xF)).astype(np.int64)
    low16 = ((func_r << 12) | (np.minimum((key >> _U(15)) & _U(0xFF), _U(7)).astype(np.int64) << 9)
             | (np.minimum((key >> _U(7)) & _U(0xFF), _U(3)).astype(np.int64) << 7)
             | (key & _U(0x7F)).astype(np.int64))
    kid, ukc = _dense((gl << 16) | low16)
    nk = len(ukc)
    first_k = _first_index(kid, nk)
    hl, uhost = _dense(host.astype(np.int64))
    khid, ukh = _dense(kid * len(uhost) + hl)
    kid_of_kh = ukh // len(uhost)
    host_of_kh = uhost[ukh % len(uhost)]
    records = np.bincount(kid, minlength=nk)
    bytes_total = np.bincount(kid, weights=cols["bytes"], minlength=nk).round().astype(np.int64)
    kid_t, dur_t = kid[timed], dur[timed]
    dvals, dstarts, dcounts = _segments(kid_t, dur_t, nk)
    with np.errstate(invalid="ignore", divide="ignore"):
        lat_mean = np.bincount(kid_t, weights=dur_t, minlength=nk) / dcounts
    lat_max = np.full(nk, -np.inf)
    np.maximum.at(lat_max, kid_t, dur_t)
    lat_max[dcounts == 0] = np.nan
    algbw_med = _median_bandwidth(kid, dur, cols["traffic"], timed, nk, dvals, dstarts, dcounts)
    gl_k = ukc >> 16
    gcomm_k = ucodes[gl_k]
    func_k = (ukc >> 12) & 0xF
    algo_k = (ukc >> 9) & 0x7
    algo_k[algo_k == 7] = 255
    proto_k = (ukc >> 7) & 0x3
    proto_k[proto_k == 3] = 255
    sb_k = (ukc & 0x7F).astype(np.int32) - 1
    nranks_k = cols["nranks"][first_k]
    # ---- instances: (communicator, func, seqNumber), direct-addressed per (comm, func) ---------
    gf = (gl << 4) | func_r
    seq = (ikey & _M40).astype(np.int64)
    gfid, ugf = _dense(gf)
    ngf = len(ugf)
    smin = np.full(ngf, np.iinfo(np.int64).max)
    smax = np.full(ngf, -1, np.int64)
    np.minimum.at(smin, gfid, seq)
    np.maximum.at(smax, gfid, seq)
    span = smax - smin + 1
    if n and int(span.sum()) <= 4 * n + 4096:
        off = np.zeros(ngf, np.int64)
        np.cumsum(span[:-1], out=off[1:])
        iid, _ = _dense(off[gfid] + seq - smin[gfid])
    else:
        iid, _ = _dense((gfid << 40) | seq, limit=0)
    ni = int(iid.max()) + 1 if n else 0
    first_i = _first_index(iid, ni)
    n_all = np.bincount(iid, minlength=ni)
    iid_t = iid[timed]
    n_t = np.bincount(iid_t, minlength=ni)
    s_t = np.bincount(iid_t, weights=dur_t, minlength=ni)
    dmin = np.full(ni, np.inf)
    dmax = np.full(ni, -np.inf)
    np.minimum.at(dmin, iid_t, dur_t)
    np.maximum.at(dmax, iid_t, dur_t)
    dmin[n_t == 0] = np.nan
    dmax[n_t == 0] = np.nan
    at_min = timed.copy()
    at_min[timed] = dur_t == dmin[iid_t]
    n_min = np.bincount(iid[at_min], minlength=ni)
    rel_t = (cols["event_ns"] - window_start_ns).astype(np.float64) * 1e-9
    start_mean = np.bincount(iid, weights=rel_t, minlength=ni) / np.maximum(n_all, 1)
    kid_i = kid[first_i]
    # per key: instances (distinct seq numbers) and cross-rank spread over instances on ≥ 2 ranks
    instances = np.bincount(kid_i, minlength=nk)
    multi = n_t >= 2
    svals, sstarts, scounts = _segments(kid_i[multi], (dmax - dmin)[multi], nk)
    spread_p50 = _quantile(svals, sstarts, scounts, 0.5)
    spread_max = np.full(nk, np.nan)
    okk = scounts > 0
    spread_max[okk] = svals[sstarts[okk] + scounts[okk] - 1]
    complete = n_all >= cols["nranks"][first_i]
    # ---- per-record instance-relative values → ranks ---------------------------------------------
    # rel: this rank's duration / mean duration of the instance's other ranks (leave-one-out)
    multi_r = multi[iid] & timed
    with np.errstate(invalid="ignore", divide="ignore"):
        others = (s_t[iid] - dur) / (n_t[iid] - 1)
        rel = np.where(multi_r & (others > 0), dur / others, np.nan)
    shortest = multi_r & at_min & (n_min[iid] == 1)
    skew = np.where(n_all[iid] >= 2, rel_t - start_mean[iid], np.nan)
    # dense (gcomm, rank) group id: window-local gcomm index × max nranks + rank
    gdense = gl
    rmax = int(cols["nranks"].max()) if n else 1
    rid = gdense * rmax + cols["rank"]
    nr_groups = len(ucodes) * rmax
    if nr_groups > (1 << 24):  # absurdly wide: compact through a sort
        urid, rid = np.unique(rid, return_inverse=True)
        nr_groups = len(urid)
    r_records = np.bincount(rid, minlength=nr_groups)
    present = np.flatnonzero(r_records)
    with np.errstate(invalid="ignore", divide="ignore"):
        r_lat = np.bincount(rid[timed], weights=dur_t, minlength=nr_groups) / np.bincount(
            rid[timed], minlength=nr_groups)
        rel_ok = ~np.isnan(rel)
        r_rel = np.bincount(rid[rel_ok], weights=rel[rel_ok], minlength=nr_groups) / np.bincount(
            rid[rel_ok], minlength=nr_groups)
        sk_ok = ~np.isnan(skew)
        r_skew = np.bincount(rid[sk_ok], weights=skew[sk_ok], minlength=nr_groups) / np.bincount(
            rid[sk_ok], minlength=nr_groups)
    r_short = np.bincount(rid[shortest], minlength=nr_groups)
    r_last = np.zeros(nr_groups, np.int64)
    np.maximum.at(r_last, rid, cols["event_ns"])
    r_host = np.zeros(nr_groups, np.int64)
    r_host[rid] = host
    r_rank = np.zeros(nr_groups, np.int32)
    r_rank[rid] = cols["rank"]
    r_gd = np.zeros(nr_groups, np.int64)
    r_gd[rid] = gdense
    comp_per_g = np.bincount(gdense[first_i][complete], minlength=len(ucodes))
    # ---- strings -------------------------------------------------------------------------------------
    jobs, hashes, names = aggregator.gcomm_table(ucodes)
    pos_k = gl_k
    jobs_a = np.array(jobs, dtype=object)
    names_a = np.array(names, dtype=object)
    host_names = np.array(aggregator.hosts.values, dtype=object)
    with np.errstate(invalid="ignore", divide="ignore"):
        busbw = algbw_med * busbw_factor(func_k, nranks_k)
    keys_df = pl.DataFrame({
        "job_id": jobs_a[pos_k].tolist() if nk else [], "comm_name": names_a[pos_k].tolist() if nk else [],
        "func": _FUNC_NAMES[func_k].tolist(), "algo": _ALGO_NAMES[algo_k].tolist(),
        "proto": _PROTO_NAMES[proto_k].tolist(), "comm_hash": hashes[pos_k],
        "size_bucket": sb_k, "nranks": nranks_k.astype(np.int32),
        "nnodes": cols["nnodes"][first_k].astype(np.int32), "records": records.astype(np.int64),
        "instances": instances.astype(np.int64), "bytes_total": bytes_total,
        "lat_mean_s": _nan_to_null(lat_mean), "lat_p50_s": _nan_to_null(_quantile(dvals, dstarts, dcounts, 0.5)),
        "lat_p90_s": _nan_to_null(_quantile(dvals, dstarts, dcounts, 0.9)),
        "lat_p99_s": _nan_to_null(_quantile(dvals, dstarts, dcounts, 0.99)),
        "lat_max_s": _nan_to_null(lat_max), "algbw_Bps": _nan_to_null(algbw_med),
        "busbw_Bps": _nan_to_null(busbw), "spread_p50_s": _nan_to_null(spread_p50),
        "spread_max_s": _nan_to_null(spread_max),
    }, schema=KEYS_SCHEMA)
    rg_pos = r_gd[present]
    r_job = jobs_a[rg_pos].tolist()
    r_hostname = host_names[r_host[present]].tolist()
    ranks_df = pl.DataFrame({
        "job_id": r_job, "comm_hash": hashes[rg_pos], "rank": r_rank[present],
        "host": r_hostname, "records": r_records[present].astype(np.int64),
        "lat_mean_s": _nan_to_null(r_lat[present]), "rel_lat_mean": _nan_to_null(r_rel[present]),
        "shortest_count": r_short[present].astype(np.int64),
        "instances_complete": comp_per_g[rg_pos].astype(np.int64),
    }, schema=RANKS_SCHEMA)
    # ---- exporter-only frames -----------------------------------------------------------------------
    comm_label = np.array([nm or f"{h:016x}" for nm, h in zip(names, hashes.tolist())], dtype=object)
    nkh = len(ukh)
    bucket = np.searchsorted(_BOUNDS, dur_t, side="left")
    hcounts = np.bincount(khid[timed] * N_BUCKETS + bucket, minlength=nkh * N_BUCKETS).reshape(nkh, N_BUCKETS)
    hsum = np.bincount(khid[timed], weights=dur_t, minlength=nkh)
    kpos = gl_k[kid_of_kh]
    hist = {
        "job_id": jobs_a[kpos], "host": host_names[host_of_kh],
        "comm": comm_label[kpos], "func": _FUNC_NAMES[func_k[kid_of_kh]],
        "algo": _ALGO_NAMES[algo_k[kid_of_kh]], "proto": _PROTO_NAMES[proto_k[kid_of_kh]],
        "size_bucket": sb_k[kid_of_kh], "counts": hcounts, "sum_s": hsum,
        "records": np.bincount(khid, minlength=nkh), "bytes": np.bincount(khid, weights=cols["bytes"], minlength=nkh),
    }
    last_event = pl.DataFrame({
        "job_id": r_job, "host": r_hostname, "rank": r_rank[present],
        "last_event_s": r_last[present].astype(np.float64) * 1e-9,
    })
    skew_df = pl.DataFrame({
        "job_id": r_job, "comm": comm_label[rg_pos].tolist(),
        "rank": r_rank[present], "skew_s": _nan_to_null(r_skew[present]),
    })
    features = WindowFeatures(window_start_ns / 1e9, window_s, keys_df, ranks_df, {})
    return WindowResult(features=features, histograms=hist, last_event=last_event, skew=skew_df)
