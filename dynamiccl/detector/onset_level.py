"""Rule ``onset_level``: a new alarm is judged on its streams' level since its CUSUM onset.

Rule: an unconfirmed alarm group (no window after its alarm window yet) passes only if the
median over its streams of z = (median of the stream's windows from its CUSUM start, the
estimated onset, to now - baseline median) / baseline scale, in the alarm's direction, is
≥ ``fusion.confirm_z``. A group that fails is held as a pending group (not dropped): the next
``confirm_windows`` windows confirm it as any lone alarm is confirmed (that window again
≥ ``confirm_z``), and a confirmed group is reported; an unconfirmed one restores the old
baselines (``spikes_suppressed``). Cost for a real change so held: one window (dense jobs; a
step-paced job's next sample).

Why: a CUSUM alarm states "the mean has moved since the estimated onset". Its statistic
accumulates: a long run of windows slightly above the baseline (under the chart's delta, never
a move by themselves) brings it near its threshold, and one spike window then carries it over;
the group is then judged on that spike (the last window) as if it were the new level. The median
of the windows since the onset is at the new level only if at least half of them are: a level
change, not one spike. The bar is the confirm rule's (``confirm_z`` baseline sigmas: what the
detector already requires of a window to say it sits at the new level); the median of n ≥ 1
windows under no change is at least as concentrated as one window, so the bar's false-pass rate
is at most the confirm rule's. No value is new.
"""
from __future__ import annotations

import warnings

import numpy as np

__all__ = ["level_since_onset_z", "holds"]


def level_since_onset_z(tab, history: int, idx: np.ndarray, med: np.ndarray, scale: np.ndarray,
                        start: np.ndarray, direction: int, t: int) -> float:
    """Median over streams of the z of each stream's median window value from its CUSUM start
    (clipped to the history) to ``t``; NaN when no stream has a value there."""
    lo = max(int(start.min()), t - history + 1)
    steps = np.arange(lo, t + 1)
    vals = tab.hist[steps % history][:, idx]
    vals = np.where(steps[:, None] >= start[None, :], vals, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        level = np.nanmedian(vals, axis=0)
        z = np.where(scale > 0, (level - med) / np.where(scale > 0, scale, 1.0), np.inf) * direction
    z = z[np.isfinite(level)]
    return float(np.median(z)) if z.size else float("nan")


def holds(config, tab, a, t: int) -> bool:
    """True when the unconfirmed group ``a`` (`fusion_gates.AlarmGroup`) must wait: its
    streams' level since the onset is below the confirm bar."""
    if not config.fusion.onset_level or a.confirmed:
        return False
    z = level_since_onset_z(tab, config.streams.history, a.idx, a.med, a.scale, a.start, a.direction, t)
    return bool(np.isfinite(z) and z < config.fusion.confirm_z)
