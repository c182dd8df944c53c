from __future__ import annotations

from collections import deque

from river import base

from ._cusum_locate import locate, validate_start_split
from ._cusum_outlier import monitor, validate_outlier_gap
from ._cusum_season import SeasonMemory, validate_seasonal_memory, veto_season
# `_validate_and_derive` is re-exported: `CUSUMBank` and its streams import it from here
from ._cusum_params import _validate_and_derive, derive_constants  # noqa: F401
from ._cusum_relearn import relearn
from ._cusum_settle import validate_growth, validate_min_effective, validate_trend_t
from ._cusum_sign import validate_sign_gate
from ._cusum_trend import validate_trend_veto, veto_trend

__all__ = ["CUSUM"]


class CUSUM(base.DriftDetector):
    r"""Two-sided CUSUM change detector with a robust, self-learned baseline.

    Every valid input is standardised against a robust baseline learnt from its first
    ``warmup`` valid samples (so any scale works: seconds, nanoseconds, bytes/s), and Page's
    CUSUM runs on the standardised value $z_t$:

    $$S^+_t = \max(0, S^+_{t-1} + z_t - k), \qquad S^-_t = \max(0, S^-_{t-1} - z_t - k)$$

    with $k = \delta / 2$; an alarm is raised when $S^+_t \ge h$ or $S^-_t \ge h$. The threshold
    $h$ is solved from the in-control average run length `arl0` (Siegmund's approximation,
    averaged over the baseline's estimation error, re-solved for the warm-up's serial
    correlation and heavy tails when ``serial``): `dynamiccl.detector.arl`. Values enter capped
    at $\pm$ ``z_cap``; the scale is at least ``min_rel_scale`` x |level|. From ``min_warmup``
    samples on the chart is self-starting; after an alarm it resets on the next `update` and
    warms up again. Invalid inputs are counted in `n_invalid` and change nothing else; an
    isolated value beyond ``z_clip`` is dropped (`n_outliers`), two in one direction within
    ``outlier_gap`` valid samples enter winsorised (`n_clipped`). Each rule, with its
    derivation and measurements, is in dynamiccl/detector/README.md ("CUSUM") and its
    ``_cusum_*.py`` part.

    The defaults were chosen on the development half of public labelled data and scored on the
    other half (docs/evaluation/2026-11-27-cusum-public.md). Seasonal series are outside the
    promise (``seasonal_memory`` is an opt-in veto for clear cycles).

    Parameters
    ----------
    delta
        Shift to detect fastest, in baseline standard deviations ($k = \delta / 2$).
    arl0
        Target in-control average run length, in samples (false-alarm rate 1/`arl0`).
    warmup
        Valid samples behind the full baseline, initially and after each detection.
    mode
        ``'both'``, ``'up'`` (increases only) or ``'down'``.
    min_value
        Inputs below this are invalid and skipped; None accepts signed series.
    max_value
        Inputs above this are invalid and skipped; None: no upper bound.
    z_clip
        Limit, in standard deviations, beyond which a value is extreme; None: ``delta + 4``.
    estimator
        The warm-up's baseline: ``'mad'`` or ``'winsorized'`` (`dynamiccl.detector._baseline`).
    serial
        Correct the threshold for the warm-up's autocorrelation and capped-value variance excess.
    z_cap
        Cap, in standard deviations, on every value entering the CUSUM; None: ``delta + 1``.
    min_rel_scale
        Floor of the baseline scale as a fraction of its absolute level (0 disables).
    min_warmup
        Valid samples before the first alarm is possible; None waits for the full warm-up.
    min_effective_warmup
        Effective samples of a settled regime (`dynamiccl.detector._cusum_settle`); None: off.
    warmup_growth
        An unsettled full warm-up keeps learning up to this many times ``warmup`` samples.
    sign_gate
        In a positive series, values <= 0 are failed measurements (`dynamiccl.detector._cusum_sign`).
    max_trend_t
        A full warm-up whose trend has |t| above this is unsettled and keeps growing; None: off.
    trend_veto
        During the warm-up, an alarm that only continues the warm-up's own trend is not raised
        (`dynamiccl.detector._cusum_trend`).
    start_split
        Critical value of the change-start split (`dynamiccl.detector._cusum_locate`): 1.36, the
        conventional 5 % level; None: off (Page's last-zero start).
    outlier_gap
        An extreme value is isolated (dropped) unless another one in the same direction follows
        within this many valid samples (`dynamiccl.detector._cusum_outlier`); 1 (default): in a row.
    seasonal_memory
        Valid samples remembered (for good, across alarms) by the seasonal veto: an alarm that
        repeats a clear cycle's previous period is not raised (`dynamiccl.detector._cusum_season`); None: off.

    Attributes
    ----------
    drift_detected
        Whether the last update raised an alarm.
    statistic_up, statistic_down
        Current values of $S^+$ and $S^-$ (standard-deviation units), for dashboards.
    threshold
        The decision threshold $h$ (standard-deviation units).
    change_start
        Input index of the first sample of the excursion that raised the last alarm (the sample
        after the last index at which the alarming statistic was zero, or the step of the
        excursion's own mean with ``start_split``). None before any alarm.
    direction
        ``'up'`` or ``'down'`` for the last alarm, None before any alarm.
    magnitude
        Estimated shift of the last alarm in baseline standard deviations (signed): the mean
        of the capped $z$ over the alarming excursion (so at most ``z_cap``).
    shift
        `magnitude` in input units (``magnitude * baseline scale``).

    Examples
    --------
    A stream of collective latencies around 2 ms that steps up by 0.2 ms (2 sigma) at index 1000:

    >>> import random
    >>> from dynamiccl.detector import CUSUM
    >>> rng = random.Random(6)
    >>> stream = [rng.gauss(2e-3, 1e-4) for _ in range(1000)]
    >>> stream += [rng.gauss(2.2e-3, 1e-4) for _ in range(1000)]
    >>> cusum = CUSUM()
    >>> cusum.threshold
    4.719...
    >>> for i, x in enumerate(stream):
    ...     cusum.update(x)
    ...     if cusum.drift_detected:
    ...         print(f"Change detected at index {i}, started at {cusum.change_start}, "
    ...               f"{cusum.direction} by {cusum.magnitude:.2f} sigma")
    Change detected at index 1005, started at 1000, up by 1.99 sigma

    Invalid values are counted and skipped (here in latency mode, where a negative value is
    invalid), and an isolated absurd value is dropped:

    >>> cusum = CUSUM(warmup=50, min_value=0.0)
    >>> for x in [2e-3] * 25 + [2.1e-3] * 25 + [float("nan"), -1.0, 1e300, 2e-3]:
    ...     cusum.update(x)
    >>> cusum.drift_detected, cusum.n_invalid, cusum.n_outliers, cusum.statistic_up
    (False, 2, 1, 0.0)

    References
    ----------
    [^1]: Page, E. S. (1954). Continuous inspection schemes. Biometrika, 41(1/2), 100-115.
    [^2]: Siegmund, D. (1985). Sequential Analysis: Tests and Confidence Intervals. Springer.
    [^3]: Moustakides, G. V. (1986). Optimal stopping times for detecting changes in
        distributions. The Annals of Statistics, 14(4), 1379-1387.

    """

    _VALID_MODES = ("both", "up", "down")

    def __init__(
        self,
        delta: float = 2.0,
        arl0: float = 10_000.0,
        warmup: int = 100,
        mode: str = "both",
        min_value: float | None = None,
        max_value: float | None = None,
        z_clip: float | None = None,
        estimator: str = "winsorized",
        serial: bool = True,
        z_cap: float | None = None,
        min_rel_scale: float = 0.005,
        min_warmup: int | None = 20,
        min_effective_warmup: int | None = 20,
        warmup_growth: int = 4,
        sign_gate: bool = True,
        max_trend_t: float | None = 3.0,
        trend_veto: bool = True,
        start_split: float | None = 1.36,
        outlier_gap: int = 1,
        seasonal_memory: int | None = None,
    ):
        super().__init__()
        self.delta = delta
        self.arl0 = arl0
        self.warmup = warmup
        self.mode = mode
        self.min_value = min_value
        self.max_value = max_value
        self.z_clip = z_clip
        self.estimator = estimator
        self.serial = serial
        self.z_cap = z_cap
        self.min_rel_scale = min_rel_scale
        self.min_warmup = min_warmup
        self.min_effective_warmup = validate_min_effective(min_effective_warmup)
        self.warmup_growth = validate_growth(warmup_growth)
        self.sign_gate = validate_sign_gate(sign_gate)
        self.max_trend_t = validate_trend_t(max_trend_t)
        self.trend_veto = validate_trend_veto(trend_veto)
        self.start_split = validate_start_split(start_split)
        self.outlier_gap = validate_outlier_gap(outlier_gap)
        self.seasonal_memory = validate_seasonal_memory(seasonal_memory)
        self._season = None if seasonal_memory is None else SeasonMemory(seasonal_memory)
        # checks the other hyperparameters (in their order) and derives the chart's constants
        (self._k, self._h, self._clip, self._cap, self._first_learn, self._use_up, self._use_down,
         self._lo, self._hi) = derive_constants(self)
        self._h_full = self._h  # the full warm-up's threshold without the serial correction
        self._init_lifetime()
        self._reset()

    def _init_lifetime(self) -> None:
        """Lifetime counters and the description of the last alarm: they survive `_reset`."""
        self._n_seen = 0
        self._n_invalid = 0
        self._n_clipped = 0
        self._n_outliers = 0
        self._n_detections = 0
        self._change_start: int | None = None
        self._direction: str | None = None
        self._magnitude: float | None = None
        self._shift: float | None = None
        # Sign gate (`dynamiccl.detector._cusum_sign`): a value <= 0 was accepted / is invalid.
        self._signed = False
        self._nonpositive_invalid = False

    def _reset(self) -> None:
        """Forget the baseline and the statistics (keep lifetime counters)."""
        super()._reset()
        self._buffer: list[float] | None = []  # warm-up samples; None once the warm-up is full
        self._next_learn = self._first_learn
        self._h = self._h_full
        self._long_run_var = 1.0  # the warm-up's long-run variance of z (`_cusum_warmup`)
        self._median: float | None = None
        self._scale: float | None = None
        self._inv_scale: float | None = None
        self._s_up = 0.0
        self._s_down = 0.0
        self._run_up = 0  # valid samples in the current upper excursion
        self._run_down = 0
        self._start_up = -1  # input index of the first sample of the current excursion
        self._start_down = -1
        self._pending: float | None = None  # held extreme value (+/- clip), see `update`
        self._pending_index = -1
        self._pending_age = 0  # valid samples stepped since the held extreme value
        # The last `warmup` stepped (z, input index), kept only for ``start_split``.
        self._steps: deque[tuple[float, int]] | None = (
            None if self.start_split is None else deque(maxlen=self.warmup))

    # ------------------------------------------------------------------ read-only state
    threshold = property(lambda self: self._h, doc="Decision threshold h (sigma units).")
    reference = property(lambda self: self._k, doc="Reference value (allowance) k = delta / 2.")
    statistic_up = property(lambda self: self._s_up, doc="Upper CUSUM statistic S+ (sigma units).")
    statistic_down = property(lambda self: self._s_down, doc="Lower CUSUM statistic S- (sigma units).")

    @property
    def warming_up(self) -> bool:
        """True until the first (provisional) baseline of a warm-up; no alarm is possible then."""
        return self._inv_scale is None

    @property
    def baseline(self) -> tuple[float, float] | None:
        """(median, scale) of the current baseline in input units, None while warming up."""
        if self._inv_scale is None:
            return None
        return (self._median, self._scale)  # type: ignore[return-value]

    # The last alarm's description (the class docstring's Attributes).
    change_start = property(lambda self: self._change_start)
    direction = property(lambda self: self._direction)
    magnitude = property(lambda self: self._magnitude)
    shift = property(lambda self: self._shift)

    n_seen = property(lambda self: self._n_seen, doc="`update` calls, valid or not (the next index).")
    n_invalid = property(lambda self: self._n_invalid)
    n_clipped = property(lambda self: self._n_clipped, doc="Extreme values used (winsorised).")
    n_outliers = property(lambda self: self._n_outliers, doc="Isolated extreme values dropped.")
    n_detections = property(lambda self: self._n_detections)

    # ------------------------------------------------------------------ update
    def update(self, x: int | float) -> None:
        """Update the detector with one value; then read `drift_detected`.

        Parameters
        ----------
        x
            Input value (e.g. one collective's latency). Invalid values are counted and skipped.

        """
        if self._drift_detected:
            self._reset()

        i = self._n_seen
        self._n_seen = i + 1

        try:
            x = float(x)
        except (TypeError, ValueError):
            self._n_invalid += 1
            return
        # NaN fails both comparisons; +/-inf fail the finiteness test.
        if not (self._lo <= x <= self._hi) or x - x != 0.0 or (x <= 0.0 and self._failed(x)):
            self._n_invalid += 1
            return

        if self._season is not None:
            self._season.push(x, i)
        buffer = self._buffer
        if buffer is None:
            self._monitor(x, i)
            return
        # Warming up: x is judged against the baseline of the samples before it (if there are
        # min_warmup of them), then joins the warm-up, which is re-learnt as it grows.
        buffer.append(x)
        if self._inv_scale is not None:
            self._monitor(x, i)
            if self._drift_detected:
                return
        if len(buffer) >= self._next_learn:
            relearn(self)

    def _failed(self, x: float) -> bool:
        """Sign gate: whether the value x <= 0 is a failed measurement of a positive series;
        if it is accepted instead, the stream is signed for good."""
        if self._nonpositive_invalid:
            return True
        self._signed = True
        return False

    def _monitor(self, x: float, i: int) -> None:
        """Standardise the valid value x of input index i; hold, drop or step on it
        (`dynamiccl.detector._cusum_outlier`)."""
        monitor(self, x, i)

    def _step(self, z: float, i: int) -> bool:
        """One CUSUM step on the standardised value z of input index i; True on alarm."""
        k = self._k
        h = self._h
        cap = self._cap
        z = cap if z > cap else (-cap if z < -cap else z)
        if self._steps is not None:
            self._steps.append((z, i))
        fired_up = fired_down = False
        if self._use_up:
            s = self._s_up + z - k
            if s > 0.0:
                if self._run_up == 0:
                    self._start_up = i
                self._run_up += 1
                self._s_up = s
                fired_up = s >= h
            else:
                self._s_up = 0.0
                self._run_up = 0
        if self._use_down:
            s = self._s_down - z - k
            if s > 0.0:
                if self._run_down == 0:
                    self._start_down = i
                self._run_down += 1
                self._s_down = s
                fired_down = s >= h
            else:
                self._s_down = 0.0
                self._run_down = 0

        if (fired_up or fired_down) and self.trend_veto and self._buffer is not None:
            fired_up, fired_down = veto_trend(self, fired_up, fired_down)
        if (fired_up or fired_down) and self._season is not None:
            fired_up, fired_down = veto_season(self, fired_up, fired_down)
        if not (fired_up or fired_down):
            return False
        up = fired_up and (not fired_down or self._s_up >= self._s_down)
        if up:
            mag = k + self._s_up / self._run_up
            self._change_start = self._start_up
            self._direction = "up"
            run = self._run_up
        else:
            mag = -(k + self._s_down / self._run_down)
            self._change_start = self._start_down
            self._direction = "down"
            run = self._run_down
        if self._steps is not None:
            locate(self, run)
        self._magnitude = mag
        self._shift = mag * self._scale  # type: ignore[operator]
        self._n_detections += 1
        self._drift_detected = True
        return True

    @classmethod
    def _unit_test_params(cls):
        yield {}
        yield {"delta": 0.5, "arl0": 1e5, "warmup": 500, "mode": "up"}
        yield {"min_effective_warmup": None}
        yield {"warmup_growth": 1}
        yield {"sign_gate": False}
        yield {"max_trend_t": None}
        yield {"trend_veto": False}
        yield {"start_split": None}
        yield {"outlier_gap": 2}
        yield {"seasonal_memory": 2048}
