"""Gate ``recovery_drain``: a degradation on the streams of an incident that just recovered,
whose level sits where that incident's own recovery rule calls them recovered, is the release
still draining, not a new change.

Rule: a new alarm group of the same job and direction as an incident closed by a recovery at
most ``incidents.flap_window_s`` ago (the span in which a re-onset after a recovery is
the same episode, `Tracking`), with at least half of its streams among that incident's, whose
median position on those streams (0: the incident's old baseline, 1: its tracked degraded level)
is at most ``incidents.recovery_fraction``, is absorbed (counter ``recovery_drains``) and its
streams are monitored against the restored baseline again, statistics cleared.

Why: a recovery restores the pre-change baseline at once (its sample count kept, a tight scale),
while a released queue or a TCP window still drains for a few seconds at 0.2-0.3 of the shift;
the restored chart alarmed on that tail 3-14 s after the recovery (dense dev runs: 9 of the 24
false alarms are degradations after a recovery). The bound is the recovery rule's own: a level
the incident calls recovered cannot also be a new degradation of it. A level beyond it (a
re-onset, a deeper throttle) passes, and so does anything after ``flap_window_s``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["drained"]


def drained(fusion, ws, a) -> bool:
    """Whether alarm group ``a`` (`AlarmGroup`) is a recovered incident's drain; if so its
    streams get that incident's baseline back (and the counter moves)."""
    cfg, tab = fusion.config, fusion.table
    if not cfg.incidents.recovery_drain:
        return False
    for old in reversed(fusion.closed.get(a.job, ())):
        if (old.direction != a.direction or old.closed_step is None or old.transient or old.rank_of is not None
                or (ws.t - old.closed_step) * fusion._window_s > cfg.incidents.flap_window_s):
            continue
        mine = np.isin(a.idx, old.streams)
        if 2 * int(mine.sum()) < a.idx.size:
            continue
        pos = {int(s): k for k, s in enumerate(old.streams.tolist())}
        k = np.array([pos[int(s)] for s in a.idx[mine]])
        shift = old.level[k] - old.base_med[k]
        with np.errstate(invalid="ignore", divide="ignore"):
            p = (a.level[mine] - old.base_med[k]) / shift
        p = p[np.isfinite(p) & (shift != 0)]
        if p.size == 0 or float(np.median(p)) > cfg.incidents.recovery_fraction:
            continue
        tab.restore_baseline(old.streams[k], old.base_med[k], old.base_scale[k])
        fusion.counters["recovery_drains"] += 1
        return True
    return False
