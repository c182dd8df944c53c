"""Rule ``softer_release``: a recovery within ``incidents.merge_s`` of the incident's softer step
is that step's release finishing its descent, not a second improvement.

Rule: when an incident recovers and its latest change is a softer step (`dynamiccl.detector.steps`)
reported at most ``merge_s`` before, the recovery is no regime change of its own: the incident
closes (baselines restored as on any recovery) and a `TransientEnd` goes to the retuner alone
(counter ``softer_releases``), as for a transient. The softer step already reported the
improvement; its incident simply reached the old level.

Why: a release whose queue drains over a few windows first sits above ``recovery_fraction`` long
enough for the softer-step rule (a plateau of ``recovery_windows`` + 1 windows) and then falls
inside it: one release, reported twice, 1-5 s apart (dev half: seeds 10 and 38). The span is the
detector's own for "the same change unfolding" (``merge_s``: what follows a report this soon
joins it; the softer-step rule refuses a step this soon after a detection for the same reason).
A softer step and a release labelled 10 s or more apart stay two changes.
"""
from __future__ import annotations

__all__ = ["release_of_softer_step"]


def release_of_softer_step(config, inc, closed_s: float) -> bool:
    """Whether the recovery of ``inc`` at ``closed_s`` (event time) finishes its softer step."""
    if not config.incidents.softer_release:
        return False
    ch = inc.change
    if (ch.evidence or {}).get("step") != "softer":
        return False
    return closed_s - ch.detected_s <= config.incidents.merge_s
