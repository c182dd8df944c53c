"""The stream table's storage and index."""
from __future__ import annotations

import numpy as np
import polars as pl

from dynamiccl.collector.wire_format import ALGOS, PROTOS

STREAM_KEY = ("job_id", "comm_hash", "func", "size_bucket")
_AP_CODE = {(a, p): i * len(PROTOS) + j for i, a in enumerate(ALGOS) for j, p in enumerate(PROTOS)}
_AP_UNKNOWN = 63
_ALGO_CODE = {a: i for i, a in enumerate(ALGOS)}
_PROTO_CODE = {p: i for i, p in enumerate(PROTOS)}
_GROW = 1024
KNOWN_BASELINE = 10**9   # sample count standing for a known baseline in `dynamiccl.detector.arl`
FIXED_BASELINE_MIN = 60  # a fixed baseline's threshold is calibrated for at least this many samples




class StreamStore:
    """Storage and index of the stream table: growable per-stream arrays, key lookup, thresholds,
    allocation and eviction (a part of :class:`~dynamiccl.detector.streams.StreamTable`)."""

    # ------------------------------------------------------------------ storage
    def _alloc_arrays(self, cap: int) -> None:
        self.active = np.zeros(cap, bool)
        self.comm_hash = np.zeros(cap, np.uint64)
        self.size_bucket = np.zeros(cap, np.int32)
        self.nnodes = np.zeros(cap, np.int32)
        self.bytes_ref = np.full(cap, np.nan)
        self.bytes_per_record = np.full(cap, np.nan)
        self.coverage_ref = np.full(cap, np.nan)
        self.coverage = np.full(cap, np.nan)
        # ranks of the stream's communicator reporting in the window (the ranks frame; -1:
        # unknown) and in the window its coverage reference was set: a coverage change is a
        # rank vanishing or joining only if that number changed
        self.reporting = np.full(cap, -1, np.int64)
        self.reporting_ref = np.full(cap, -1, np.int64)
        self.rank_set_changed = np.zeros(cap, bool)
        self.instances_ref = np.full(cap, np.nan)
        self.instances = np.zeros(cap, np.float64)
        # log(p90 / p50) of the stream's latest window and of the one before it: a window holding a
        # regime change mixes both regimes, its p90 far ahead of its p50 (`Fusion`, `onset_wait`)
        self.spread = np.full(cap, np.nan)
        self.spread_prev = np.full(cap, np.nan)
        self.prev_bpr = np.full(cap, np.nan)      # the workload before the current one, and its baseline
        self.prev_cov = np.full(cap, np.nan)
        self.prev_med = np.full(cap, np.nan)
        self.prev_scale = np.full(cap, np.nan)
        self.prev_n = np.zeros(cap, np.int64)
        self.rebase_warm = np.zeros(cap, bool)      # warming up after a workload change
        self.old_bpr = np.full(cap, np.nan)         # the workload before the last change ...
        self.old_cov = np.full(cap, np.nan)
        self.old_unknown = np.zeros(cap, bool)      # ... whose baseline the stream did not know
        # the baseline a stream had when it last alarmed (to restore its sample count with it)
        self.saved_med = np.full(cap, np.nan)
        self.saved_n = np.zeros(cap, np.int64)
        # the scale (and its sample count) a stream had when it alarmed: pooled into the
        # re-learnt baseline of the new level (`dynamiccl.detector.self_start`); 0 after a workload change
        self.carry_scale = np.full(cap, np.nan)
        self.carry_n = np.zeros(cap, np.int64)
        self.ap_ref = np.zeros(cap, np.uint64)
        self.last_seen = np.full(cap, -np.inf)
        self.gap_step = np.full(cap, -(1 << 40), np.int64)
        self.monitor_since = np.full(cap, -(1 << 40), np.int64)   # step the current baseline was set
        self.job = np.empty(cap, dtype=object)
        self.job_code = np.full(cap, -1, np.int32)
        self.func = np.empty(cap, dtype=object)
        self.comm_name = np.empty(cap, dtype=object)

    def _grow(self, need: int) -> None:
        new_cap = max(self.capacity * 2, need + _GROW)
        extra = new_cap - self.capacity
        for bank in self.banks:
            bank.grow(extra)
        self.ss.grow(extra)
        self.pool.grow(extra)

        def ext(a, fill):
            return np.concatenate([a, np.full((extra,) + a.shape[1:], fill, dtype=a.dtype)])

        self.active = ext(self.active, False)
        self.comm_hash = ext(self.comm_hash, 0)
        self.size_bucket = ext(self.size_bucket, 0)
        self.nnodes = ext(self.nnodes, 0)
        self.bytes_ref = ext(self.bytes_ref, np.nan)
        self.bytes_per_record = ext(self.bytes_per_record, np.nan)
        self.coverage_ref = ext(self.coverage_ref, np.nan)
        self.coverage = ext(self.coverage, np.nan)
        self.reporting = ext(self.reporting, -1)
        self.reporting_ref = ext(self.reporting_ref, -1)
        self.rank_set_changed = ext(self.rank_set_changed, False)
        self.instances_ref = ext(self.instances_ref, np.nan)
        self.instances = ext(self.instances, 0.0)
        self.spread = ext(self.spread, np.nan)
        self.spread_prev = ext(self.spread_prev, np.nan)
        for name in ("prev_bpr", "prev_cov", "prev_med", "prev_scale", "saved_med"):
            setattr(self, name, ext(getattr(self, name), np.nan))
        self.carry_scale = ext(self.carry_scale, np.nan)
        for name in ("prev_n", "saved_n", "carry_n"):
            setattr(self, name, ext(getattr(self, name), 0))
        self.ap_ref = ext(self.ap_ref, 0)
        self.last_seen = ext(self.last_seen, -np.inf)
        self.gap_step = ext(self.gap_step, -(1 << 40))
        self.monitor_since = ext(self.monitor_since, -(1 << 40))
        self.job = ext(self.job, None)
        self.job_code = ext(self.job_code, -1)
        self.func = ext(self.func, None)
        self.comm_name = ext(self.comm_name, None)
        self.rebase_warm = ext(self.rebase_warm, False)
        self.old_bpr = ext(self.old_bpr, np.nan)
        self.old_cov = ext(self.old_cov, np.nan)
        self.old_unknown = ext(self.old_unknown, False)
        self.hist = np.concatenate([self.hist, np.full((self.hist.shape[0], extra), np.nan)], axis=1)
        self.inst_hist = np.concatenate([self.inst_hist, np.zeros((self.hist.shape[0], extra), np.int64)], axis=1)
        self.capacity = new_cap

    # ------------------------------------------------------------------ index
    def _lookup(self, agg: pl.DataFrame, h: np.ndarray) -> np.ndarray:
        # the collector emits keys in a stable order: the same hashes as last window → same slots
        prev = self._prev_lookup
        if prev is not None and prev[0].shape == h.shape and np.array_equal(prev[0], h):
            return prev[1].copy()
        hs = self._hash_sorted
        if len(hs):
            order = np.argsort(h, kind="stable")       # sorted queries: cache-friendly search
            pos = np.empty(len(h), np.int64)
            pos[order] = np.searchsorted(hs, h[order])
            pos_c = np.minimum(pos, len(hs) - 1)
            found = (pos < len(hs)) & (hs[pos_c] == h)
            idx = np.where(found, self._hash_idx[pos_c], -1).astype(np.int64)
        else:
            found = np.zeros(len(h), bool)
            idx = np.full(len(h), -1, np.int64)
        if not found.all():
            new_rows = np.flatnonzero(~found)
            new_h, first = np.unique(h[new_rows], return_index=True)
            rows = new_rows[first]
            cols = {c: agg.get_column(c).to_list() for c in (*STREAM_KEY, "comm_name", "nnodes")}
            assigned = np.full(len(new_h), -1, np.int64)
            for j, r in enumerate(rows.tolist()):
                slot = self._allocate()
                if slot < 0:
                    break
                assigned[j] = slot
                key = tuple(cols[c][r] for c in STREAM_KEY)
                self.key_of[slot] = key
                self.job[slot] = key[0]
                self.job_code[slot] = self.jobs.setdefault(key[0], len(self.jobs))
                self.comm_hash[slot] = key[1]
                self.func[slot] = key[2]
                self.size_bucket[slot] = key[3]
                self.comm_name[slot] = cols["comm_name"][r] or f"{key[1]:x}"
                self.nnodes[slot] = cols["nnodes"][r] or 1
                self.active[slot] = True
            ok = assigned >= 0
            self.n_dropped_streams += int((~ok).sum())
            self._retarget()
            if ok.any():
                all_h = np.concatenate([hs, new_h[ok]])
                all_i = np.concatenate([self._hash_idx, assigned[ok]])
                order = np.argsort(all_h, kind="stable")
                self._hash_sorted, self._hash_idx = all_h[order], all_i[order]
            lookup = dict(zip(new_h.tolist(), assigned.tolist()))
            idx[new_rows] = [lookup[v] for v in h[new_rows].tolist()]
        self._prev_lookup = (h.copy(), idx.copy())
        return idx

    def _retarget(self) -> None:
        """Per-stream ARL0 so that all streams together false-alarm about
        ``stream_false_alarms_per_day`` times a day (a union bound; the fusion stage filters
        further). Changed only in factors of 2, so thresholds rarely move."""
        cfg = self.config
        per_day = 86400.0 / getattr(self, "_window_s", 1.0)
        want = max(cfg.arl0, self.n_active * per_day / cfg.stream_false_alarms_per_day)
        if want > 2.0 * self.arl0 or want < 0.5 * self.arl0:
            self.arl0 = want
            self._set_thresholds()

    def _set_thresholds(self) -> None:
        """h for the per-stream ARL0: with ``self_start``, the known-baseline one (the
        standardisation accounts for the baseline's estimation error, `dynamiccl.detector.self_start`);
        else the one for a fixed baseline from max(warmup, 60) samples (below ~60 the exact
        correction explodes: h = 1,600 sigma at 20 samples)."""
        from .arl import cusum_threshold_correlated
        cfg = self.config
        n = KNOWN_BASELINE if cfg.self_start else max(cfg.warmup, FIXED_BASELINE_MIN)
        for bank in self.banks:
            bank.set_threshold(cusum_threshold_correlated(float(self.arl0), bank.delta / 2.0, n,
                                                          cfg.long_run_variance, True, cfg.baseline_estimator))

    def _allocate(self) -> int:
        if self._free:
            return self._free.pop()
        if self.n >= self.config.max_streams:
            return -1
        if self.n >= self.capacity:
            self._grow(self.n + 1)
        self.n += 1
        return self.n - 1

    def _evict(self, now: float) -> None:
        idle = np.flatnonzero(self.active & (self.last_seen < now - self.config.stream_idle_s))
        if idle.size == 0:
            return
        self._prev_lookup = None
        keep = ~np.isin(self._hash_idx, idle)
        self._hash_sorted, self._hash_idx = self._hash_sorted[keep], self._hash_idx[keep]
        for bank in self.banks:
            bank.reset_streams(idle)
        self.active[idle] = False
        self.bytes_ref[idle] = np.nan
        self.coverage_ref[idle] = np.nan
        self.reporting_ref[idle] = -1
        self.instances_ref[idle] = np.nan
        self.spread[idle] = np.nan
        self.spread_prev[idle] = np.nan
        for name in ("prev_bpr", "prev_cov", "prev_med", "prev_scale", "saved_med"):
            getattr(self, name)[idle] = np.nan
        self.prev_n[idle] = 0
        self.rebase_warm[idle] = False
        self.ss.n[idle] = 0
        self.pool.forget(idle)
        self.carry_n[idle] = 0
        self.ap_ref[idle] = 0
        self.hist[:, idle] = np.nan
        for i in idle.tolist():
            self.key_of.pop(i, None)
            self._free.append(i)
        self._retarget()


