"""Explorations: start, step, verify, abort, close (a part of :class:`~dynamiccl.retuner.agent.Retuner`)."""
from __future__ import annotations

import logging
import math

from dynamiccl.retuner.explore import Event, Exploration, _n
from dynamiccl.retuner.learned.hook import learned_plan
from dynamiccl.retuner.planner import Plan
from dynamiccl.retuner.state import (
    TargetState,
    _labels,
    _tname,
)
from dynamiccl.retuner.stats import Running, slower_p
from dynamiccl.retuner.types import Candidate

log = logging.getLogger("retuner")


class ExploringMixin:
    # ================================================================ explorations
    def _xid(self) -> str:
        self._xn += 1
        return f"x{self._xn}"

    def _start(self, x: Exploration, action: str, **details) -> None:
        self.explorations[x.id] = x
        for m in x.members:
            self.targets[m.key].exploration = x.id
        self._decide(action, x.members[0] if len(x.members) == 1 else None, exploration=x.id,
                     incumbent=_n(x.incumbent), n_members=len(x.members),
                     target=_tname(x.members[0]), **details)

    def _abort(self, x: Exploration, *, reason: str, cutoff: float = math.inf) -> None:
        """Stop ``x``. What it already knows to be better (from samples that ended by ``cutoff``, the onset of
        whatever interrupted it) is remembered, so a recurrence of the regime starts from it."""
        self.explorations.pop(x.id, None)
        if x.mode == "explore" and x.trigger != "start" and x.phase in ("probe", "verify"):
            pol = self.policy
            cands = [c for c in x.stats if c != x.incumbent]
            inc = x.stats_until(x.incumbent, cutoff)
            good = []
            for c in cands:
                sc = x.stats_until(c, cutoff)
                if sc.n >= pol.min_samples and inc.n >= 2 and slower_p(inc, sc, margin=pol.min_gain) < pol.alpha:
                    good.append((sc.mean, _n(c), c, sc))
            if good:
                _, _, b, sb = min(good)
                kind, comms, mag = x.fingerprint
                self.memory.store(kind, comms, mag, {m.key: (b, sb.mean, inc.mean, False) for m in x.members})
        for m in x.members:
            ts = self.targets[m.key]
            if ts.exploration == x.id:
                ts.exploration = None
        self._decide("abort", None, exploration=x.id, reason=reason, target=_tname(x.members[0]),
                     n_members=len(x.members), phase=x.phase)

    def _ratio(self, ts: TargetState, start: float | None) -> float | None:
        """Measured mean after / before the regime's onset, for the config in force."""
        if start is None or not math.isfinite(start):
            return None
        before, after = Running(), Running()
        for t0, t1, n, mean, var, cand in ts.history:
            if cand != ts.active:
                continue
            if t1 <= start:
                before.add_batch(n, mean, var)
            elif t0 >= start:
                after.add_batch(n, mean, var)
        if before.n < 2 or after.n < 2:
            return None
        return after.mean / before.mean

    def _maybe_start(self) -> None:
        pol = self.policy
        if not pol.tune_at_start or self.total_s <= 0:
            return
        ready = []
        for ts in self.targets.values():
            if ts.start_done or ts.exploration or ts.regime is not None or ts.pinned is not None:
                continue
            if self.now - ts.first_t < pol.start_after_s or sum(h[2] for h in ts.history) < pol.min_samples:
                continue
            if ts.time_s / self.total_s < pol.min_time_share:
                continue
            ready.append(ts)
        ready = sorted(ready, key=lambda ts: -ts.time_s)[:pol.max_targets]
        for cohort in self._cohorts(ready):
            for ts in cohort:
                ts.start_done = True
            if self.cfg.dry_run:
                self._recommend(cohort, None, None)
                continue
            fp = ("baseline", tuple(sorted({ts.target.comm_hex for ts in cohort})), 1.0)
            self._start(Exploration(self._xid(), trigger="start", kind="baseline",
                                    members=[ts.target for ts in cohort], incumbent=cohort[0].active,
                                    policy=self.policy, fingerprint=fp, t_start=self.now), "explore",
                        regime="start", kind="baseline")

    def _plan_round1(self, x: Exploration) -> None:
        ts = self.targets[x.members[0].key]
        rc = self.regimes.get(x.trigger)
        ratio = None
        if rc is not None:
            ratio = self._ratio(ts, rc.start_s)
            if ratio is None and x.inc_stats.n >= 2:
                before = Running()
                for t0, t1, n, mean, var, cand in ts.history:
                    if cand == x.incumbent and t1 <= rc.start_s:
                        before.add_batch(n, mean, var)
                ratio = x.inc_stats.mean / before.mean if before.n >= 2 else None
        inc_cell = self.planner.cell_of(ts.target, x.incumbent, ts.observed_cell)
        unapp = set().union(*(self.targets[m.key].unapplicable for m in x.members))
        extra: list[Candidate] = []
        if x.trigger != "start" and inc_cell is not None and self.policy.channel_rounds > 0:
            # the incumbent at half / twice its channels: often the quickest win when bandwidth changes
            base = x.incumbent if x.incumbent is not None else Candidate(inc_cell[0], inc_cell[1], 0)
            extra = [c for c in self.planner.channel_variants(
                ts.target, base, (0.5, 2.0), unapp, ts.observed_channels if x.incumbent is None else None)
                if c != base]
        plan = self.planner.cells(ts.target, kind=x.kind, incumbent=x.incumbent, inc_cell=inc_cell, ratio=ratio,
                                  bias=ts.bias, unapplicable=unapp,
                                  max_cells=self.policy.start_cells if x.trigger == "start" else None,
                                  inc_measured_us=x.inc_stats.mean * 1e6 if x.inc_stats.n >= 2 else None)
        plan.candidates += [c for c in extra if c not in plan.candidates]     # model-ranked cells first
        model_plan = plan
        learned_info = None
        if self.learned is not None:        # ---- Policy seam: the learned policy re-ranks round 1 ----
            plan, learned_info = learned_plan(
                self.learned, self.planner, self.cfg, ts, x, plan, ratio=ratio, inc_cell=inc_cell, rc=rc,
                unapplicable=unapp,
                max_cells=(self.policy.start_cells if x.trigger == "start" else self.policy.max_cells) +
                self.policy.learned_extra_cells,
                inc_measured_us=x.inc_stats.mean * 1e6 if x.inc_stats.n >= 2 else None)
        x.default_cell = self.planner.cell_of(ts.target, None, None) if x.incumbent is not None else inc_cell
        if x.trigger != "start" and self.policy.regime_default_probe and \
                not any(x.is_default(c) for c in plan.candidates + [x.incumbent]):
            plan.candidates.append(None)     # NCCL's own choice: a config measured slower than it is never kept
        x.model_ranked = list(model_plan.ranked)
        x.model_inc_pred_us = model_plan.inc_pred_us
        x.fit = plan.fit
        x.inc_cell = inc_cell
        x.pred_us = dict(plan.predicted_us)
        x.inc_pred_us = plan.inc_pred_us
        x.prune_ratio = self.policy.prune_ratio if x.trigger == "start" else self.policy.regime_prune_ratio
        if learned_info is not None and self.policy.learned_prune_ratio is not None:
            x.prune_ratio = self.policy.learned_prune_ratio
        info = {"fit": {"dlat_us": round(plan.fit.dlat_us, 2), "beta": round(plan.fit.beta, 4)},
                "measured_ratio": ratio, "predicted_us": {c.name: round(v, 2) for c, v in plan.predicted_us.items()},
                "incumbent_predicted_us": plan.inc_pred_us, "skipped": plan.skipped}
        if learned_info is not None:
            info["learned"] = learned_info
        if not plan.candidates:
            self._finish_decision(x, x.decide())
            return
        self._decide("probe", None, exploration=x.id, target=_tname(x.members[0]),
                     **x.start_round(plan.candidates, info).details)

    def _family_round(self, x: Exploration) -> bool:
        """After round 1 of a regime change, once: when the unranked probe of NCCL's choice or the incumbent won and
        no ranked candidate tied with it within ``min_gain`` (else the ranking found as good a config) and a
        measured cell ran ``max_pred_ratio`` x faster than the refitted model predicted (so its vetoes cannot be
        trusted either), the best cell of each protocol/algorithm not measured yet is probed
        (:meth:`~dynamiccl.retuner.planner.Planner.diverse`)."""
        pol = self.policy
        if x.trigger == "start" or x.families_done or pol.regime_family_probes <= 0:
            return False
        x.families_done = True
        if x.best() is not None and x.best() != x.incumbent:
            return False                 # a ranked candidate won (NCCL's own cell too, when ranked): the ranking works
        if x.ranked_tie() is not None:
            return False                 # a ranked candidate ties with the winner: the ranking works as well
        why = x.misjudged(pol.max_pred_ratio)
        if why is None:
            return False
        ts = self.targets[x.members[0].key]
        unapp = set().union(*(self.targets[m.key].unapplicable for m in x.members))
        seen = Plan([c for c in x.stats if c is not None], fit=x.fit, ranked=x.model_ranked)
        cands = [c for c in self.planner.diverse(ts.target, seen, incumbent=None, inc_cell=x.inc_cell,
                                                 unapplicable=unapp, max_families=pol.regime_family_probes,
                                                 inc_measured_us=x.inc_stats.mean * 1e6)
                 if c is not None and c not in x.stats]
        if not cands:
            return False
        self._decide("probe", None, exploration=x.id, target=_tname(x.members[0]),
                     **x.start_round(cands, {"families": why}).details)
        return True

    def _update_bias(self, x: Exploration) -> None:
        m = self.planner.model(x.members[0])
        if m is None:
            return
        t = x.members[0]
        for c, s in x.stats.items():
            if s.n < self.policy.min_samples:
                continue
            if c is None:
                cell = x.default_cell
            elif c.n_channels == 0 and c.chunk_bytes == 0:
                cell = (c.algo, c.proto)
            else:
                continue
            if cell is None:
                continue
            pred = m.predict(t.func, t.nbytes(), cell, x.fit)
            if math.isfinite(pred) and pred > 0:
                for mem in x.members:
                    self.targets[mem.key].bias[cell] = s.mean * 1e6 / pred

    def _next_round(self, x: Exploration) -> bool:
        pol = self.policy
        if self._family_round(x):
            return True
        if x.channel_rounds_done >= pol.channel_rounds:
            return False
        best = x.best()
        ts = self.targets[x.members[0].key]
        obs_ch = None
        if best is None:                  # NCCL's own choice won: vary its channels
            if x.default_cell is None:
                return False
            obs_ch = ts.observed_channels
            best_c = Candidate(x.default_cell[0], x.default_cell[1], 0)
        else:
            best_c = best
        if x.channel_rounds_done == 0:
            factors = (0.5, 2.0)
        else:
            prev = x.best_before
            if prev is None or best_c == prev or (prev.algo, prev.proto) != (best_c.algo, best_c.proto):
                return False
            pc = self.planner.channels_of(ts.target, prev, ts.observed_channels if prev.n_channels == 0 else None) or 0
            bc = self.planner.channels_of(ts.target, best_c, obs_ch) or 0
            if not pc or not bc or pc == bc:
                return False
            factors = (2.0,) if bc > pc else (0.5,)
        unapp = set().union(*(self.targets[m.key].unapplicable for m in x.members))
        cands = [c for c in self.planner.channel_variants(ts.target, best_c, factors, unapp, obs_ch)
                 if c not in x.stats and c != best_c]
        if not cands:
            return False
        x.best_before = best_c
        x.channel_rounds_done += 1
        self._decide("probe", None, exploration=x.id, target=_tname(x.members[0]),
                     **x.start_round(cands, {"channels_of": _n(best)}).details)
        return True

    def _finish_decision(self, x: Exploration, ev: Event) -> None:
        for m in x.members:
            ts = self.targets[m.key]
            ts.active = x.committed
            if x.trigger != "start":           # start-up tuning does not start a cooldown
                ts.last_decision_t = self.now
        if ev.action == "keep" and x.trigger != "start" and x.inc_stats.n >= 2:
            # "nothing beats the incumbent here" is worth remembering too: a recurrence then costs nothing
            kind, comms, mag = x.fingerprint
            self.memory.store(kind, comms, mag, {m.key: (x.incumbent, x.inc_stats.mean, x.inc_stats.mean, True)
                                                 for m in x.members})
        self._decide(ev.action, None, exploration=x.id, target=_tname(x.members[0]),
                     n_members=len(x.members), **ev.details)

    def _step(self, x: Exploration) -> None:
        if x.phase == "incumbent":
            if x.incumbent_ready():
                self._plan_round1(x)
        if x.phase == "probe" and x.round_finished():
            self._update_bias(x)
            if not self._next_round(x):
                self._finish_decision(x, x.decide())
        if x.phase == "verify":
            for m in x.members:
                self.targets[m.key].active = x.committed
            ev = x.check_verify()
            if ev is not None:
                self._verified(x, ev)
        if x.phase == "done":
            self._close(x)

    def _verified(self, x: Exploration, ev: Event) -> None:
        if ev.action == "rollback":
            self.metrics.inc("rollbacks")
            for m in x.members:
                ts = self.targets[m.key]
                ts.active = x.incumbent
                ts.last_decision_t = self.now
                self.metrics.set_gain(_labels(m), None)
            self._decide("rollback", None, exploration=x.id, target=_tname(x.members[0]), **ev.details)
            return
        if ev.action == "reuse_failed":
            self._decide("abort", None, exploration=x.id, target=_tname(x.members[0]),
                         reason="remembered config measured slower than last time: exploring again", **ev.details)
            for m in x.members:
                ts = self.targets[m.key]
                ts.active = x.incumbent
                ts.exploration = None
            self.explorations.pop(x.id, None)
            cohort = [self.targets[m.key] for m in x.members]
            self._start(Exploration(self._xid(), trigger=x.trigger, kind=x.kind, members=x.members,
                                    incumbent=x.incumbent, policy=self.policy, fingerprint=x.fingerprint,
                                    t_start=self.now), "explore", regime=x.trigger, kind=x.kind,
                        members=[ts.target.comm_name or ts.target.comm_hex for ts in cohort])
            return
        # confirmed
        what = {}
        ref = x.reference.mean if x.reference is not None and x.reference.n else math.nan
        for m in x.members:
            ts = self.targets[m.key]
            if x.trigger != "start":
                ts.last_decision_t = self.now
            what[m.key] = (x.committed, x.verify.mean, ref, True)
            if math.isfinite(ref) and x.verify.n:
                self.metrics.set_gain(_labels(m), ref / x.verify.mean)
        if x.mode == "explore":
            kind, comms, mag = x.fingerprint
            if kind != "baseline":
                self.memory.store(kind, comms, mag, what)
        self._decide("keep" if x.mode == "explore" else "reuse", None, exploration=x.id,
                     target=_tname(x.members[0]), confirmed=True, **ev.details)

    def _close(self, x: Exploration) -> None:
        self.explorations.pop(x.id, None)
        for m in x.members:
            ts = self.targets[m.key]
            if ts.exploration == x.id:
                ts.exploration = None
            if x.trigger == "start":
                ts.baseline = ts.active
            elif ts.regime is None:
                pass

    def _advance(self) -> None:
        if not self.cfg.dry_run or self.policy.tune_at_start:
            self._maybe_start()
        for x in list(self.explorations.values()):
            if x.id in self.explorations:
                self._step(x)
        allow = self.tokens > 0
        for x in self.explorations.values():
            x.assign(allow_probe=allow)
        self.metrics.set_exploring(len(self.explorations))

