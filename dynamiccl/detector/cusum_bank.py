from __future__ import annotations

import numpy as np
from river import base

from ._baseline import robust_baseline
from .cusum import CUSUM, _validate_and_derive
from .cusum_bank_streams import StreamManagement

__all__ = ["CUSUMBank"]


class CUSUMBank(StreamManagement, base.Base):
    r"""Many independent `CUSUM` detectors updated together with one numpy call per step.

    Stream ``j`` of the bank behaves exactly like its own ``CUSUM`` with the same
    hyperparameters fed the values ``x[j]`` of successive `update_many` calls: same robust
    warm-up baseline, same Siegmund-calibrated threshold, same winsorisation, same handling of
    invalid values (NaN marks "no sample for this stream in this step"), same self-reset on the
    step after an alarm. Alarm indices are identical (the tests check this).

    Parameters
    ----------
    n_streams
        Number of independent streams (e.g. one per (communicator, collective, size bucket)).
    delta, arl0, warmup, mode, min_value, max_value, z_clip, estimator
        As in `CUSUM`, shared by all streams.

    Attributes
    ----------
    drift_detected
        Boolean array of shape ``(n_streams,)``: which streams alarmed on the last step.
    statistic_up, statistic_down
        Arrays of the current $S^+$ / $S^-$ statistics.
    change_start
        Int array: step index of the first sample of the alarming excursion of each stream's
        last alarm, -1 if none yet.
    direction
        Int8 array: +1 (up), -1 (down) for each stream's last alarm, 0 if none yet.
    magnitude
        Float array: estimated signed shift of each stream's last alarm in baseline standard
        deviations (NaN if none yet).

    Notes
    -----
    Memory is ``n_streams * (warmup + 16) * 8`` bytes, dominated by the warm-up buffer.
    Streams come and go, and get their own thresholds and baselines, through the methods of
    `dynamiccl.detector.cusum_bank_streams.StreamManagement` (``grow``, ``set_threshold``, ...).

    Examples
    --------
    Three latency streams on very different scales; only stream 1 changes, at step 600:

    >>> import numpy as np
    >>> from dynamiccl.detector import CUSUMBank
    >>> rng = np.random.default_rng(4)
    >>> scales = np.array([1e-6, 1e-3, 1.0])
    >>> bank = CUSUMBank(n_streams=3)
    >>> for t in range(1200):
    ...     x = scales * (10.0 + rng.standard_normal(3))
    ...     if t >= 600:
    ...         x[1] += 2e-3
    ...     bank.update_many(x)
    ...     for j in np.flatnonzero(bank.drift_detected):
    ...         print(f"Change detected at index {t} in stream {j}, "
    ...               f"started at {bank.change_start[j]}")
    Change detected at index 605 in stream 1, started at 600

    """

    _VALID_MODES = CUSUM._VALID_MODES

    def __init__(
        self,
        n_streams: int = 1,
        delta: float = 1.0,
        arl0: float = 10_000.0,
        warmup: int = 200,
        mode: str = "both",
        min_value: float | None = 0.0,
        max_value: float | None = None,
        z_clip: float | None = None,
        estimator: str = "mad",
    ):
        self.n_streams = n_streams
        self.delta = delta
        self.arl0 = arl0
        self.warmup = warmup
        self.mode = mode
        self.min_value = min_value
        self.max_value = max_value
        self.z_clip = z_clip
        self.estimator = estimator
        self.narrow_scale = False        # `baseline.diff_scale`: the warm-up scale narrowed by `warmup_scale`
        self.n_scale_narrowed = 0        # streams whose warm-up scale that rule narrowed

        if not (isinstance(n_streams, int) and not isinstance(n_streams, bool) and n_streams >= 1):
            raise ValueError(f"n_streams must be an int >= 1, got {n_streams!r}")
        self._k, self._h, self._clip = _validate_and_derive(
            delta, arl0, warmup, mode, min_value, max_value, z_clip, self._VALID_MODES, estimator
        )
        self._h_default = self._h
        self._use_up = mode in ("both", "up")
        self._use_down = mode in ("both", "down")

        n = n_streams
        self._n_seen = 0
        self._buf = np.zeros((n, warmup), dtype=np.float64)
        self._nbuf = np.zeros(n, dtype=np.int64)
        self._monitoring = np.zeros(n, dtype=bool)
        self._n_warming = n
        self._median = np.zeros(n, dtype=np.float64)
        self._scale = np.full(n, np.nan, dtype=np.float64)
        self._inv_scale = np.zeros(n, dtype=np.float64)
        self._s_up = np.zeros(n, dtype=np.float64)
        self._s_down = np.zeros(n, dtype=np.float64)
        self._run_up = np.zeros(n, dtype=np.int64)
        self._run_down = np.zeros(n, dtype=np.int64)
        self._start_up = np.full(n, -1, dtype=np.int64)
        self._start_down = np.full(n, -1, dtype=np.int64)
        self._detected = np.zeros(n, dtype=bool)
        self._any_detected = False
        self._n_invalid = np.zeros(n, dtype=np.int64)
        self._n_clipped = np.zeros(n, dtype=np.int64)
        self._n_outliers = np.zeros(n, dtype=np.int64)
        self._pending = np.zeros(n, dtype=np.float64)  # held extreme value (+/- clip), 0 = none
        self._pending_index = np.full(n, -1, dtype=np.int64)
        self._n_pending = 0
        self._n_detections = np.zeros(n, dtype=np.int64)
        self._change_start = np.full(n, -1, dtype=np.int64)
        self._direction = np.zeros(n, dtype=np.int8)
        self._magnitude = np.full(n, np.nan, dtype=np.float64)

    # ------------------------------------------------------------------ read-only state
    # Arrays are returned as read-only views: cheap, and callers cannot corrupt the state.
    @staticmethod
    def _ro(a: np.ndarray) -> np.ndarray:
        v = a.view()
        v.flags.writeable = False
        return v

    @property
    def drift_detected(self) -> np.ndarray:
        return self._ro(self._detected)

    @property
    def threshold(self):
        """Decision threshold h in standard-deviation units: a float (the same for every
        stream), or a read-only array of shape ``(n_streams,)`` once `set_threshold` gave
        some streams their own."""
        return self._h if np.ndim(self._h) == 0 else self._ro(self._h)

    @property
    def statistic_up(self) -> np.ndarray:
        return self._ro(self._s_up)

    @property
    def statistic_down(self) -> np.ndarray:
        return self._ro(self._s_down)

    @property
    def warming_up(self) -> np.ndarray:
        return ~self._monitoring

    @property
    def baseline(self) -> tuple[np.ndarray, np.ndarray]:
        """(median, scale) arrays; scale is NaN for streams still warming up."""
        scale = np.where(self._monitoring, self._scale, np.nan)
        return self._ro(self._median), scale

    @property
    def change_start(self) -> np.ndarray:
        return self._ro(self._change_start)

    @property
    def direction(self) -> np.ndarray:
        return self._ro(self._direction)

    @property
    def magnitude(self) -> np.ndarray:
        return self._ro(self._magnitude)

    @property
    def n_seen(self) -> int:
        return self._n_seen

    @property
    def n_invalid(self) -> np.ndarray:
        return self._ro(self._n_invalid)

    @property
    def n_clipped(self) -> np.ndarray:
        return self._ro(self._n_clipped)

    @property
    def n_outliers(self) -> np.ndarray:
        return self._ro(self._n_outliers)

    @property
    def n_detections(self) -> np.ndarray:
        return self._ro(self._n_detections)

    # ------------------------------------------------------------------ update
    def update_many(self, x) -> None:
        """Feed one value per stream; then read `drift_detected` (a boolean array).

        Parameters
        ----------
        x
            Array-like of shape ``(n_streams,)``. NaN (or any invalid value) means the
            stream has no sample this step; it is counted in `n_invalid` and skipped.

        """
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.n_streams,):
            raise ValueError(f"expected an array of shape ({self.n_streams},), got {x.shape}")
        t = self._n_seen
        self._n_seen = t + 1

        if self._any_detected:
            self._reset_streams(self._detected)

        valid = np.isfinite(x)
        if self.min_value is not None:
            valid &= x >= self.min_value
        if self.max_value is not None:
            valid &= x <= self.max_value
        all_valid = bool(valid.all())
        if not all_valid:
            self._n_invalid += ~valid

        if self._n_warming:
            # The sample that completes a warm-up is not monitored (as in `CUSUM`).
            mon = valid & self._monitoring
            self._warm_step(x, valid & ~mon)
            all_mon = False
        else:
            mon = valid
            all_mon = all_valid
        if not all_mon and not mon.any():
            return

        with np.errstate(invalid="ignore", over="ignore"):
            z = (x - self._median) * self._inv_scale
        extreme = np.abs(z) > self._clip  # NaN compares False
        if not all_mon:
            extreme &= mon
        if self._n_pending == 0 and not extreme.any():
            fired = self._apply(z, mon, all_mon, t)
        else:
            fired = self._apply_with_outliers(z, mon, extreme, t)
        if fired is not None and fired.any():
            self._record_alarms(fired)

    def _apply_with_outliers(self, z, mon, extreme, t):
        """Slow path of `update_many` when extreme values are held or arrive (see `CUSUM`)."""
        c = self._clip
        zc = np.where(z > 0.0, c, -c)
        held = self._pending != 0.0
        pair = extreme & held & (self._pending == zc)  # 2nd extreme in a row: apply both
        dropped = held & mon & ~pair  # the held value was isolated
        self._n_outliers += dropped
        self._n_clipped += 2 * pair
        new_held = extreme & ~pair

        fired_first = None
        if pair.any():
            fired_first = self._apply(self._pending.copy(), pair, False, self._pending_index.copy())
        step = mon & ~new_held
        if fired_first is not None:
            step &= ~fired_first
        fired = self._apply(np.where(pair, zc, z), step, False, t)

        self._pending[pair | dropped] = 0.0
        self._pending[new_held] = zc[new_held]
        self._pending_index[new_held] = t
        self._n_pending = int(np.count_nonzero(self._pending))
        if fired_first is not None and fired is not None:
            fired |= fired_first
        return fired

    def _apply(self, z, mon, all_mon, t):
        """One CUSUM step on the streams in ``mon``; return the alarm mask (or None)."""
        fired = None
        if self._use_up:
            fired = self._side(z, mon, all_mon, t, self._s_up, self._run_up, self._start_up, 1.0)
        if self._use_down:
            fired_down = self._side(z, mon, all_mon, t, self._s_down, self._run_down,
                                    self._start_down, -1.0)
            fired = fired_down if fired is None else fired | fired_down
        return fired

    def _side(self, z, mon, all_mon, t, s, run, start, sign):
        """Advance one side's statistic in place; return the boolean array of alarms."""
        new = s + z if sign > 0 else s - z
        new -= self._k
        pos = new > 0.0
        np.maximum(new, 0.0, out=new)
        starting = pos & (run == 0)
        new_run = np.where(pos, run + 1, 0)
        if all_mon:
            s[:] = new
            run[:] = new_run
            np.copyto(start, t, where=starting)
        else:
            np.copyto(s, new, where=mon)
            np.copyto(run, new_run, where=mon)
            np.copyto(start, t, where=starting & mon)
        fired = s >= self._h
        if not all_mon:
            fired &= mon
        return fired

    def _warm_step(self, x: np.ndarray, warm: np.ndarray) -> None:
        idx = np.flatnonzero(warm)
        if idx.size == 0:
            return
        pos = self._nbuf[idx]
        self._buf[idx, pos] = x[idx]
        pos += 1
        self._nbuf[idx] = pos
        done = idx[pos >= self.warmup]
        if done.size:
            med, scale = robust_baseline(self._buf[done], self.estimator)
            if self.narrow_scale:
                scale = self._narrowed(self._buf[done], scale)
            self._median[done] = med
            self._scale[done] = scale
            self._inv_scale[done] = 1.0 / scale
            self._monitoring[done] = True
            self._n_warming -= done.size

    def _narrowed(self, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """The warm-up scale narrowed to its lagged differences' (`dynamiccl.detector.warmup_scale`)."""
        from .warmup_scale import narrowed_scale
        new = narrowed_scale(values, scale)
        self.n_scale_narrowed += int(np.count_nonzero(new < scale))
        return new

    def _record_alarms(self, fired: np.ndarray) -> None:
        idx = np.flatnonzero(fired)
        k = self._k
        if self._use_up and self._use_down:
            up = self._s_up[idx] >= self._s_down[idx]
            h = self._h if np.ndim(self._h) == 0 else self._h[idx]
            up &= self._s_up[idx] >= h
            up |= self._s_down[idx] < h
        else:
            up = np.full(idx.size, self._use_up)
        s_up, s_dn = self._s_up[idx], self._s_down[idx]
        with np.errstate(divide="ignore", invalid="ignore"):
            mag_up = k + s_up / self._run_up[idx]
            mag_dn = -(k + s_dn / self._run_down[idx])
        self._magnitude[idx] = np.where(up, mag_up, mag_dn)
        self._change_start[idx] = np.where(up, self._start_up[idx], self._start_down[idx])
        self._direction[idx] = np.where(up, 1, -1)
        self._n_detections[idx] += 1
        self._detected[idx] = True
        self._any_detected = True

    def _reset_streams(self, mask: np.ndarray) -> None:
        idx = np.flatnonzero(mask)
        self._nbuf[idx] = 0
        self._monitoring[idx] = False
        self._n_warming += idx.size
        self._median[idx] = 0.0
        self._scale[idx] = np.nan
        self._inv_scale[idx] = 0.0
        self._clear_statistics(idx)
        self._any_detected = False

    @classmethod
    def _unit_test_params(cls):
        yield {"n_streams": 4}
        yield {"n_streams": 2, "delta": 0.5, "arl0": 1e5, "warmup": 500, "mode": "up"}
