"""Event-time window aggregation: RecordBatch in, one WindowResult per closed window out.

Hot path (``consume``): per batch (a few thousand records, cache-resident) a handful of numpy
expressions derive everything the window close needs — event time, duration, packed key code,
histogram bucket, window-relative start — and append those narrow columns to the window's
preallocated growable buffer (no per-window concatenation). Window close (``_aggregate``): dense
ids through bincount lookup tables, bincount / ufunc.at segment reductions, one radix argsort
(u16) of the records by key and exact per-key quantiles by ``np.partition``; a packed u64 sort
only for keys with few records. Nothing loops over records in Python.

Packed key code (i64): ``kc = gcomm<<16 | func<<12 | min(algo,7)<<9 | min(proto,3)<<7 | (size_bucket+1)``
where gcomm is a dense code for (job_id, comm_hash) (at most 2^20 live codes). An instance is
(gcomm, func, seq_number mod 2^40).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import numpy as np

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import WindowConfig
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.processors.aggregate import (
    _ALGO_BITS,
    _BOUNDS,
    _FUNC_BITS,
    _M40,
    _MAX_GCOMM,
    _PROTO_BITS,
    _U,
    N_BUCKETS,
    _counters,
    aggregate_window,
)
from dynamiccl.collector.processors.clock_align import ClockAlign
from dynamiccl.collector.processors.wait_window import WaitWiring
from dynamiccl.collector.processors.window_buffer import COLUMNS, Interner, _Window  # noqa: F401 (re-exported)
from dynamiccl.collector.wire_format import TimingSource

__all__ = ["WindowAggregator", "aggregate_window"]

log = logging.getLogger(__name__)


class WindowAggregator:
    """Processor: RecordBatch → WindowResult per closed event-time window.

    Not thread-safe: call ``consume``/``tick`` from one thread (the pipeline's worker).
    """

    def __init__(self, config: WindowConfig, *, next_consumer, metrics: SelfMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        config.validate()
        if next_consumer is None:
            raise ValueError("next_consumer must not be None")
        self.config = config
        self.next_consumer = next_consumer
        self.metrics = metrics or SelfMetrics()
        self._clock = clock
        self._wall_clock = wall_clock
        self._ahead_ns = int(round(config.max_clock_ahead_s * 1e9))
        self._window_ns = int(round(config.window_s * 1e9))
        self._lateness_ns = int(round(config.allowed_lateness_s * 1e9))
        self.jobs = Interner(1 << 16)
        self.hosts = Interner(1 << 16)
        self.gcomms = Interner(_MAX_GCOMM)  # (job_code, comm_hash) → code
        self.comm_names: dict[tuple[int, int], str] = {}
        self._open: dict[int, _Window] = {}
        self._cap_hint = min(1 << 16, config.max_window_records)
        # bounds on what open windows hold (records beyond them: dropped as "window_full")
        self._max_win = config.max_window_records
        self._max_buf = config.max_buffered_records
        self._buffered = 0                      # records held by all open windows
        self._full_logged: set[str] = set()     # which bound has been logged (once each)
        self._closed_upto: int | None = None  # windows < this index are closed
        self._watermark_ns: int | None = None   # event time up to which every active source has reported
        self._skew_ns = int(round(min(config.max_skew_s, max(0, config.max_open_windows - 2) * config.window_s) * 1e9))
        self._src_max: dict[int, int] = {}      # host code -> newest event time seen from it
        self._src_seen: dict[int, float] = {}   # host code -> wall time of its last batch
        self._last_arrival = clock()
        self._batches_since_wm = 0
        self._lock = threading.Lock()
        self._waits = WaitWiring()              # the waits' drops and close step (processors/wait_window.py)
        self._align = ClockAlign(config.clock_align_s)   # host clock steps (processors/clock_align.py)
        self._corrected_seen = 0
        self._align_w = -1                      # window index of the last re-estimate

    @property
    def losses(self):
        """Where records lost outside this aggregator are told (processors/wait_losses.py ``LossLedger``);
        None when the wait streams are off (nothing would take the notes)."""
        return self._waits.ledger if self.config.wait_streams else None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        pass

    def shutdown(self, deadline: float | None = None) -> None:
        """Close every open window, oldest first. With ``deadline`` (on this aggregator's clock), windows
        still open when it passes are not aggregated: their records are counted as dropped
        (``reason="shutdown"``) and logged once. A flood spread over every open window (hour-spanning
        or forged event times) otherwise held SIGTERM for seconds per hundred windows."""
        with self._lock:
            for w in sorted(self._open):
                if deadline is not None and self._clock() >= deadline:
                    self._drop_open("shutdown")
                    break
                self._close(w)

    def _drop_open(self, reason: str) -> None:
        n = sum(win.n for win in self._open.values())
        log.warning("shutdown: %d open windows (%d records) not aggregated before the deadline; counted in "
                    "dynamiccl_collector_records_dropped_total{reason=\"%s\"}", len(self._open), n, reason)
        self.metrics.drop(reason, n)
        for win in self._open.values():
            win.cols.clear()
        self._open.clear()
        self._buffered = 0

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
        gcomm = self._gcomm_codes(job, ev["comm_hash"])
        ev = self._align.correct(host, ev)
        self._align.observe(host, gcomm, ev)
        for ch, name in batch.comm_names.items():
            if name:
                self.comm_names[(job, int(ch))] = name
        ts = ev["timing_source"]
        gpu = ts == TimingSource.KERNEL_GPU
        t = np.where(gpu, ev["gpu_start_ns"], ev["enqueue_ns"]).view(np.int64)  # event time
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
                self._waits.dropped(job, gcomm[late & keep], m)
                keep &= ~late
        if self._watermark_ns is not None and self._open:
            newest = max(self._src_max.values(), default=self._watermark_ns)
            limit = newest // self._window_ns + self.config.max_open_windows
            early = widx > limit
            n_early = int((early & keep).sum())
            if n_early:
                m.drop("too_early", n_early)
                self._waits.dropped(job, gcomm[early & keep], m, "too_early")
                keep &= ~early
        if not keep.all():
            ev, t, widx, gcomm, ts, gpu = ev[keep], t[keep], widx[keep], gcomm[keep], ts[keep], gpu[keep]
            if len(ev) == 0:
                return
        lo, hi = int(widx.min()), int(widx.max())
        cols = self._columns(ev, t, ts, gpu, gcomm, host, (t - lo * self._window_ns) if lo == hi
                             else (t - widx * self._window_ns))
        self._refuse_durations(cols["dur"], ts, gpu)
        if lo == hi:
            self._append(lo, cols, None, len(t))
        else:
            order = np.argsort(widx, kind="stable")
            sw = widx[order]
            cuts = np.flatnonzero(np.diff(sw)) + 1
            for part_idx, w in zip(np.split(order, cuts), sw[np.r_[0, cuts]]):
                self._append(int(w), cols, part_idx, len(part_idx))
        tmax = int(t.max())
        if hi > self._align_w:                  # once per window of event time
            self._align_w = hi
            self._realign()
        if tmax > self._src_max.get(host, -1):
            self._src_max[host] = tmax
        self._src_seen[host] = self._last_arrival
        # the watermark costs O(sources): with many sources (a flood of one-batch forged hosts)
        # recompute it every len(sources)/64 batches, so a batch costs O(64) whatever their number
        self._batches_since_wm += 1
        if self._batches_since_wm * 64 >= len(self._src_max):
            self._batches_since_wm = 0
            self._advance_watermark()
            self._close_ready()

    def _advance_watermark(self) -> None:
        """Per-source watermark: min over active sources, capped at max_skew behind the newest.

        A source's event time counts at most max_clock_ahead_s past the wall clock: a host whose
        clock runs 30 s ahead must not turn every other host's records into late ones (its own
        windows close when the wall clock reaches them)."""
        now = self._last_arrival
        idle = self.config.idle_flush_s
        for h in [h for h, seen in self._src_seen.items() if now - seen > idle]:
            del self._src_seen[h]       # a silent source no longer holds windows open
            del self._src_max[h]
        if not self._src_max:
            return
        cap = int(self._wall_clock() * 1e9) + self._ahead_ns
        times = [min(v, cap) for v in self._src_max.values()]
        newest = max(times)
        wm = max(min(times), newest - self._skew_ns)
        if self._watermark_ns is None or wm > self._watermark_ns:
            self._watermark_ns = wm

    def _gcomm_codes(self, job: int, comm_hash: np.ndarray) -> np.ndarray:
        """Dense (job, comm) codes; a process has few communicators, so peel them off one
        vectorised comparison at a time (no sort), falling back to np.unique for many."""
        comm_hash = np.ascontiguousarray(comm_hash)
        ch = int(comm_hash[0])
        out = np.full(len(comm_hash), self.gcomms.get((job, ch)), np.int64)
        todo = np.flatnonzero(comm_hash != comm_hash[0])
        for _ in range(15):
            if len(todo) == 0:
                return out
            rest = comm_hash[todo]
            ch = int(rest[0])
            m = rest == rest[0]
            out[todo[m]] = self.gcomms.get((job, ch))
            todo = todo[~m]
        if len(todo):
            uniq, inv = np.unique(comm_hash[todo], return_inverse=True)
            out[todo] = np.array([self.gcomms.get((job, int(c))) for c in uniq], np.int64)[inv]
        return out

    @staticmethod
    def _columns(ev: np.ndarray, t: np.ndarray, ts: np.ndarray, gpu: np.ndarray, gcomm: np.ndarray,
                 host: int, rel_ns: np.ndarray) -> dict[str, np.ndarray]:
        """The per-record columns a window keeps, computed on the (cache-resident) batch."""
        nb = ev["bytes"].astype(np.float64)
        kc = (gcomm << 16) | _FUNC_BITS[ev["func"]] | _ALGO_BITS[ev["algo"]] | _PROTO_BITS[ev["proto"]]
        kc |= np.frexp(nb)[1]                      # size_bucket + 1 (0 for 0 bytes)
        end = np.where(gpu, ev["gpu_end_ns"], ev["cpu_end_ns"]).view(np.int64)
        dns = end - t
        dur = dns * 1e-9                           # duration: GPU end − start, or CPU end − enqueue
        dur[(dns < 0) | ~(gpu | (ts == TimingSource.KERNEL_CPU))] = np.nan
        bucket = np.searchsorted(_BOUNDS, dur, side="left").astype(np.uint8)
        bucket[np.isnan(dur)] = N_BUCKETS          # untimed: outside the histogram
        return {"kc": kc, "seq": (ev["seq_number"] & _M40).view(np.int64), "dur": dur, "bytes": nb,
                "rel": rel_ns * 1e-9, "rank": ev["rank"], "nranks": ev["nranks"], "nnodes": ev["nnodes"],
                "tcv": ev["tuner_config_version"], "host": host, "bucket": bucket}

    def _refuse_durations(self, dur: np.ndarray, ts: np.ndarray, gpu: np.ndarray) -> None:
        """Timed records whose duration is negative (NaN by now) or over ``max_duration_s`` (a
        broken clock or timer): kept as untimed records and counted (they would move a window's
        mean, its ranks' finish offsets and its histogram by days)."""
        timed = gpu | (ts == TimingSource.KERNEL_CPU)
        neg = timed & np.isnan(dur)
        with np.errstate(invalid="ignore"):
            long_ = dur > self.config.max_duration_s
        if long_.any():
            dur[long_] = np.nan
        n_neg, n_long = int(neg.sum()), int(long_.sum())
        if n_neg or n_long:
            self.metrics.durations_refused_add(n_neg, n_long)

    def _append(self, w: int, cols: dict[str, np.ndarray], idx: np.ndarray | None, m: int) -> None:
        """Append ``m`` records (rows ``idx`` of ``cols``, or all) to window ``w``, keeping the
        bounds: a window holds at most ``max_window_records``, all open windows together at most
        ``max_buffered_records``. The excess (the batch's last records) is dropped and counted."""
        win = self._open.get(w)
        n = 0 if win is None else win.n
        if n + m > self._max_win or self._buffered + m > self._max_buf:
            room = min(self._max_win - n, self._max_buf - self._buffered)  # >= 0: the bounds hold
            per_window = self._max_win - n <= self._max_buf - self._buffered
            self._overflow(w, m - room, ("max_window_records", self._max_win) if per_window
                           else ("max_buffered_records", self._max_buf))
            if self.config.wait_streams:         # their communicators' waits withheld in w (wait_window.py)
                gone = (cols["kc"][max(room, 0):m] if idx is None else cols["kc"][idx[max(room, 0):]]) >> 16
                job = self.gcomms.values[int(gone[0])][0]          # one batch: one job
                self._waits.dropped(job, gone, self.metrics, "window_full", w)
            if room <= 0:
                return
            idx = np.arange(room) if idx is None else idx[:room]
            m = room
        if win is None:
            # size like the last closed window (few regrowths), small when many are open at once;
            # np.empty pages are only committed when written, so a generous capacity costs no RSS
            cap = max(self._cap_hint, 1 << 20) if len(self._open) < 3 else 4 * m
            win = self._open[w] = _Window(min(max(cap, m), self._max_win))
        win.append(cols, idx, limit=self._max_win)
        self._buffered += m

    def _overflow(self, w: int, n_drop: int, bound: tuple[str, int]) -> None:
        self.metrics.drop("window_full", n_drop)
        if bound[0] not in self._full_logged:  # once per bound, not per batch or record
            self._full_logged.add(bound[0])
            log.warning("window %d: %s=%d reached (%d records buffered in %d open windows); further "
                        "records are dropped and counted in dynamiccl_collector_records_dropped_total"
                        "{reason=\"window_full\"} (logged once)", w, *bound, self._buffered, len(self._open))

    # -- closing -------------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        """Idle flush: when nothing arrived for ``idle_flush_s``, close every window the wall clock
        (plus ``max_clock_ahead_s``) has reached. Windows further ahead (a host whose clock runs ahead,
        forged event times) stay open until it reaches them: closing them would mark every window
        before them closed, and every on-time record arriving afterwards would be late."""
        now = self._clock() if now is None else now
        with self._lock:
            if self._open and now - self._last_arrival >= self.config.idle_flush_s:
                due = (int(self._wall_clock() * 1e9) + self._ahead_ns) // self._window_ns
                for w in sorted(self._open):
                    if w >= due:
                        break
                    self._close(w)
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
        win = self._open.pop(w)
        self._closed_upto = max(self._closed_upto or 0, w + 1)
        n = win.n
        self._buffered -= n
        self._cap_hint = min(int(n * 1.25) + 1024, 1 << 24, self._max_win)
        try:
            view = win.view()
            result = aggregate_window(view, window_start_ns=w * self._window_ns,
                                      window_s=self.config.window_s, aggregator=self)
            if self.config.wait_streams:
                result.features = self._waits.close(self, result, view, w)
        except Exception:
            log.exception("window %d: aggregation failed (%d records dropped)", w, n)
            self.metrics.drop("aggregation_error", n)
            return
        finally:
            win.cols.clear()
        m = self.metrics
        m.add("aggregated", n)
        m.add("windows_emitted", 1)
        with m._lock:
            m.last_window_end_s = (w + 1) * self.config.window_s
        result.features.counters.update(_counters(m, n))
        self.next_consumer.consume(result)

    def _realign(self) -> None:
        """New host clock corrections (processors/clock_align.py), counted and logged."""
        m = self.metrics
        m.add("clock_corrected", self._align.corrected - self._corrected_seen)
        self._corrected_seen = self._align.corrected
        for h, step in self._align.update():
            m.add("clock_steps", 1)
            log.warning("host %s: clock stepped %+.3f s against its peers' collective finishes; its records' "
                        "times are corrected (dynamiccl_collector_clock_steps_total)",
                        self.hosts.values[h] if h < len(self.hosts.values) else h, step / 1e9)

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
