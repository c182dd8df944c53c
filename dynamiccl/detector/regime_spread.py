"""Rule ``regime_spread``: a deeper step is judged against the noise of the regime it leaves.

Rule: the z of a deeper step (`Tracking._deeper`: median move beyond the incident's tracked level
≥ ``fusion.confirm_z``) is taken in the larger, per stream, of its old baseline sigma and the robust
sd (1.4826 x MAD, log scale) of the stream's windows since the incident's level was last set
(its report or its last step), before the run being judged; with fewer than
``MIN_WINDOWS`` such windows in the history, the old sigma alone (as before).

Why: the old sigma is the quiet pre-change regime's (test bed: 0.004 in log); a throttled
regime on a shared machine swings 10-20 % window to window, so two windows 1.1x above the tracked
level passed the step rule as "deeper" with nothing moving (dev seed 14: 1.11x, against windows
at 3.9-4.7x the baseline before it). The rule is the detector's confirm rule against the regime
the streams are in, and the test bed's own measure of a move (`dynamiccl.harness.testbed.effect`,
the robust sd of the windows before); no value is new.
"""
from __future__ import annotations

import warnings

import numpy as np

__all__ = ["regime_scale", "MIN_WINDOWS"]

MAD_SD = 1.4826       # robust sd of a normal sample from its median absolute deviation
MIN_WINDOWS = 3       # fewer windows give no spread (a MAD of 2 values is their half-distance)


def regime_scale(config, tab, inc, ws_t: int, ok: np.ndarray) -> np.ndarray:
    """Per stream of ``inc.streams[ok]``: the sigma a deeper step's z is taken in."""
    old = inc.base_scale[ok]
    if not config.incidents.regime_spread:
        return old
    H = config.streams.history
    lo = max(int(max(inc.detected_step, inc.level_step)) + 1, ws_t - H + 1)
    hi = ws_t - inc.deeper_run           # the windows before the run being judged
    if hi - lo < MIN_WINDOWS:
        return old
    vals = tab.hist[np.arange(lo, hi) % H][:, inc.streams[ok]]
    n = np.isfinite(vals).sum(axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        spread = MAD_SD * np.nanmedian(np.abs(vals - np.nanmedian(vals, axis=0)), axis=0)
    spread = np.where((n >= MIN_WINDOWS) & np.isfinite(spread), spread, 0.0)
    return np.maximum(old, spread)
