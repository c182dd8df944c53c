"""Regime changes in: the triage rules that decide what a reported change means for the targets
(a part of :class:`~dynamiccl.retuner.agent.Retuner`)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from dynamiccl.retuner.explore import Exploration, _n
from dynamiccl.retuner.steps import step_of_open_regime
from dynamiccl.retuner.types import Candidate

from dynamiccl.retuner.state import (
    _BASE,
    Key,
    TargetState,
    _labels,
    _log_dist,
    _mean_before,
    _mean_between,
    _RKey,
    _same_config_ratio,
    _tname,
)

log = logging.getLogger("retuner")


class TriageMixin:
    # ================================================================ regime changes
    def _targets_for(self, rc) -> list[TargetState]:
        comms = set()
        for c in rc.comms:
            try:
                comms.add(int(str(c), 16))
            except ValueError:
                pass
        names = set(rc.comm_names) if not comms else set()
        out = []
        for ts in self.targets.values():
            t = ts.target
            if comms and t.comm_hash not in comms:
                continue
            if names and t.comm_name not in names:
                continue
            if rc.funcs and t.func not in rc.funcs:
                continue
            if rc.size_buckets and t.size_bucket not in rc.size_buckets:
                continue
            out.append(ts)
        return out

    def _heavy(self, tss: list[TargetState]) -> list[TargetState]:
        if self.total_s <= 0:
            return []
        tss = [ts for ts in tss if ts.pinned is None and ts.time_s / self.total_s >= self.policy.min_time_share]
        return sorted(tss, key=lambda ts: -ts.time_s)[:self.policy.max_targets]

    def _on_change(self, rc) -> None:
        """Run the triage rules in order; the first that settles the change ends it."""
        self.now = max(self.now, rc.detected_s)
        self.regimes[rc.id] = rc
        while len(self.regimes) > 1024:
            self.regimes.popitem(last=False)
        c = Triage(rc, {"regime": rc.id, "kind": rc.kind, "magnitude": rc.magnitude})
        for rule in TRIAGE:
            if rule(self, c):
                return

    def _adopt_recognized(self, rc, base: dict) -> bool | set:
        """A detector report of a regime the targets already recognised from the measurements (same fingerprint, not
        yet named by a report): they keep the reused config; the report only names their regime
        (so its recovery finds them). True = every affected target had; else the keys of those that had."""
        if not self.policy.recognize or rc.kind in ("recovery", "straggler", "flapping") or \
                not (math.isfinite(rc.magnitude) and rc.magnitude > 0):
            return set()
        tss = self._heavy(self._targets_for(rc))
        if not tss:
            return set()
        key = _RKey(self.memory.key_for(rc.kind, [ts.target.comm_hex for ts in tss], rc.magnitude))
        done = [ts for ts in tss if ts.regime_key == key and ts.regime is not None and
                ts.regime.startswith("recognized-")]
        if not done:
            return set()
        for ts in done:
            x = self.explorations.get(ts.exploration) if ts.exploration else None
            if x is not None and x.trigger == ts.regime:
                x.trigger = rc.id
            ts.regime = rc.id
        self._decide("ignore", None, **base, recognized=True, targets=len(done), of=len(tss),
                     recognized_onset_s=min(ts.recog_onset for ts in done),
                     reason="already recognised from the measurements (the remembered config is in force); "
                            "adopted as this regime")
        return True if len(done) == len(tss) else {ts.target.key for ts in done}

    def _seed_incumbent(self, x: Exploration, rc) -> int:
        """The incumbent already ran between the onset and the detection: those samples (from intervals that
        started after the onset, at most the last second before the detection, so a late onset estimate does not
        mix in the old regime) measure it in the new regime, so the exploration need not wait for fresh ones."""
        t_min = max(rc.start_s, rc.detected_s - self.window_s)
        mag = rc.magnitude
        if not (math.isfinite(mag) and mag > 0) or not math.isfinite(t_min):
            return 0
        n = 0
        for m in x.members:
            hist = self.targets[m.key].history
            pre = _mean_between(hist, x.incumbent, rc.start_s - self.policy.history_s, rc.start_s)
            if pre is None:
                continue
            for t0, t1, k, mean, var, cand in hist:
                # only intervals that look like the new regime: closer to before x magnitude than to before
                if cand == x.incumbent and t0 >= t_min and t1 <= self.now and mean > 0 and \
                        _log_dist(mean, pre * mag) < _log_dist(mean, pre):
                    x.record(m.key, cand, k, mean, var, t1)
                    n += k
        x.fresh = {m.key: False for m in x.members}
        return n

    def _self_induced_by_push(self, rc) -> dict | None:
        """Did our own push cause what the detector reports? The detector sees every latency change, including
        the one a config we pushed causes (a probe, a commit, a revert). A change is taken as self-induced when
        (1) our push changed the config of an affected target within ``apply_grace_s`` of the onset, (2) no
        affected target shows the change on a config that ran unchanged across the onset (same config measured
        before and after it, |after / before − 1| ≥ ``min_change``: that is the network, not us), and (3) where
        the configs before and after the push were both measured before the onset, the change they predict has
        the direction of the reported magnitude. Returns audit details, or None (a genuine change)."""
        pol = self.policy
        g = pol.apply_grace_s
        onset = rc.start_s
        if not math.isfinite(onset):
            return None
        tss = [ts for ts in self._targets_for(rc) if ts.history and ts.pinned is None]
        pushed: dict[Key, tuple[Candidate | None, Candidate | None, float]] = {}
        for ts in tss:
            prev: Candidate | None = None          # in force before the first push near the onset
            for t_apply, c in ts.applies:
                if abs(t_apply - onset) <= g:
                    was = pushed[ts.target.key][0] if ts.target.key in pushed else prev
                    pushed[ts.target.key] = (was, c, t_apply)
                prev = c
        if not pushed:
            return None
        evidence = []
        for ts in tss:
            r = _same_config_ratio(ts, onset)
            if r is not None:
                evidence.append(r)
                if abs(r - 1.0) >= pol.min_change:
                    return None                      # something that did not change ran slower/faster
        expected = []
        for key, (old, new, _t) in pushed.items():
            ts = self.targets[key]
            a, b = _mean_before(ts, old, onset), _mean_before(ts, new, onset)
            if a is not None and b is not None:
                expected.append(b / a)
        mag = rc.magnitude
        if expected and math.isfinite(mag) and abs(mag - 1.0) >= pol.min_change:
            e = max(expected, key=lambda v: abs(math.log(v)))
            if (e - 1.0) * (mag - 1.0) < 0 or abs(e - 1.0) < pol.min_change / 2:
                return None                          # our push cannot explain this direction / size
        return {"pushes": [{"target": _tname(self.targets[k].target), "was": _n(o), "now": _n(c), "t": t}
                           for k, (o, c, t) in sorted(pushed.items())][:16],
                "expected_ratio": [round(v, 4) for v in expected][:16],
                "unchanged_config_ratio": [round(v, 4) for v in evidence][:16]}

    def _revert(self, ts: TargetState, rc) -> None:
        x = self.explorations.get(ts.exploration) if ts.exploration else None
        if x is not None:
            self._abort(x, reason=f"recovery {rc.id}", cutoff=rc.start_s)
        old = ts.active
        ts.active = ts.baseline
        self._sig_move(ts, ts.regime_key or _BASE, _BASE, rc.start_s, max(rc.start_s, rc.detected_s - self.window_s))
        ts.regime = ts.regime_kind = ts.regime_key = None
        self.metrics.set_gain(_labels(ts.target), None)
        if old != ts.active:
            ts.last_decision_t = self.now
            self._decide("revert", ts.target, regime=rc.id, recovers=rc.recovers, was=_n(old), now=_n(ts.active))

    def _cohorts(self, tss: list[TargetState]) -> list[list[TargetState]]:
        groups: dict[tuple, list[TargetState]] = {}
        for ts in tss:
            t = ts.target
            groups.setdefault((t.func, t.size_bucket, t.nranks, t.nnodes, ts.active), []).append(ts)
        return list(groups.values())

    def _recommend(self, cohort: list[TargetState], rc, remembered) -> None:
        ts = cohort[0]
        ratio = self._ratio(ts, rc.start_s if rc is not None else None)
        inc_cell = self.planner.cell_of(ts.target, ts.active, ts.observed_cell)
        plan = self.planner.cells(ts.target, kind=rc.kind if rc else "baseline", incumbent=ts.active,
                                  inc_cell=inc_cell, ratio=ratio, bias=ts.bias, unapplicable=ts.unapplicable)
        r = remembered.get(ts.target.key) if remembered else None
        self._decide("recommend", ts.target, regime=rc.id if rc else "start",
                     members=[m.target.comm_name or m.target.comm_hex for m in cohort],
                     remembered=_n(r[0]) if r else None, candidates=[c.name for c in plan.candidates],
                     predicted_us=plan.predicted_us, fit={"dlat_us": plan.fit.dlat_us, "beta": plan.fit.beta},
                     measured_ratio=ratio, note="dry run: nothing written; exploration needs dry_run=false")


@dataclass
class Triage:
    """What the rules know about one regime change while they decide."""
    rc: Any
    base: dict
    adopted: bool | set = field(default_factory=set)   # targets that recognised it from the measurements
    tss: list = field(default_factory=list)             # affected targets that act on it
    all_tss: list = field(default_factory=list)         # every affected target with enough collective time
    fresh: list = field(default_factory=list)           # targets with nothing remembered to reuse
    fp: tuple = ()
    remembered: dict = field(default_factory=dict)


# Each rule: (retuner, triage) -> True when it settled the change (its decision is in the audit log).
# They run in this order; the order is the policy.

def adopt_recognized(rt, c: Triage) -> bool:
    """The targets already recognised this regime from the measurements: they keep their config."""
    c.adopted = rt._adopt_recognized(c.rc, c.base)
    return c.adopted is True


def _ends(rc) -> set:
    """Every change a recovery ends: the detector tracks changes on the same streams as one incident, whose
    recovery names the newest in ``recovers`` and all of them in ``evidence["ends"]``."""
    ends = set((getattr(rc, "evidence", None) or {}).get("ends") or ())
    return ends | {rc.recovers} if rc.recovers is not None else ends


def recovery_of_self_induced(rt, c: Triage) -> bool:
    """A recovery of changes that were all our own is ignored too; one that also ends a real regime is not."""
    rc = c.rc
    if rc.kind == "recovery" and rc.recovers is not None and _ends(rc) <= rt._self_induced.keys():
        rt._decide("ignore", None, **c.base, self_induced=True, recovers=rc.recovers,
                   reason="recovery of a change that was ignored as self-induced")
        return True
    return False


def self_induced(rt, c: Triage) -> bool:
    """A change that coincides with our own push, where no config that ran across the onset changed. A change within
    the hysteresis is not one a push can be blamed for (nothing to explain): the later rules handle it."""
    m = c.rc.magnitude
    if c.rc.kind == "straggler" or c.adopted or not (math.isfinite(m) and m > 0 and
                                                     abs(m - 1.0) >= rt.policy.min_change):
        return False                              # adopted: the change is real, we recognised it ourselves
    why = rt._self_induced_by_push(c.rc)
    if why is None:
        return False
    rt._self_induced[c.rc.id] = None
    while len(rt._self_induced) > 1024:
        rt._self_induced.popitem(last=False)
    rt._decide("ignore", None, **c.base, self_induced=True, **why,
               reason="self-induced: the change coincides with our own push on the same targets "
                      f"(within apply_grace_s={rt.policy.apply_grace_s:g} s) and no config that "
                      "ran unchanged across the onset changed")
    return True


def recovery(rt, c: Triage) -> bool:
    """A recovery reverts the targets that are in the recovered regime."""
    rc = c.rc
    if rc.kind != "recovery":
        return False
    ends = rt._steps.regimes_of(_ends(rc))
    tss = [ts for ts in rt.targets.values() if ts.regime is not None and ts.regime in ends]
    g = rt.policy.apply_grace_s
    if not tss:       # (targets that recognised a change of their own since this onset are not its)
        tss = [ts for ts in rt._targets_for(rc) if ts.regime is not None and ts.recog_onset < rc.start_s - g]
    for ts in tss:
        rt._revert(ts, rc)
    if not tss:
        n_rec = sum(1 for ts in rt._targets_for(rc) if ts.recog_onset >= rc.start_s - g)
        rt._decide("ignore", None, **c.base, reason="recovery of a regime no target is in" +
                   (" (already recognised from the measurements)" if n_rec else ""),
                   **({"recognized": True, "targets": n_rec} if n_rec else {}))
    return True


def straggler(rt, c: Triage) -> bool:
    if c.rc.kind != "straggler":
        return False
    rt._decide("ignore", None, **c.base, reason="straggler: not a configuration problem (reported only)")
    return True


def below_hysteresis(rt, c: Triage) -> bool:
    m = c.rc.magnitude
    if (math.isfinite(m) and m > 0) and abs(m - 1.0) >= rt.policy.min_change:
        return False
    rt._decide("ignore", None, **c.base, reason=f"|magnitude - 1| below hysteresis {rt.policy.min_change}")
    return True


def no_heavy_target(rt, c: Triage) -> bool:
    c.all_tss = rt._heavy(rt._targets_for(c.rc))
    c.tss = [ts for ts in c.all_tss if not c.adopted or ts.target.key not in c.adopted]
    if c.tss:
        return False
    rt._decide("ignore", None, **c.base, reason="no affected target carries enough collective time")
    return True


def enter_regime(rt, c: Triage) -> bool:
    """The targets enter the new regime: running explorations stop, the signature moves. Never settles."""
    rc = c.rc
    comms = [ts.target.comm_hex for ts in c.all_tss]
    key = _RKey(rt.memory.key_for(rc.kind, comms, rc.magnitude))
    t_keep = max(rc.start_s, rc.detected_s - rt.window_s)
    for ts in c.tss:
        x = rt.explorations.get(ts.exploration) if ts.exploration else None
        if x is not None:
            rt._abort(x, reason=f"new regime {rc.id}", cutoff=rc.start_s)
        rt._sig_move(ts, ts.regime_key or _BASE, key, rc.start_s, t_keep)
        ts.regime, ts.regime_kind, ts.regime_start, ts.regime_key = rc.id, rc.kind, rc.start_s, key
    c.fp = (rc.kind, tuple(sorted(set(comms))), float(rc.magnitude))
    c.remembered = rt.memory.lookup(rc.kind, comms, rc.magnitude) or {}
    return False


def dry_run(rt, c: Triage) -> bool:
    if not rt.cfg.dry_run:
        return False
    for cohort in rt._cohorts(c.tss):
        rt._recommend(cohort, c.rc, c.remembered)
    return True


def reuse_remembered(rt, c: Triage) -> bool:
    """Targets with a config remembered for this regime reuse it; the others are fresh. Never settles."""
    for ts in c.tss:
        r = c.remembered.get(ts.target.key)
        if r is not None and r[0] not in ts.unapplicable and r[3]:
            rt._start(Exploration(rt._xid(), trigger=c.rc.id, kind=c.rc.kind, members=[ts.target],
                                  incumbent=ts.active, policy=rt.policy, fingerprint=c.fp, t_start=rt.now,
                                  reuse=r[0], reuse_ref_s=r[1]),
                      "reuse", candidate=_n(r[0]), remembered_mean_s=r[1], **c.base)
            continue
        if r is not None and r[0] not in ts.unapplicable:
            # an exploration of this regime was interrupted: start from what it had found, keep looking
            ts.active = r[0]
            rt._decide("reuse", ts.target, candidate=_n(r[0]), partial=True, remembered_mean_s=r[1],
                       note="continues exploring from the remembered config", **c.base)
        c.fresh.append(ts)
    return False


def flapping(rt, c: Triage) -> bool:
    if c.rc.kind != "flapping":
        return False
    if c.fresh:
        rt._decide("ignore", None, **c.base, reason="flapping: nothing remembered; no exploration while "
                                                    "the network alternates", targets=len(c.fresh))
    return True


def explore(rt, c: Triage) -> bool:
    """Fresh targets out of their cooldown explore, one exploration per cohort."""
    cool = [ts for ts in c.fresh if rt.now - ts.last_decision_t < rt.policy.cooldown_s]
    if cool:
        rt._decide("ignore", None, **c.base, reason=f"cooldown {rt.policy.cooldown_s} s", targets=len(cool))
    for cohort in rt._cohorts([ts for ts in c.fresh if ts not in cool]):
        x = Exploration(rt._xid(), trigger=c.rc.id, kind=c.rc.kind, members=[ts.target for ts in cohort],
                        incumbent=cohort[0].active, policy=rt.policy, fingerprint=c.fp, t_start=rt.now)
        seeded = rt._seed_incumbent(x, c.rc)
        rt._start(x, "explore", **c.base, members=[ts.target.comm_name or ts.target.comm_hex for ts in cohort],
                  incumbent_samples_since_onset=seeded)
        if seeded:                 # the incumbent may already be measured well enough: probe from this push on
            rt._step(x)
            if x.id in rt.explorations:
                x.assign(allow_probe=rt.tokens > 0)
    return True


TRIAGE: tuple[Callable[[Any, Triage], bool], ...] = (
    adopt_recognized, recovery_of_self_induced, step_of_open_regime, self_induced, recovery, straggler,
    below_hysteresis,
    no_heavy_target, enter_regime, dry_run, reuse_remembered, flapping, explore,
)
