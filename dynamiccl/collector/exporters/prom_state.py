"""What ``/metrics`` exports about collectives, bounded against forged label floods.

Cumulative tables (duration histograms, operation and byte counters, last-event timestamps) share
one budget of ``max_series`` exposed series (a histogram label set counts as its 24 series). When
the budget is full, the least recently updated label set is evicted if it has not been updated
for ``series_min_idle_s``; otherwise the new label set is not tracked. Either way it is counted
(``series_dropped_total``). A flood of fresh labels therefore cannot push out the series of a job
that keeps reporting, and a job that starts after a flood gets its series once the flood's have
gone idle.

"Last window" gauges (bandwidth, spread, skew) hold the latest closed window only, at most
``max_window_series`` rows per table (the keys with the most records first), and are not exported
once no window has closed for ``gauge_ttl_s``: a finished or hung job does not look healthy.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from dynamiccl.collector.component import WindowResult
from dynamiccl.collector.metrics import DURATION_BUCKETS_S

__all__ = ["SeriesBudget", "CollectiveState", "HIST_SERIES"]

HIST_SERIES = len(DURATION_BUCKETS_S) + 3  # buckets + Inf, _sum, _count
_N_LE = len(DURATION_BUCKETS_S) + 1


class SeriesBudget:
    """One budget of exposed series over named tables, evicting the least recently updated."""

    def __init__(self, max_series: int, min_idle_s: float):
        self.max_series, self.min_idle_s = max_series, min_idle_s
        self.tables: dict[str, dict] = {}
        self._lru: OrderedDict[tuple, tuple[int, float]] = OrderedDict()  # (table, key) → (weight, updated)
        self.series = 0
        self.dropped = 0
        self.evicted = 0

    def table(self, name: str) -> dict:
        return self.tables.setdefault(name, {})

    def slot(self, name: str, key: tuple, init: Callable, now: float, weight: int = 1):
        """The table entry for ``key`` (created if the budget allows), or None (counted)."""
        table = self.tables[name]
        lk = (name, key)
        v = table.get(key)
        if v is not None:
            self._lru[lk] = (weight, now)
            self._lru.move_to_end(lk)
            return v
        while self.series + weight > self.max_series:
            if not self._lru:
                self.dropped += 1
                return None
            (old_name, old_key), (old_w, updated) = next(iter(self._lru.items()))
            if now - updated < self.min_idle_s:
                self.dropped += 1
                return None
            self._lru.popitem(last=False)
            del self.tables[old_name][old_key]
            self.series -= old_w
            self.evicted += 1
        v = table[key] = init()
        self._lru[lk] = (weight, now)
        self.series += weight
        return v


class CollectiveState:
    """Exporter state, updated once per closed window (never per record)."""

    def __init__(self, *, max_series: int, max_window_series: int, series_min_idle_s: float,
                 gauge_ttl_s: float, clock: Callable[[], float]):
        self.lock = threading.Lock()
        self.budget = SeriesBudget(max_series, series_min_idle_s)
        self.hist = self.budget.table("hist")          # labels → [counts(22), sum]
        self.colls = self.budget.table("colls")
        self.bytes = self.budget.table("bytes")
        self.last_event = self.budget.table("last_event")
        self.max_window_series = max_window_series
        self.gauge_ttl_s = gauge_ttl_s
        self._clock = clock
        self.window_at: float | None = None            # when the gauges were last replaced
        self.busbw: dict[tuple, float] = {}
        self.algbw: dict[tuple, float] = {}
        self.spread: dict[tuple, float] = {}
        self.skew: dict[tuple, float] = {}
        self.gauges_dropped = 0
        self.version = 0                                # bumped by every update (render cache key)

    @property
    def series_dropped(self) -> int:
        return self.budget.dropped + self.budget.evicted + self.gauges_dropped

    def _fresh(self) -> bool:
        return self.window_at is not None and self._clock() - self.window_at <= self.gauge_ttl_s

    def gauges(self) -> dict[str, dict]:
        """The last-window gauge tables, empty once they are older than ``gauge_ttl_s``."""
        fresh = self._fresh()
        return {name: dict(getattr(self, name)) if fresh else {}
                for name in ("busbw", "algbw", "spread", "skew")}

    def render_key(self) -> tuple[int, bool]:
        """What the exported text depends on: changes with every update and when the gauges expire.
        Read without the lock (two attribute reads): a scrape must not wait for a window's update."""
        return self.version, self._fresh()

    def update(self, r: WindowResult) -> None:
        now = self._clock()
        with self.lock:
            self._cumulative(r.histograms, now)
            b = self.budget
            for job, host, rank, t in r.last_event.iter_rows():
                k = (job, host, str(rank))
                if t > self.last_event.get(k, 0.0) and b.slot("last_event", k, float, now) is not None:
                    self.last_event[k] = t
            self._last_window(r)
            self.window_at = now
            self.version += 1

    def _cumulative(self, h, now: float) -> None:
        """One row per label set in the window, those with the most records first: when the budget
        is short, a job's busy label sets win over a flood of one-record forged ones."""
        b = self.budget
        for i in np.argsort(-np.asarray(h["records"], np.int64), kind="stable").tolist():
            labels = (h["job_id"][i], h["host"][i], h["comm"][i], h["func"][i], h["algo"][i],
                      h["proto"][i], str(int(h["size_bucket"][i])))
            slot = b.slot("hist", labels, lambda: [np.zeros(_N_LE, np.int64), 0.0], now, HIST_SERIES)
            if slot is not None:
                slot[0] += h["counts"][i]
                slot[1] += float(h["sum_s"][i])
            ck = (labels[0], labels[2], labels[3], labels[4], labels[5])
            if b.slot("colls", ck, int, now) is not None:
                self.colls[ck] += int(h["records"][i])
            bk = (labels[0], labels[2], labels[3])
            if b.slot("bytes", bk, int, now) is not None:
                self.bytes[bk] += int(round(h["bytes"][i]))

    def _last_window(self, r: WindowResult) -> None:
        import polars as pl
        cap = self.max_window_series
        keys = r.features.keys
        self.busbw, self.algbw, self.spread = {}, {}, {}
        if keys.height:
            comm = pl.when(pl.col("comm_name") != "").then(pl.col("comm_name")).otherwise(
                pl.col("comm_hash").map_elements(lambda v: f"{v:016x}", return_dtype=pl.String))
            g = keys.with_columns(comm=comm).group_by("job_id", "comm", "func", "size_bucket").agg(
                busbw=(pl.col("busbw_Bps") * pl.col("records")).sum() / pl.col("records").filter(
                    pl.col("busbw_Bps").is_not_null()).sum(),
                algbw=(pl.col("algbw_Bps") * pl.col("records")).sum() / pl.col("records").filter(
                    pl.col("algbw_Bps").is_not_null()).sum(),
                spread=pl.col("spread_max_s").max(), n=pl.col("records").sum())
            if g.height > cap:  # keys with the most records first
                self.gauges_dropped += g.height - cap
                g = g.sort("n", descending=True).head(cap)
            for job, cm, func, sb, bus, alg, spr, _n in g.iter_rows():
                k = (job, cm, func, str(sb))
                if bus is not None and np.isfinite(bus):
                    self.busbw[k] = bus
                if alg is not None and np.isfinite(alg):
                    self.algbw[k] = alg
                if spr is not None:
                    self.spread[k] = spr
        skew = r.skew
        if skew.height > cap:
            self.gauges_dropped += skew.height - cap
            skew = skew.head(cap)
        self.skew = {(job, cm, str(rank)): s for job, cm, rank, s in skew.iter_rows() if s is not None}
