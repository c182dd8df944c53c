"""Rule ``fusion.preconfirm``: an alarm already resting on two successive windows beyond the
confirmation bar is confirmed when it fires, not one window later.

Rule: a new alarm group (one job, one direction) counts as confirmed in its alarm window when,
over its streams, the median z of the alarm window and the median z of the window just before it
are both ≥ ``fusion.confirm_z`` (old baseline sigmas, in the alarm's direction), where that
earlier window is the adjacent window in event time (no gap) and lies inside the CUSUM's
excursion (at or after the stream's change start).

Why: a lone or small alarm waits for its next window to be ≥ ``confirm_z`` again, because a
one-window hiccup does not come back. When the window before the alarm window was already beyond
the bar (the onset's window, whose value moved but did not carry the statistic over its
threshold), the two windows the confirmation asks for are already there: waiting for a third adds
one window to the report and no evidence (test bed dev half: 22 of 86 reported degradations held
one window by the evidence gate, each a job's only stream with a whole window). The evidence is the
confirmation rule's own, two successive windows at ≥ ``confirm_z``, read backwards. What changes: a
two-window excursion whose CUSUM fires only on its second window is now a change (before, its
confirmation window was back at the baseline and the alarm was suppressed); one whose CUSUM fired
on its first window was a change before too (tests/detector/test_preconfirm.py). Only 9 of those 22
gain: in the others the onset's window was still below the bar.
"""
from __future__ import annotations

import warnings

import numpy as np

__all__ = ["preconfirmed"]


def preconfirmed(config, tab, idx: np.ndarray, med: np.ndarray, scale: np.ndarray, start: np.ndarray,
                 direction: int, t: int, window_s: float) -> bool:
    """True when the alarm of streams ``idx`` (baselines ``med``/``scale``, CUSUM starts ``start``)
    at bank step ``t`` rests on this window and the adjacent one before it, both ≥ ``confirm_z``."""
    if not config.fusion.preconfirm or idx.size == 0 or t < 1:
        return False
    H = config.streams.history
    now, before = t % H, (t - 1) % H
    if not abs(tab.window_starts[now] - tab.window_starts[before] - window_s) <= 1e-6 * max(window_s, 1.0):
        return False                              # the window before is not the adjacent one (a gap)
    inside = start <= t - 1                        # the earlier window is part of the excursion
    if not inside.any():
        return False
    safe = np.where(scale > 0, scale, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        z_now = (tab.hist[now, idx] - med) / safe * direction
        z_before = (tab.hist[before, idx] - med) / safe * direction
        z_before = np.where(inside, z_before, np.nan)
        bar = config.fusion.confirm_z
        return bool(np.nanmedian(z_now) >= bar and np.nanmedian(z_before) >= bar)
