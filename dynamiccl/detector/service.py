"""The detector in process: `Detector.process(window) -> list[RegimeChange]`.

>>> from dynamiccl.detector.service import Detector
>>> from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
>>> det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
>>> det.process("not a window")
[]
>>> det.metrics.value("dynamiccl_detector_windows_dropped_total", reason="malformed")
1.0

Everything a window can do wrong is counted and skipped; `process` never raises after
construction (an internal error drops the window, logs it and counts it).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable, Iterable

import numpy as np
import polars as pl
from prometheus_client import CollectorRegistry

from dynamiccl.collector.features import WindowFeatures

from .config import DetectorConfig
from .events import RegimeChange, TransientEnd
from .fusion import Fusion
from .metrics import MAX_COMMS_PER_CHANGE, ActiveRegimes, DetectorMetrics, SUPPRESS_REASONS
from .straggler import RankHistory
from .where_refresh import WhereRefresh, WhereUpdate, as_evidence
from .streams import StreamTable
from .where import locate
from .window_vector import job_vectors

__all__ = ["Detector"]

log = logging.getLogger("detector")

_KEY_COLUMNS = ("job_id", "comm_name", "func", "algo", "proto", "comm_hash", "size_bucket", "nnodes",
                "records", "instances", "bytes_total", "lat_p50_s")
_RANK_COLUMNS = ("job_id", "comm_hash", "rank", "host", "shortest_count")
CLOCK_RESET_WINDOWS = 30   # this many out-of-order windows in a row: accept the new timeline


class Detector:
    """Per-stream CUSUM banks + autoencoder + fusion over the collector's feature stream.

    Parameters
    ----------
    config
        `DetectorConfig` (validated here).
    registry
        prometheus_client registry for the metrics (a private one by default).
    clock
        Wall clock for the processing-time histogram (injected in tests).
    """

    def __init__(self, config: DetectorConfig | None = None, *, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = (config or DetectorConfig()).validate()
        self.metrics = DetectorMetrics(registry)
        self.table = StreamTable(self.config)
        self.ranks = RankHistory(self.config.streams.history)
        self.fusion = Fusion(self.config, self.table, self.ranks)
        self._clock = clock
        self._last_start: float | None = None
        self._ooo = 0
        self._errors = 0
        self._ae: dict[str, object] = {}
        self._ae_ok = self.config.autoencoder.enabled
        self._ae_scores: dict[str, tuple[float, float]] = {}
        self._regimes = ActiveRegimes(self.metrics.regime_active, self.metrics.regime_magnitude)
        self._stat_labels: dict[str, set] = {}
        self._suppressed_seen = {k: 0 for k in SUPPRESS_REASONS}
        self._rank_set_kept_seen = 0
        self.windows = 0
        self.changes: list[RegimeChange] = []   # the last 1000, for inspection
        # the transients the last window closed (`TransientEnd`): not regime changes, so not in
        # `process`'s result; the loop hands them to the retuner alone
        self.ended: list[TransientEnd] = []
        # newer `where` verdicts on changes already reported (`dynamiccl.detector.where_refresh`): the
        # last window's, beside its changes; the loop hands them on
        self.where_refresh = WhereRefresh(self.config.straggler.where_refresh_windows)
        self.where_updates: list[WhereUpdate] = []
        self._max_kept = 1000

    # ------------------------------------------------------------------ public
    @property
    def active(self) -> list[RegimeChange]:
        """Changes not yet recovered (per job, oldest first)."""
        return self.fusion.active_changes()

    def process_many(self, windows: Iterable[WindowFeatures]) -> list[RegimeChange]:
        out: list[RegimeChange] = []
        for wf in windows:
            out.extend(self.process(wf))
        return out

    def process(self, wf: WindowFeatures) -> list[RegimeChange]:
        m = self.metrics
        self.ended = []
        self.where_updates = []
        m.windows_received.inc()
        reason = _malformed(wf)
        if reason:
            log.debug("window dropped: %s", reason)
            m.windows_dropped.labels(reason="malformed").inc()
            return []
        if self._last_start is not None and wf.window_start <= self._last_start:
            self._ooo += 1
            if self._ooo < CLOCK_RESET_WINDOWS:
                m.windows_dropped.labels(reason="out_of_order").inc()
                return []
            log.warning("event time went back %.1f s for %d windows: accepting the new timeline",
                        self._last_start - wf.window_start, self._ooo)
        self._ooo = 0
        self._last_start = float(wf.window_start)
        t0 = self._clock()
        try:
            changes = self._process(wf)
        except Exception:  # never crash the service on one window
            self._errors += 1
            if self._errors == 1 or self._errors % 1000 == 0:   # the traceback once, then a count
                log.exception("window at %.3f dropped: internal error (%d so far)", wf.window_start,
                              self._errors)
            m.windows_dropped.labels(reason="error").inc()
            return []
        m.processing.observe(self._clock() - t0)
        return changes

    # ------------------------------------------------------------------ internals
    def _process(self, wf: WindowFeatures) -> list[RegimeChange]:
        m, cfg = self.metrics, self.config
        self.windows += 1
        ws = self.table.update(wf)
        self.ranks.add(ws.t, wf.ranks, float(wf.window_start))
        ae = self._autoencode(wf)
        window_s = float(wf.window_s) if wf.window_s and wf.window_s > 0 else 1.0
        self.where_updates = self.where_refresh.step(self.ranks, ws.t, window_s,
                                                     float(wf.window_start) + window_s)
        changes = [self._locate(c, ws.t, float(wf.window_start), window_s)
                   for c in self.fusion.process(ws, window_s, ae)]
        for reason, n in ws.invalid.items():
            m.values_invalid.labels(reason=reason).inc(n)
        if ws.rebased.size:
            m.rebaselined.inc(int(ws.rebased.size))
        kept = self.table.n_rank_set_kept - self._rank_set_kept_seen
        if kept:
            m.rank_set_kept.inc(kept)
            self._rank_set_kept_seen = self.table.n_rank_set_kept
        for k in SUPPRESS_REASONS:
            v = self.fusion.counters.get(k, 0)
            d = v - self._suppressed_seen[k]
            if d:
                m.suppressed.labels(reason=k).inc(d)
                self._suppressed_seen[k] = v
        m.streams.set(self.table.n_active)
        for c in changes:
            self._publish(c)
        while self.fusion.ended:     # transients: over without a recovery of their own
            te = self.fusion.ended.popleft()
            for cid in te.ends:
                self._regimes.end(cid)
            self.ended.append(te)
        if self.windows % max(1, int(round(1.0 / window_s))) == 0:
            self._export_statistics()
        return changes

    def _locate(self, c: RegimeChange, step: int, window_start: float, window_s: float) -> RegimeChange:
        """A degradation names the rank or link its ranks' offsets point at (`dynamiccl.detector.where`)
        first in ``ranks``, with the verdict in ``evidence["where"]``; a straggler keeps the rank
        its peers wait for (the verdict goes into its evidence only: on the simulated suite the
        offsets' rank was the straggler less often, top-1 0.917 against 0.972)."""
        if c.kind == "recovery" or not c.comms:
            return c
        # the onset's window by its start time (windows without data are no steps)
        onset = self.ranks.step_at(c.start_s)
        if onset is None or onset > step:
            onset = step - int(round((window_start - c.start_s) / window_s))
        comms = [int(x, 16) for x in c.comms]
        try:
            hit = locate(self.ranks, c.job_id, comms, onset_step=onset, now_step=step, window_s=window_s,
                         counters=self.where_refresh.counters)
        except ValueError:
            hit = None
        self.where_refresh.watch(c.id, c.job_id, comms, onset, as_evidence(*hit) if hit else None)
        if hit is None:
            return c
        comm, w = hit
        self.metrics.localised.labels(kind=w.kind).inc()
        evidence = {**c.evidence, "where": as_evidence(comm, w)}
        if c.kind == "straggler":
            return dataclasses.replace(c, evidence=evidence)
        ranks = [w.rank] + [r for r in c.ranks if r != w.rank]
        return dataclasses.replace(c, ranks=ranks, evidence=evidence)

    def _publish(self, c: RegimeChange) -> None:
        m = self.metrics
        m.regime_changes.labels(kind=c.kind).inc()
        if c.kind == "recovery":
            for cid in c.evidence.get("ends", [c.recovers]):
                self._regimes.end(cid)
        else:
            m.detection_delay.observe(max(0.0, c.detected_s - c.start_s))
            where = _where(c)
            self._regimes.start(c.id, [(c.job_id, c.kind, comm, where) for comm in (c.comm_names[:MAX_COMMS_PER_CHANGE] or [""])],
                                c.magnitude)
        self.changes.append(c)
        if len(self.changes) > self._max_kept:
            del self.changes[: len(self.changes) - self._max_kept]

    def _autoencode(self, wf: WindowFeatures) -> dict[str, tuple[float, float]]:
        if not self._ae_ok:
            return {}
        cfg = self.config
        out = {}
        for job, vec in job_vectors(wf.keys).items():
            ae = self._ae.get(job)
            if ae is None:
                if len(self._ae) >= 1024:
                    continue
                try:
                    from .autoencoder import Autoencoder, _import_torch
                    torch = _import_torch()
                    if torch.get_num_threads() > 1:
                        # one small model per window: thread pools only add contention (35x
                        # slower learn_one on a busy 2-core machine)
                        torch.set_num_threads(1)
                    ae = self._ae[job] = Autoencoder(grace_period=cfg.autoencoder.grace, window_size=500,
                                                     seed=cfg.autoencoder.seed)
                except ImportError as exc:
                    log.warning("autoencoder disabled: %s", exc)
                    self._ae_ok = False
                    return {}
            score = ae.score_one(vec)
            ae.learn_one(vec)
            thr = ae.threshold
            self.metrics.autoencoder_score.labels(job_id=job).set(score)
            if ae.n_learned >= cfg.autoencoder.grace and math.isfinite(thr):
                out[job] = (score, thr)
        self._ae_scores = out
        return out

    def _export_statistics(self) -> None:
        tab = self.table
        n = tab.n
        if n == 0:
            return
        stat = tab.statistic()[:n]
        live = np.flatnonzero(tab.active[:n] & np.isfinite(stat))
        if live.size == 0:
            return
        K = self.config.outputs.top_statistics
        codes = tab.job_code[live]
        new: dict[str, set] = {}
        order = np.argsort(codes, kind="stable")
        bounds = np.flatnonzero(np.diff(codes[order])) + 1
        for part in np.split(live[order], bounds):
            sel = part
            if sel.size > K:
                sel = sel[np.argpartition(-stat[sel], K - 1)[:K]]
            job = tab.job[sel[0]]
            labels = new.setdefault(job, set())
            for i in sel.tolist():
                lab = (job, tab.comm_name[i], tab.func[i], str(int(tab.size_bucket[i])))
                labels.add(lab)
                self.metrics.cusum_statistic.labels(*lab).set(float(stat[i]))
        for job, old in self._stat_labels.items():
            for lab in old - new.get(job, set()):
                try:
                    self.metrics.cusum_statistic.remove(*lab)
                except KeyError:
                    pass
        self._stat_labels = new


def _where(c: RegimeChange) -> str:
    if c.kind == "straggler" and c.ranks:
        return f"rank {c.ranks[0]}@{c.hosts[0] if c.hosts else '?'}"
    if c.hosts:
        h = c.hosts[:3]
        return ",".join(h) + (f"+{len(c.hosts) - 3}" if len(c.hosts) > 3 else "")
    return ",".join(f"{f} 2^{b}" for f in c.funcs[:1] for b in c.size_buckets[:3])


def _malformed(wf) -> str | None:
    if not isinstance(wf, WindowFeatures):
        return f"not a WindowFeatures ({type(wf).__name__})"
    try:
        ws = float(wf.window_start)
    except (TypeError, ValueError):
        return "window_start is not a number"
    if not math.isfinite(ws):
        return "window_start is not finite"
    if not isinstance(wf.keys, pl.DataFrame) or not isinstance(wf.ranks, pl.DataFrame):
        return "keys/ranks are not polars frames"
    missing = [c for c in _KEY_COLUMNS if c not in wf.keys.columns]
    if missing:
        return f"keys frame lacks {missing}"
    missing = [c for c in _RANK_COLUMNS if c not in wf.ranks.columns]
    if missing and wf.ranks.height:
        return f"ranks frame lacks {missing}"
    waits = getattr(wf, "waits", None)       # optional: the wait streams (`wait_streams`)
    if waits is not None:
        if not isinstance(waits, pl.DataFrame):
            return "waits is not a polars frame"
        missing = [c for c in _KEY_COLUMNS if c not in waits.columns]
        if missing and waits.height:
            return f"waits frame lacks {missing}"
    return None
