"""One tuner version in flight (a part of :class:`~dynamiccl.retuner.agent.Retuner`'s push path).

Rule: new rules are not written while the newest version has not yet been seen applied — no observation
has carried a version at or above it — for at most ``max_in_flight_s`` of event time after its push. The
retuner's state moves on meanwhile (explorations assign, reverts happen); the next call after the version
is seen (or after the bound) writes whatever is current then, so nothing is lost, only merged.

Why: a version superseded before any step boundary could apply it is never run — a probe that measures
nothing, a revert that never happened for the job — and the job's records cannot tell which rules a step
ran (fast demo seed 1 before the step rule: two versions in one window, one never applied). The gate is
open when the input carries no versions (nothing to tell applied from not: ``versions_echoed``), for
re-publishing the same rules, when the job showed it missed the version (a step that began
``republish_after_s`` after the push ran an older one: a lost copy; the new rules are written at once, as a
re-publish would be), and after the bound (a version that is never seen — a lost
file, a stalled job — must not wedge the retuner).
"""
from __future__ import annotations

import math


class InFlight:
    """The newest pushed version, when it was pushed, and whether the input has shown it applied."""

    def __init__(self, max_in_flight_s: float) -> None:
        self.max_s = max_in_flight_s
        self.version: int | None = None
        self.t = -math.inf
        self.seen = True

    def pushed(self, version: int, t: float) -> None:
        self.version, self.t, self.seen = version, t, False

    def observed(self, version: int | None) -> None:
        """An observation ran on ``version`` (None: the input carries no version)."""
        if version is not None and self.version is not None and version >= self.version:
            self.seen = True

    def holds(self, now: float, versions_echoed: bool) -> bool:
        """Whether a write of new rules waits now."""
        return self.max_s > 0 and versions_echoed and not self.seen and now - self.t < self.max_s
