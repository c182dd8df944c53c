"""Gate ``post_recovery_hold``: a degradation soon after the job's own recovery needs one more
confirming window.

Rule: a new degradation group (not merged into an open incident, past the small-shift and workload
gates) of a job with an incident of its direction closed by a reported recovery (not a transient)
at most ``incidents.flap_window_s`` ago is held as a pending group (counter ``post_recovery_holds``)
until it has been confirmed on two windows (its streams' median at ``fusion.confirm_z`` old sigmas
from the baseline, the ordinary confirmation of `Fusion._confirm_pending`), the second within
``fusion.confirm_windows`` tries of the first; otherwise its baselines are restored as for any
unconfirmed spike. A group opens no sooner than one window after it would have without the gate.
A step-paced job is not held (its next window is its next step, 2-10 s away: the reason
`FusionGates._wait_is_a_step` does not hold it either).

Why: after a release the restored baseline is the quiet pre-change one, while the test bed's queues
and TCP windows settle for a few seconds more; the dev half's most common false alarm (Session 25,
docs/evaluation/2026-11-28-fa25b.md) is a 1.5-3x excursion 3-14 s after the detector's recovery
that is back within 1-4 windows (closed as a transient). A change that lasts (a throttle, a
``bulk_on``) is still there one window later and pays one window of delay; in the dev half every
labelled change was reported 11 s or more after the previous recovery, and one alarmed inside the
span (held one window, still within 5 s). The span is the detector's own for
"the same episode after a recovery" (``flap_window_s``, also the ``recovery_drain`` gate's, whose
excursions within the recovered band this one extends to those beyond it); the bar is the confirm
rule's. No value is new.
"""
from __future__ import annotations

__all__ = ["PostRecoveryHold"]


class PostRecoveryHold:
    """Per `Fusion`: which (job, direction) groups it held, and the verdict on a new group."""

    def __init__(self, fusion):
        self.fusion = fusion
        self._held: dict[tuple[str, int], int] = {}   # (job, direction) -> window step it was held in

    def _recent_recovery(self, job: str, direction: int, now_s: float) -> bool:
        """An incident of ``job`` and ``direction`` closed by a reported recovery within
        ``flap_window_s`` (event seconds: a step-paced job's windows are seconds apart)."""
        f = self.fusion
        span = f.config.incidents.flap_window_s
        return any(old.direction == direction and old.closed_step is not None and not old.transient
                   and now_s - float(f.table.window_start_of(old.closed_step)) <= span
                   for old in f.closed.get(job, ()))

    def holds(self, ws, a) -> bool:
        """Whether alarm group ``a`` (`AlarmGroup`) is held now (the caller queues it as pending)."""
        f = self.fusion
        if not f.config.incidents.post_recovery_hold or a.direction <= 0:
            return False
        if f.table.cadence.paced(int(f.table.job_code[a.idx[0]]), f._window_s):
            return False        # a step-paced job's next window is its next step, seconds away (`_wait_is_a_step`)
        key = (a.job, a.direction)
        held = self._held.get(key)
        if held is not None and a.confirmed and 0 < ws.t - held <= f.config.fusion.confirm_windows:
            return False        # held confirmed once and confirmed again since: judged as any other group
        if not self._recent_recovery(a.job, a.direction, float(ws.window_start)):
            return False
        if a.confirmed:
            self._held[key] = ws.t   # its first confirmed window: one more must follow
        return True