def _group_streams(keys: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray]:
    """One row per stream (lat of the row with most records, sums, (algo, proto) bit set) and
    the streams' 64-bit key hashes. The common case, one row per stream, needs no group_by."""
    if keys.height == 0:
        return pl.DataFrame(), np.zeros(0, np.uint64)
    if "lat_p90_s" not in keys.columns:     # optional: without it no window is seen as mixed
        keys = keys.with_columns(pl.lit(None, dtype=pl.Float64).alias("lat_p90_s"))
    code = (keys.get_column("algo").replace_strict(_ALGO_CODE, default=-1, return_dtype=pl.Int64) * len(PROTOS)
            + keys.get_column("proto").replace_strict(_PROTO_CODE, default=-1, return_dtype=pl.Int64))
    code = code.to_numpy()
    code = np.where((code >= 0) & (code < _AP_UNKNOWN), code, _AP_UNKNOWN)
    bit = np.left_shift(np.uint64(1), code.astype(np.uint64))
    h = keys.select(pl.struct(*STREAM_KEY).hash(seed=7)).to_series().to_numpy()
    hs = np.sort(h)
    if not (hs[1:] == hs[:-1]).any():
        agg = keys.select(*STREAM_KEY, "comm_name", "nnodes", "records", "instances", "bytes_total",
                          pl.col("lat_p50_s").fill_nan(None).alias("lat"),
                          pl.col("lat_p90_s").fill_nan(None).alias("lat90"),
                          pl.Series("ap_bits", bit, dtype=pl.UInt64))
        return agg, h
    k = keys.with_columns(pl.Series("ap_bit", bit, dtype=pl.UInt64),
                          pl.col("lat_p50_s").fill_nan(None), pl.col("lat_p90_s").fill_nan(None))
    agg = k.group_by(STREAM_KEY, maintain_order=True).agg(
        pl.col("comm_name").first(),
        pl.col("nnodes").max(),
        pl.col("records").sum(),
        pl.col("instances").sum(),
        pl.col("bytes_total").sum(),
        pl.col("lat_p50_s").sort_by("records", descending=True).first().alias("lat"),
        pl.col("lat_p90_s").sort_by("records", descending=True).first().alias("lat90"),
        pl.col("ap_bit").unique().sum().alias("ap_bits"),
    )
    return agg, agg.select(pl.struct(*STREAM_KEY).hash(seed=7)).to_series().to_numpy()


def _reporting(agg: pl.DataFrame, ranks: pl.DataFrame) -> np.ndarray:
    """Per stream row of ``agg``: ranks of its communicator with records in the ranks frame
    (-1 where the frame says nothing about it)."""
    if ranks is None or ranks.height == 0 or "records" not in ranks.columns:
        return np.full(agg.height, -1, np.int64)
    n = (ranks.filter(pl.col("records") > 0).group_by("job_id", "comm_hash")
         .agg(pl.col("rank").n_unique().cast(pl.Int64).alias("n_reporting")))
    out = agg.select("job_id", "comm_hash").join(n, on=["job_id", "comm_hash"], how="left",
                                                   maintain_order="left")
    return out.get_column("n_reporting").fill_null(-1).to_numpy().astype(np.int64)
