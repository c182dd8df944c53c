"""Rule ``incidents.adopt_improvement``: a job faster than its baseline runs at its new normal.

A degradation stays open until the job is back at its baseline; that end is its ``recovery``.
An improvement that no open degradation explains is different: the baseline it is measured
against was learnt in a slower regime (a throttle or competing traffic that predates the
streams' warm-up, a rank set that changed during a degradation so the streams re-learnt its
level) or the job really got faster (a better configuration). Kept open like a degradation,
its "recovery" is the job slowing down again: every later throttle is then reported as a
recovery and every release as an improvement, the reports inverted for the rest of the run.

So an improvement is reported once, as a change of falling latency, and its level becomes its
streams' baseline at once (no new warm-up: a slowdown right after it is a degradation against
the faster level). It is closed like a transient: no ``recovery`` follows, the loop hands the
retuner a `TransientEnd` (counter ``improvements_adopted``, exported as
``dynamiccl_detector_alarms_suppressed_total{reason="improvements_adopted"}``). It is not kept among the closed
incidents, so the gates that look back at a recovery (``recovery_tail``, ``recovery_drain``,
flapping) never take a slowdown after it for that recovery's tail.
"""
from __future__ import annotations

import numpy as np

__all__ = ["adopt"]


def adopt(fusion, inc) -> None:
    """Incident ``inc`` (an improvement just created) closed; its level is its streams' baseline."""
    tab = fusion.table
    level = np.where(np.isfinite(inc.level), inc.level, inc.base_med)
    tab.adopt_level(inc.streams, level, inc.base_scale)
    fusion._deactivate(inc)             # not among the closed: no recovery to look back at
    fusion.counters["improvements_adopted"] += 1
    fusion.ended.append(inc.end(inc.change.start_s, inc.change.detected_s, 1.0))
