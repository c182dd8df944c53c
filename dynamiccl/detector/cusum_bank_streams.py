"""`CUSUMBank`'s stream management: streams added, re-thresholded, reset or given a baseline.

Used by the stream table (`dynamiccl.detector.streams`), which owns banks whose streams come and go
and calibrates each stream's false-alarm rate itself. A mixin over the bank's private arrays (they are
created in `CUSUMBank.__init__`), kept apart from the per-step update so each file holds one concern.
"""
from __future__ import annotations

import numpy as np

from .cusum import _validate_and_derive

__all__ = ["StreamManagement"]


class StreamManagement:
    """Methods of `dynamiccl.detector.cusum_bank.CUSUMBank` that change its set of streams or their
    thresholds and baselines between steps (statistics kept unless a method says otherwise)."""

    def grow(self, n_new: int) -> None:
        """Append ``n_new`` fresh streams (warming up, no history); `n_streams` grows by it."""
        if not (isinstance(n_new, (int, np.integer)) and n_new >= 0):
            raise ValueError(f"n_new must be an int >= 0, got {n_new!r}")
        if n_new == 0:
            return
        n = int(n_new)

        def ext(a, fill):
            shape = (n,) + a.shape[1:]
            return np.concatenate([a, np.full(shape, fill, dtype=a.dtype)])

        self._buf = ext(self._buf, 0.0)
        self._nbuf = ext(self._nbuf, 0)
        self._monitoring = ext(self._monitoring, False)
        self._median = ext(self._median, 0.0)
        self._scale = ext(self._scale, np.nan)
        self._inv_scale = ext(self._inv_scale, 0.0)
        for name in ("_s_up", "_s_down", "_pending"):
            setattr(self, name, ext(getattr(self, name), 0.0))
        for name in ("_run_up", "_run_down", "_n_invalid", "_n_clipped", "_n_outliers", "_n_detections"):
            setattr(self, name, ext(getattr(self, name), 0))
        for name in ("_start_up", "_start_down", "_pending_index", "_change_start"):
            setattr(self, name, ext(getattr(self, name), -1))
        self._detected = ext(self._detected, False)
        self._direction = ext(self._direction, 0)
        self._magnitude = ext(self._magnitude, np.nan)
        if np.ndim(self._h) != 0:
            self._h = ext(self._h, self._h_default)
        self._n_warming += n
        self.n_streams += n

    def set_arl0(self, arl0: float) -> None:
        """Retarget every stream's false-alarm rate (the threshold is re-derived; statistics kept).

        The fusion stage raises ``arl0`` as streams are added, so that the false-alarm rate of the
        whole bank stays put (a union bound over streams)."""
        _, h, _ = _validate_and_derive(self.delta, arl0, self.warmup, self.mode, self.min_value,
                                       self.max_value, self.z_clip, self._VALID_MODES,
                                       self.estimator)
        self.arl0 = arl0
        self._h = self._h_default = h

    def set_threshold(self, h, idx=None) -> None:
        """Set the decision threshold directly (σ units; statistics kept).

        Without ``idx``, ``h`` (a number) becomes every stream's threshold. With ``idx``,
        ``h`` (a number or one per index) applies to those streams only, and the others keep
        theirs: the stream table gives a stream whose baseline rests on more samples (a
        more precise estimate) a lower threshold for the same false-alarm rate
        (`dynamiccl.detector.arl.cusum_threshold_estimated`). For callers that calibrate the
        false-alarm rate themselves (the fusion stage floors the baseline scale, so a short
        warm-up's scale error is bounded)."""
        if idx is None:
            if not (isinstance(h, (int, float, np.floating)) and h > 0 and np.isfinite(h)):
                raise ValueError(f"threshold must be a finite number > 0, got {h!r}")
            self._h = self._h_default = float(h)
            return
        idx = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        hv = np.broadcast_to(np.asarray(h, dtype=np.float64), idx.shape)
        if not (np.isfinite(hv).all() and (hv > 0).all()):
            raise ValueError("set_threshold: thresholds must be finite numbers > 0")
        if np.ndim(self._h) == 0:
            self._h = np.full(self.n_streams, self._h, dtype=np.float64)
        self._h[idx] = hv

    def reset_streams(self, idx) -> None:
        """Forget the baseline and statistics of streams ``idx`` (they warm up again)."""
        mask = np.zeros(self.n_streams, dtype=bool)
        mask[np.asarray(idx, dtype=np.int64)] = True
        mask &= self._monitoring | (self._nbuf > 0) | self._detected
        # streams still warming keep counting towards _n_warming; only monitoring ones re-enter
        was_mon = mask & self._monitoring
        idx2 = np.flatnonzero(mask)
        self._nbuf[idx2] = 0
        self._monitoring[idx2] = False
        self._n_warming += int(np.count_nonzero(was_mon))
        self._median[idx2] = 0.0
        self._scale[idx2] = np.nan
        self._inv_scale[idx2] = 0.0
        self._clear_statistics(idx2)

    def set_baseline(self, idx, median, scale) -> None:
        """Monitor streams ``idx`` from now on against the given baseline (zero statistics).

        Used to restore a known baseline (e.g. after a recovery to the pre-change regime)
        without a new warm-up. ``scale`` must be finite and > 0.
        """
        idx = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        median = np.broadcast_to(np.asarray(median, dtype=np.float64), idx.shape)
        scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), idx.shape)
        if not (np.isfinite(median).all() and np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError("set_baseline: median must be finite and scale finite and > 0")
        newly = ~self._monitoring[idx]
        self._n_warming -= int(np.count_nonzero(np.unique(idx[newly])))
        self._monitoring[idx] = True
        self._nbuf[idx] = 0
        self._median[idx] = median
        self._scale[idx] = scale
        self._inv_scale[idx] = 1.0 / scale
        self._clear_statistics(idx)

    def move_baseline(self, idx, median, scale) -> None:
        """Update the baseline of monitored streams ``idx`` in place, statistics kept (a
        self-starting baseline that goes on learning, `dynamiccl.detector.self_start`)."""
        idx = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        median = np.broadcast_to(np.asarray(median, dtype=np.float64), idx.shape)
        scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), idx.shape)
        if not (np.isfinite(median).all() and np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError("move_baseline: median must be finite and scale finite and > 0")
        if not self._monitoring[idx].all():
            raise ValueError("move_baseline: only monitored streams have a baseline to move")
        self._median[idx] = median
        self._scale[idx] = scale
        self._inv_scale[idx] = 1.0 / scale

    def _clear_statistics(self, idx: np.ndarray) -> None:
        self._s_up[idx] = 0.0
        self._s_down[idx] = 0.0
        self._run_up[idx] = 0
        self._run_down[idx] = 0
        self._start_up[idx] = -1
        self._start_down[idx] = -1
        self._pending[idx] = 0.0
        self._pending_index[idx] = -1
        self._n_pending = int(np.count_nonzero(self._pending))
        self._detected[idx] = False

    def warm_samples(self, idx) -> tuple[np.ndarray, np.ndarray]:
        """(samples, counts) of streams ``idx`` still warming up: row ``j`` holds ``counts[j]``
        valid samples first, then NaN (a copy; monitored streams read 0 samples)."""
        idx = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        counts = np.where(self._monitoring[idx], 0, self._nbuf[idx])
        rows = self._buf[idx].copy()
        rows[np.arange(self.warmup)[None, :] >= counts[:, None]] = np.nan
        return rows, counts

    def resume_warmup(self, idx, samples, counts) -> None:
        """Streams ``idx`` warm up again from the first ``counts[j]`` values of ``samples[j]``
        (< warmup of them; statistics cleared): a warm-up that a change interrupted goes on
        from its pre-change samples."""
        idx = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        counts = np.broadcast_to(np.asarray(counts, dtype=np.int64), idx.shape)
        if idx.size == 0:
            return
        if not ((counts >= 0).all() and (counts < self.warmup).all()):
            raise ValueError(f"resume_warmup: counts must be in [0, {self.warmup}), got {counts.tolist()}")
        self.reset_streams(idx)
        width = min(self.warmup, np.asarray(samples).shape[-1])
        self._buf[idx, :width] = np.nan_to_num(np.asarray(samples, dtype=np.float64)[:, :width])
        self._nbuf[idx] = counts

    def full_warmup(self, idx) -> np.ndarray:
        """The warm-up buffers (``warmup`` samples each) that streams ``idx`` were just
        baselined from (a copy; valid only in the window their warm-up completed)."""
        return self._buf[np.atleast_1d(np.asarray(idx, dtype=np.int64))].copy()
