"""A step of an open incident is the same regime for the retuner (a triage rule of
:mod:`dynamiccl.retuner.triage`).

The detector reports an incident whose level moves again (a deeper or a softer step,
:mod:`dynamiccl.detector.steps`) as a change of its own: ``evidence.step`` = ``"deeper"`` /
``"softer"``, ``evidence.follows`` = the change it supersedes. For the retuner it is the same
regime: the targets stay in it, a running exploration or a verification goes on, nothing new is
searched and nothing is pushed. Why: a throttle that eases or tightens moves the level, not the
best config's neighbourhood; treating each step as a new regime aborted the running search and
started another at every step (fast demo seed 1: 12 more versions in 20 s, two in one window,
one never applied). A step whose incident put no target in a regime (its first report was
ignored: hysteresis, cooldown, self-induced, no heavy target) is judged by itself by the later
rules. Its recovery still reverts: the step's id maps to the regime the targets are in.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

STEP_KINDS = ("deeper", "softer")
MAX_STEPS = 1024          # step id -> regime id entries kept (bounded like the other id maps)


class StepMap:
    """Step ids of open regimes -> the regime id the targets are in (newest ``MAX_STEPS``)."""

    def __init__(self) -> None:
        self._of: OrderedDict[str, str] = OrderedDict()

    def regime_of(self, change_id: str) -> str:
        """The regime a change id stands for: itself unless it is a step of an open regime."""
        return self._of.get(change_id, change_id)

    def add(self, step_id: str, regime: str) -> None:
        self._of[step_id] = regime
        while len(self._of) > MAX_STEPS:
            self._of.popitem(last=False)

    def regimes_of(self, ids: set) -> set:
        """``ids`` and the regimes their steps belong to (what a recovery that names steps ends)."""
        return set(ids) | {self._of[i] for i in ids if i in self._of}


def step_follows(rc) -> str | None:
    """The change a deeper/softer step supersedes, or None when ``rc`` is not a step."""
    ev = getattr(rc, "evidence", None) or {}
    follows = ev.get("follows")
    if ev.get("step") not in STEP_KINDS or not isinstance(follows, str):
        return None
    return follows


def step_of_open_regime(rt: Any, c: Any) -> bool:
    """Triage rule: a step of a regime some target is in updates that regime's evidence (audited
    ``ignore`` with ``step``), keeps the targets, their exploration and their config."""
    rc = c.rc
    follows = step_follows(rc)
    if follows is None or rc.kind in ("recovery", "straggler", "flapping"):
        return False
    regime = rt._steps.regime_of(follows)
    tss = [ts for ts in rt.targets.values() if ts.regime == regime]
    if not tss:
        return False
    rt._steps.add(rc.id, regime)
    rt._decide("ignore", None, **c.base, step=rc.evidence["step"], follows=follows, same_regime=regime,
               targets=len(tss), reason="a step of an open incident is the same regime: its targets, "
                                        "exploration and config stay")
    return True
