"""`CUSUM`'s extreme-value rule (``outlier_gap``, default 2): when is a value beyond ``z_clip``
an isolated outlier (dropped) and when is it evidence of a change (winsorised, then capped)?

Rule: an extreme value is held; if another extreme value in the same direction arrives within
``outlier_gap`` valid samples, both enter winsorised at +/- ``z_clip`` (and the CUSUM caps them
at ``z_cap``); otherwise the held value is dropped (`n_outliers`). The valid samples in between
are stepped as usual. ``outlier_gap=1`` is the earlier rule (only two extremes in a row enter).

Reason: an isolated absurd value (a failed measurement recorded as a huge number, one congestion
spike) must never change the statistics, and a value one sample away from another one in the
same direction is no longer isolated: a burst of extremes interleaved with ordinary values (a
flapping path, a failing host answering every other request) is a change of the distribution
that the in-a-row rule never saw (NAB `ec2_request_latency_system_failure`: extremes at every
other sample for the last ten, none reported). 2 is the smallest gap that admits one ordinary
value in between; nothing is fitted. Spikes further apart than the gap stay isolated (the
documented 1e6 x spike every 97 samples is ignored), and the false-alarm counts of the
documented noises (iid, Student-t 2 / 3 df, AR(1) 0.6 / 0.9, 20 x 5,000 samples at arl0 1e4) are
unchanged at 2 (docs/evaluation/2026-11-28-nab24.md; a gap of 4 adds a Student-t 2 df alarm).
"""

from __future__ import annotations


def monitor(det, x: float, i: int) -> None:
    """Standardise ``det``'s valid value x of input index i; hold, drop or step on it."""
    z = (x - det._median) * det._inv_scale
    c = det._clip
    pending = det._pending
    if z > c or z < -c:
        zc = c if z > 0.0 else -c
        if pending == zc:
            # A second extreme value within the gap, same direction: a real shift, not an outlier.
            det._pending = None
            det._n_clipped += 2
            if not det._step(zc, det._pending_index):
                det._step(zc, i)
            return
        if pending is not None:
            det._n_outliers += 1
        det._pending = zc  # hold it until the next `outlier_gap` valid samples tell
        det._pending_index = i
        det._pending_age = 0
        return
    if pending is not None:
        det._pending_age += 1
        if det._pending_age >= det.outlier_gap:  # an isolated extreme value: dropped
            det._n_outliers += 1
            det._pending = None
    det._step(z, i)


def validate_outlier_gap(outlier_gap) -> int:
    """Check the extreme-value rule's gap (valid samples, at least 1)."""
    if isinstance(outlier_gap, bool) or not isinstance(outlier_gap, int) or outlier_gap < 1:
        raise ValueError(f"outlier_gap must be an int >= 1, got {outlier_gap!r}")
    return outlier_gap
