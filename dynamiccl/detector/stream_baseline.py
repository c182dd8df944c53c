"""The stream table's baselines and thresholds: the banks' statistic, restoring and adopting
known baselines, the self-starting standardisation and learning, and the per-stream ARL0."""
from __future__ import annotations

import numpy as np

from .step_rate import floor as step_floor
from .warmup_split import split_warmups

__all__ = ["StreamBaselines", "KNOWN_BASELINE", "FIXED_BASELINE_MIN"]

_GROW = 1024
KNOWN_BASELINE = 10**9   # sample count standing for a known baseline in `dynamiccl.detector.arl`
FIXED_BASELINE_MIN = 60  # a fixed baseline's threshold is calibrated for at least this many samples


class StreamBaselines:
    """Mixin of `StreamTable`: baseline state lives in its banks and `SelfStart`."""

    def statistic(self) -> np.ndarray:
        """max(S+, S-) / h over banks, per slot (NaN while warming up): ≥ 1 fires."""
        out = None
        for bank in self.banks:
            s = np.maximum(bank.statistic_up, bank.statistic_down) / bank.threshold
            out = s if out is None else np.maximum(out, s)
        out = out.astype(np.float64)
        out[self.banks[0].warming_up] = np.nan
        return out

    def baseline(self, idx) -> tuple[np.ndarray, np.ndarray]:
        med, scale = self.banks[0].baseline
        return med[idx], scale[idx]

    def restore_baseline(self, idx, median, scale) -> None:
        """Monitor ``idx`` against a known (e.g. pre-change) baseline at once; the baseline a
        stream had when it alarmed comes back with its sample count."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        keep = self.early.resume(idx, self.banks)       # an early alarm's warm-up goes on instead
        if keep.size < idx.size:
            m = np.isin(idx, keep)
            median, scale = (np.broadcast_to(np.asarray(a, np.float64), idx.shape)[m] for a in (median, scale))
            idx = keep
        if idx.size:
            same = self.saved_med[idx] == np.asarray(median, np.float64)
            n = np.maximum(np.where(same, self.saved_n[idx], 0), self.config.baseline.warmup)
            self._adopt(idx, median, scale, n)
            self.monitor_since[idx] = self.t
            self.rebase_warm[idx] = False

    def adopt_level(self, idx, median, scale) -> None:
        """Streams ``idx`` run at a new level (``median``) that becomes their baseline at once
        (`dynamiccl.detector.adopt_improvement`); an open early alarm's pre-onset samples are of
        the old level and are dropped, not resumed."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        if idx.size == 0:
            return
        self.early.release(idx)
        self._adopt(idx, median, scale, np.full(idx.size, self.config.baseline.warmup))
        self.monitor_since[idx] = self.t
        self.rebase_warm[idx] = False

    def adopt_previous(self, idx, median, scale) -> None:
        """Streams ``idx`` were re-baselined for a workload change while re-learning (e.g.
        during an incident): ``median``/``scale`` (the incident's pre-change baseline) become
        the baseline of the workload they left, restored if that workload comes back."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        m = self.old_unknown[idx] & np.isfinite(self.old_bpr[idx])
        idx = idx[m]
        if idx.size == 0:
            return
        self.prev_bpr[idx] = self.old_bpr[idx]
        self.prev_cov[idx] = self.old_cov[idx]
        self.prev_med[idx] = np.broadcast_to(np.asarray(median, np.float64), m.shape)[m]
        self.prev_scale[idx] = np.broadcast_to(np.asarray(scale, np.float64), m.shape)[m]
        self.prev_n[idx] = self.config.baseline.warmup
        self.old_unknown[idx] = False

    def _adopt(self, idx, median, scale, n) -> None:
        """Streams ``idx`` are monitored from now on against (median, scale) learned from ``n``
        samples (statistics cleared; the scale floored at ``scale_floor``)."""
        for bank in self.banks:
            bank.set_baseline(idx, median, np.maximum(scale, self._floor(idx)))
        self.ss.start(idx, median, scale, n)
        self.carry_n[idx] = 0
        self.early.monitored(idx)

    def _floor(self, idx) -> np.ndarray:
        """Per stream ``idx``: the smallest baseline scale, ``scale_floor``, or for a step-rate
        stream its count's noise (`dynamiccl.detector.step_rate.floor`)."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        f = np.full(idx.size, self.config.baseline.scale_floor)
        step = self.is_step[idx]
        if step.any():
            f[step] = step_floor(self.instances_ref[idx[step]], self.config.baseline.scale_floor)
        return f

    def _add_early(self, early, fired, direction, start, base_med, base_scale):
        """This window's alarms with the early chart's (`dynamiccl.detector.early`) appended; their
        streams warm up again (their pre-onset samples are kept by the chart)."""
        for bank in self.banks:
            bank.reset_streams(early.idx)
        self.carry_n[early.idx] = 0
        self.rebase_warm[early.idx] = False
        return (np.concatenate([fired, early.idx]), np.concatenate([direction, early.direction]),
                np.concatenate([start, early.start]), np.concatenate([base_med, early.median]),
                np.concatenate([base_scale, early.scale]))

    def _warmups_done(self, warming_before: np.ndarray) -> None:
        """Streams whose warm-up ended this window are monitored from now, on a self-starting
        baseline; a warm-up holding two regimes restarts instead (`warmup_split`)."""
        cfg = self.config
        done = np.flatnonzero(warming_before & ~self.banks[0].warming_up)
        done = split_warmups(self, done)
        self.monitor_since[done] = self.t
        self.early.monitored(done)
        if not done.size:
            return
        med, scale = self.banks[0].baseline
        sc, nv = scale[done], np.full(done.size, cfg.baseline.warmup, np.int64)
        if cfg.baseline.self_start:
            sc, nv = self.ss.pooled_scale(self.carry_scale[done], self.carry_n[done], sc, cfg.baseline.warmup)
        self.ss.start(done, med[done], sc, cfg.baseline.warmup, nv)
        self.carry_n[done] = 0
        moved = done[(sc != scale[done]) | (sc < self._floor(done))]
        if moved.size:
            for bank in self.banks:
                bank.set_baseline(moved, med[moved], np.maximum(np.sqrt(self.ss.var[moved]), self._floor(moved)))
        self.rebase_warm[done] = False

    def _collect_fired(self):
        """This window's alarms of any bank: (fired mask, indices, direction, onset step, and the
        pre-alarm baseline median and scale). Every bank of a fired stream resets (one baseline
        per stream; the next update re-warms all); its scale is carried to the next warm-up."""
        fired_any = self.banks[0].drift_detected.copy()
        for bank in self.banks[1:]:
            fired_any |= bank.drift_detected
        fired = np.flatnonzero(fired_any)
        if not fired.size:
            return fired_any, fired, np.zeros(0, np.int8), np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
        direction = np.zeros(fired.size, np.int8)
        start = np.full(fired.size, -1, np.int64)
        for bank in self.banks:
            # the latest reset point among the banks that fired: the tightest onset estimate
            f = bank.drift_detected[fired]
            direction = np.where(f & (direction == 0), bank.direction[fired], direction)
            start = np.where(f, np.maximum(start, bank.change_start[fired]), start)
        med, scale = self.banks[0].baseline
        base_med, base_scale = med[fired].copy(), scale[fired].copy()
        self.saved_med[fired] = base_med
        self.saved_n[fired] = self.ss.n[fired]
        self.carry_scale[fired] = np.sqrt(self.ss.var[fired])
        self.carry_n[fired] = self.ss.n_var[fired]
        self.ss.n[fired] = 0
        self.rebase_warm[fired] = False
        for bank in self.banks:
            bank.reset_streams(fired)
        return fired_any, fired, direction, start, base_med, base_scale

    # ------------------------------------------------------------------ self-starting baseline
    def _standardise(self, i_ok: np.ndarray, x: np.ndarray, warming: np.ndarray):
        """Replace the values of monitored streams by baseline + scale x u, u their self-starting
        standardised value (`dynamiccl.detector.self_start`), so the banks' known-baseline thresholds hold
        whatever the baseline's sample count. Returns u per ``i_ok`` (NaN: warming up)."""
        if not self.config.baseline.self_start:
            return None
        self._apply_thresholds()
        if i_ok.size == 0:
            return None
        mon = ~warming[i_ok] & ~self._frozen()[i_ok]
        u = np.full(i_ok.size, np.nan)
        if mon.any():
            j = i_ok[mon]
            med, scale = self.banks[0].baseline
            z = (x[j] - med[j]) / scale[j]
            u[mon] = self.ss.standardise(j, z)
            x[j] = med[j] + scale[j] * u[mon]
        return u

    def _learn(self, i_ok: np.ndarray, x_valid: np.ndarray, u: np.ndarray, fired: np.ndarray) -> None:
        """In-control windows (|u| < 3) of monitored streams that did not alarm join their
        baselines. Windows are not held back while a chart is in an excursion: learning only the
        values below it biases the baseline low and doubled the false-alarm rate (measured,
        `tests/detector/test_streams.py`); a real shift is absorbed at 1/n per window only."""
        quiet = (np.isfinite(u) & self._learnable & ~fired[i_ok] & (self.monitor_since[i_ok] < self.t)
                 & ~self._frozen()[i_ok])
        learned = self.ss.learn(i_ok, x_valid, np.where(np.isfinite(u), u, np.inf), quiet)
        j = i_ok[learned]
        if j.size:
            scale = np.maximum(np.sqrt(self.ss.var[j]), self._floor(j))
            for bank in self.banks:
                bank.move_baseline(j, self.ss.mean[j], scale)
            self.n_refined += int(j.size)

    def _retarget(self) -> None:
        """Per-stream ARL0 so that all streams together false-alarm about
        ``stream_false_alarms_per_day`` times a day (a union bound; the fusion stage filters
        further). Changed only in factors of 2, so thresholds rarely move."""
        cfg = self.config
        per_day = 86400.0 / getattr(self, "_window_s", 1.0)
        want = max(cfg.cusum.arl0, self.n_active * per_day / cfg.cusum.stream_false_alarms_per_day)
        if want > 2.0 * self.arl0 or want < 0.5 * self.arl0:
            self.arl0 = want
            self._set_thresholds()

    def _frozen(self) -> np.ndarray:
        """Self-starting baselines that have learnt ``self_start_until`` windows: fixed from then on."""
        until = self.config.baseline.self_start_until
        if not until:
            return np.zeros(self.capacity, bool)
        return self.ss.n[: self.capacity] >= until

    def _apply_thresholds(self) -> None:
        """Per stream: the known-baseline threshold while a self-starting baseline learns, the
        fixed-baseline one once it is frozen."""
        frozen = self._frozen()
        if not frozen.any() and not self._any_frozen:
            return
        self._any_frozen = bool(frozen.any())
        every = np.arange(self.capacity)
        for bank, hk, hf in zip(self.banks, self._h_known, self._h_fixed):
            bank.set_threshold(np.where(frozen, hf, hk), every)

    def _set_thresholds(self) -> None:
        """h for the per-stream ARL0: with ``self_start``, the known-baseline one (the
        standardisation accounts for the baseline's estimation error, `dynamiccl.detector.self_start`);
        else the one for a fixed baseline from max(warmup, 60) samples (below ~60 the exact
        correction explodes: h = 1,600 sigma at 20 samples)."""
        from .arl import cusum_threshold_correlated
        cfg = self.config
        def h(bank, n):
            return cusum_threshold_correlated(float(self.arl0), bank.delta / 2.0, n,
                                              cfg.cusum.long_run_variance, True, cfg.baseline.estimator)
        fixed_n = max(cfg.baseline.self_start_until or cfg.baseline.warmup, cfg.baseline.warmup, FIXED_BASELINE_MIN)
        self._h_fixed = [h(bank, fixed_n) for bank in self.banks]
        self._h_known = ([h(bank, KNOWN_BASELINE) for bank in self.banks] if cfg.baseline.self_start
                         else self._h_fixed)
        for bank, hk in zip(self.banks, self._h_known):
            bank.set_threshold(hk)
        self._any_frozen = True   # per-stream thresholds are re-applied at the next window
