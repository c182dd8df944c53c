"""One window's rows as the stream table sees them: grouped by stream, mapped to slots, checked
(NaN, non-positive, absurd and thin windows are counted, never charted) and, for streams with
fewer than ``min_instances`` instances, pooled with their next windows (`dynamiccl.detector.sparse`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .stream_group import group_streams, rank_masks, reporting
from .wait_streams import with_wait_rows

__all__ = ["WindowRows", "StreamRows"]


@dataclass
class WindowRows:
    """Per grouped row of one window (``keep``: has a slot; ``ok``: a value to chart)."""
    agg: pl.DataFrame
    idx: np.ndarray
    keep: np.ndarray
    ok: np.ndarray
    lat: np.ndarray
    lat90: np.ndarray
    inst: np.ndarray
    rec: np.ndarray
    byt: np.ndarray
    bits: np.ndarray
    rep_pool: np.ndarray | None    # ranks seen over a pooled sample's windows (-2: not pooled)
    invalid: dict[str, int]


def _column(agg: pl.DataFrame, name: str, dtype) -> np.ndarray:
    return agg.get_column(name).to_numpy().astype(dtype) if agg.height else np.zeros(0, dtype)


class StreamRows:
    """Mixin of `StreamTable`."""

    def _rows(self, wf) -> WindowRows:
        cfg = self.config
        invalid: dict[str, int] = {}
        keys = (self.step_rate.with_rows(wf.keys, float(wf.window_start), self._window_s)
                if cfg.streams.step_rate else wf.keys)
        keys = with_wait_rows(keys, getattr(wf, "waits", None))
        agg, h = group_streams(keys)
        n_rows = agg.height
        idx = self._lookup(agg, h) if n_rows else np.zeros(0, np.int64)
        keep = idx >= 0
        if (~keep).any():
            invalid["stream_limit"] = int((~keep).sum())
        lat = _column(agg, "lat", np.float64)
        lat90 = _column(agg, "lat90", np.float64)
        inst = _column(agg, "instances", np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            nan = ~np.isfinite(lat)
            nonpos = ~nan & (lat <= 0)
            absurd = ~nan & (lat > cfg.streams.max_latency_s)
            sparse = ~(nan | nonpos | absurd) & (inst < cfg.streams.min_instances)
        rep_pool = None
        if (sparse & keep).any():
            # too few instances for a statistic: pooled with the stream's next windows until
            # there are enough; the window completing a pool carries it
            rows = np.flatnonzero(sparse & keep)
            rep_pool = np.full(n_rows, -2, np.int64)
            rep_pool[rows] = self.pool.ranks_reporting(idx[rows], rank_masks(agg, wf.ranks)[rows],
                                                       reporting(agg, wf.ranks)[rows] >= 0)
            done, pooled = self.pool.add(idx[rows], np.log(lat[rows]), inst[rows], cfg.streams.min_instances)
            lat, lat90, sparse = lat.copy(), lat90.copy(), sparse.copy()
            lat[rows[done]] = pooled
            lat90[rows[done]] = np.nan
            sparse[rows[done]] = False
        for name, m in (("nan", nan), ("nonpositive", nonpos), ("absurd", absurd), ("sparse", sparse)):
            c = int((m & keep).sum())
            if c:
                invalid[name] = c
        ok = keep & ~(nan | nonpos | absurd | sparse)
        self.pool.clear(idx[ok & (inst >= cfg.streams.min_instances)])   # a whole window needs no pool
        return WindowRows(agg, idx, keep, ok, lat, lat90, inst, _column(agg, "records", np.int64),
                          _column(agg, "bytes_total", np.float64), _column(agg, "ap_bits", np.uint64),
                          rep_pool, invalid)

    def _note_gaps(self, r: WindowRows, window_start: float) -> None:
        """First data after a gap in a stream (a checkpoint pause, a restart; a silence longer
        than 1.5x its usual interval): its next windows are settling, and the fusion stage
        wants them confirmed."""
        idx_all = r.idx[r.keep]
        prev = self.last_seen[idx_all]
        with np.errstate(invalid="ignore"):
            thin = self.instances_ref[idx_all] < self.config.streams.min_instances
        codes = self.job_code[idx_all].astype(np.int64)
        self.cadence.observe(codes, window_start, self._window_s)
        gap = self.pool.gap(idx_all, window_start - prev, self._window_s, thin, self.cadence.usual(codes))
        self.gap_step[idx_all[gap]] = self.t
        self.last_seen[idx_all] = window_start
