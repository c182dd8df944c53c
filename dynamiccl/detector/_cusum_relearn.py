"""`CUSUM`'s re-learn step: the baseline, threshold and gates from the warm-up so far, and the
hand-over at ``warmup`` samples.

Rule: a provisional chart's statistics carry over a re-learn, rescaled to the new scale. At
``warmup`` samples every chart hands over: its statistics start afresh on the full-length
baseline, as the chart that waited would, also when its unsettled warm-up keeps growing
(`dynamiccl.detector._cusum_settle.keeps_growing`), so an unsettled (trending) warm-up's
provisional excursion is not carried on as evidence of a change. A warm-up that is settled (or
at its growth bound) closes.
"""

from __future__ import annotations

from ._cusum_settle import drop_earlier_regime, keeps_growing
from ._cusum_sign import zero_is_extreme
from ._cusum_warmup import learn_baseline_variance, next_learn_size


def relearn(det) -> None:
    """(Re-)learn ``det``'s baseline, threshold and sign gate from its warm-up so far; close
    the warm-up or schedule the next re-learn."""
    buffer = det._buffer
    drop_earlier_regime(det, buffer)  # a baseline comes from one regime
    old_scale = det._scale
    det._median, det._scale, det._h, det._long_run_var = learn_baseline_variance(
        buffer, det.warmup, estimator=det.estimator, min_rel_scale=det.min_rel_scale,
        serial=det.serial, cap=det._cap, arl0=det.arl0, k=det._k, two_sided=det.mode == "both")
    det._inv_scale = 1.0 / det._scale
    det._nonpositive_invalid = (det.sign_gate and not det._signed
                                and zero_is_extreme(det._median, det._scale, det._clip))
    n = len(buffer)
    if n >= det.warmup and not keeps_growing(det, buffer):
        det._buffer = None
        hand_over(det)
        return
    if n == det.warmup:
        hand_over(det)
    elif old_scale is not None:
        det._s_up *= old_scale * det._inv_scale
        det._s_down *= old_scale * det._inv_scale
    det._next_learn = next_learn_size(n, det.warmup if n < det.warmup
                                      else det.warmup_growth * det.warmup)


def hand_over(det) -> None:
    """Start ``det``'s statistics afresh on the full-length baseline; a held extreme of the
    provisional chart is dropped (counted in `n_outliers`)."""
    det._s_up = det._s_down = 0.0
    det._run_up = det._run_down = 0
    if det._pending is not None:
        det._n_outliers += 1
        det._pending = None
