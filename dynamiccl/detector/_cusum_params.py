"""Hyperparameter checks shared by `CUSUM` and `CUSUMBank` (which imports them via `.cusum`)."""

from __future__ import annotations

import math

from ._baseline import BASELINE_METHODS
from ._cusum_warmup import first_learn_size
from .arl import cusum_threshold_estimated


def _validate_cap(z_cap, min_rel_scale, delta) -> float:
    """Check the heavy-tail cap and the relative scale floor; return the cap (delta + 1 if None)."""
    if z_cap is not None and not z_cap > 0:
        raise ValueError(f"z_cap must be > 0 or None, got {z_cap!r}")
    if not (isinstance(min_rel_scale, (int, float)) and 0.0 <= min_rel_scale < math.inf):
        raise ValueError(f"min_rel_scale must be a finite number >= 0, got {min_rel_scale!r}")
    return float(z_cap) if z_cap is not None else delta + 1.0


def _validate_min_warmup(min_warmup) -> int | None:
    """Check the short warm-up's sample count (None: monitor only after the full warm-up)."""
    if min_warmup is not None and not (isinstance(min_warmup, int)
                                       and not isinstance(min_warmup, bool) and min_warmup >= 2):
        raise ValueError(f"min_warmup must be an int >= 2 or None, got {min_warmup!r}")
    return min_warmup


def _validate_and_derive(delta, arl0, warmup, mode, min_value, max_value, z_clip, valid_modes,
                         estimator="mad"):
    """Shared by `CUSUM` and `CUSUMBank`: check hyperparameters, return (k, h, clip)."""
    if estimator not in BASELINE_METHODS:
        raise ValueError(f"estimator must be one of {BASELINE_METHODS}, got {estimator!r}")
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta > 0):
        raise ValueError(f"delta must be a finite number > 0, got {delta!r}")
    if not (isinstance(arl0, (int, float)) and arl0 > 1 and math.isfinite(arl0)):
        raise ValueError(f"arl0 must be a finite number > 1, got {arl0!r}")
    if not (isinstance(warmup, int) and not isinstance(warmup, bool) and warmup >= 2):
        raise ValueError(f"warmup must be an int >= 2, got {warmup!r}")
    if mode not in valid_modes:
        raise ValueError(f"Invalid 'mode'. Valid values are: {valid_modes}")
    if min_value is not None and max_value is not None and not min_value < max_value:
        raise ValueError(f"min_value ({min_value!r}) must be < max_value ({max_value!r})")
    if z_clip is not None and not z_clip > 0:
        raise ValueError(f"z_clip must be > 0 or None, got {z_clip!r}")
    k = delta / 2.0
    h = cusum_threshold_estimated(float(arl0), k, warmup, mode == "both", estimator)
    clip = float(z_clip) if z_clip is not None else delta + 4.0
    return k, h, clip


def derive_constants(det) -> tuple[float, float, float, float, int, bool, bool, float, float]:
    """`CUSUM`'s constants from its hyperparameters, checked in this order (the first bad one is
    the error): (k, h, clip) (`_validate_and_derive`), the cap, the first learn size; then the
    directions watched (up, down) and the valid range (lo, hi). Computed once, at construction."""
    k, h, clip = _validate_and_derive(
        det.delta, det.arl0, det.warmup, det.mode, det.min_value, det.max_value, det.z_clip, det._VALID_MODES,
        det.estimator
    )
    cap = _validate_cap(det.z_cap, det.min_rel_scale, det.delta)
    first_learn = first_learn_size(_validate_min_warmup(det.min_warmup), det.warmup)
    use_up, use_down = det.mode in ("both", "up"), det.mode in ("both", "down")
    lo = -math.inf if det.min_value is None else float(det.min_value)
    hi = math.inf if det.max_value is None else float(det.max_value)
    return k, h, clip, cap, first_learn, use_up, use_down, lo, hi
