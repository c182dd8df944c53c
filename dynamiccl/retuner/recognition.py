"""Observations in: attribution to the config that produced them, per-regime signatures, and the
regimes the targets recognise from the measurements themselves (a part of :class:`~dynamiccl.retuner.agent.Retuner`)."""
from __future__ import annotations

import logging
import math

from dynamiccl.retuner.explore import Exploration, _n
from dynamiccl.retuner.types import Candidate, Observation, Target

from dynamiccl.retuner.state import (
    _BASE,
    MAX_SIG_BATCHES,
    MAX_SIG_REGIMES,
    MAX_TARGETS,
    TargetState,
    _labels,
    _log_dist,
    _Sig,
    _tname,
    _token,
)

log = logging.getLogger("retuner")


class RecognitionMixin:
    # ================================================================ observations
    def _state(self, t: Target) -> TargetState | None:
        ts = self.targets.get(t.key)
        if ts is None:
            if len(self.targets) >= MAX_TARGETS:
                self.metrics.drop("unknown_target")
                return None
            ts = self.targets[t.key] = TargetState(t)
            ts.pinned = self._pin_for(t)
        elif (t.nranks and not ts.target.nranks) or (t.comm_name and not ts.target.comm_name):
            ts.target = t
        return ts

    def _attribute(self, ts: TargetState, o: Observation) -> tuple[bool, Candidate | None]:
        if ts.pinned is not None:
            return True, ts.pinned
        if o.version is not None:
            if o.version == 0:
                return True, None
            m = self.versions.get(o.version)
            if m is None:
                return False, None
            return True, m.get(ts.target.key)
        g = self.policy.apply_grace_s
        cand = None
        for t_apply, c in reversed(ts.applies):
            if t_apply < o.t_end and t_apply > o.t_start - g:
                return False, None          # the config changed inside (or just before) this interval
            if t_apply <= o.t_start - g:
                cand = c
                break
        return True, cand

    def _ingest(self, o: Observation) -> None:
        if not isinstance(o, Observation) or not o.valid():
            self.metrics.drop("malformed")
            return
        if _token(o.target.func) is None:       # P2P, Gather, Scatter, ...: no rule can name it
            self.metrics.drop("untunable")
            return
        ts = self._state(o.target)
        if ts is None:
            return
        self.now = max(self.now, o.t_end)
        if o.version is not None and o.version > 0 and o.version in self.versions:
            self._versions_echoed = True     # the input reports the versions we write: staleness can be judged
        self._inflight.observed(o.version)
        if self._versions_echoed and o.version is not None and \
                o.t_start >= self._push_t + self.policy.republish_after_s and \
                o.version < self.pusher.version:
            self._stale = True               # our newest version missed a step boundary it should have made
        ok, cand = self._attribute(ts, o)
        dur = o.n * o.mean_s
        self.total_s += dur
        ts.time_s += dur
        ts.first_t = min(ts.first_t, o.t_start)
        self.metrics.inc("collective_s", dur)
        self.tokens += self.policy.exploration_budget * dur
        if not ok:
            self.metrics.drop("unattributed")
            return
        if o.algo and o.proto and o.algo != "UNKNOWN":
            if cand is not None and (o.algo, o.proto) != (cand.algo, cand.proto):
                t_apply = next((t for t, c in reversed(ts.applies) if c == cand), -math.inf)
                if o.version is not None or o.t_start >= t_apply + self.policy.apply_grace_s + \
                        self.policy.not_applied_s:
                    self._not_applied(ts, cand, o)
                else:                        # probably not there yet (no version in the input to tell)
                    self.metrics.drop("unattributed")
                return
            ts.observed_cell = (o.algo, o.proto)
            if cand is None and o.n_channels:
                ts.observed_channels = o.n_channels
        ts.not_applied = 0
        ts.history.append((o.t_start, o.t_end, o.n, o.mean_s, o.var_s2, cand))
        while ts.history and ts.history[0][1] < self.now - self.policy.history_s:
            ts.history.popleft()
        x = self.explorations.get(ts.exploration) if ts.exploration else None
        if x is not None:
            inc = x.stats[x.incumbent]
            if x.phase == "probe" and cand != x.incumbent and inc.n >= 2:
                excess = max(0.0, (o.mean_s - inc.mean) * o.n)
                self.tokens -= excess
                self.metrics.inc("excess_s", excess)
            x.record(ts.target.key, cand, o.n, o.mean_s, o.var_s2, o.t_end)
        if ts.pinned is None:
            if self.policy.recognize and not self.cfg.dry_run:
                if ts.recog_check is not None and self.now - ts.recog_check["t"] > \
                        max(self.policy.recognize_cooldown_s, self.policy.apply_grace_s):
                    ts.recog_check = None                # the switch never showed up in the measurements
                if ts.recog_check is not None:
                    self._check_recognized(ts, cand, o)
                else:
                    self._recognize(ts, cand, o)
            self._sig_add(ts, cand, o)

    # ================================================================ regime recognition
    # Every config's measured durations are kept per regime the target was in (its *signature*: the baseline and
    # every regime fingerprint). When the config in force suddenly measures what it measured in another known
    # regime -- and far from what it measures in the current one -- for ``recognize_obs`` observations in a row,
    # that regime is back (or over): the remembered config is reused (the baseline's restored) at once instead of
    # after the detector's delay. A later report of the same change is then only adopted (see _on_change).
    def _sig_slot(self, ts: TargetState, key) -> dict:
        per = ts.sig.get(key)
        if per is None:
            per = ts.sig[key] = {}
            while len(ts.sig) > MAX_SIG_REGIMES:
                old = next((k for k in ts.sig if k not in (key, _BASE, ts.regime_key)), None)
                if old is None:
                    break
                del ts.sig[old]
        return per

    def _sig_add(self, ts: TargetState, cand: Candidate | None, o: Observation) -> None:
        per = self._sig_slot(ts, ts.regime_key or _BASE)
        sg = per.get(cand)
        if sg is None:
            if len(per) >= 64:
                return
            sg = per[cand] = _Sig()
        sg.add((o.t_start, o.n, o.mean_s))

    def _sig_mean(self, ts: TargetState, key, cand: Candidate | None) -> float | None:
        """Median of the per-observation means of ``cand`` in regime ``key`` (robust to the one observation that
        straddles a change); None with fewer than ``min_samples`` collectives."""
        per = ts.sig.get(key)
        sg = per.get(cand) if per is not None else None
        return sg.median(self.policy.min_samples) if sg is not None else None

    def _sig_move(self, ts: TargetState, old, new, t_from: float, t_keep: float) -> None:
        """A change at ``t_from``: observations of regime ``old`` that started at or after it leave it; those that
        started at or after ``t_keep`` (surely after the onset) go to ``new``."""
        src = ts.sig.get(old)
        if old == new:
            return
        since, ts.sig_since = ts.sig_since, t_from
        if not src:
            return
        dst = None
        for c, sg in list(src.items()):
            if not sg.q or sg.q[-1][0] < t_from:
                continue
            moved = [e for e in sg.q if e[0] >= t_keep]
            sg.reset(self._sig_before(ts, c, sg, since, t_from))
            if moved:
                if dst is None:
                    dst = self._sig_slot(ts, new)
                d = dst.get(c)
                if d is None:
                    dst[c] = _Sig(moved)
                else:
                    d.reset(sorted(list(d.q) + moved))

    @staticmethod
    def _sig_before(ts: TargetState, cand: Candidate | None, sg: _Sig, since: float, t_from: float) -> list:
        """``cand``'s observations in the regime that ends at ``t_from``. The signature keeps only the newest
        ``MAX_SIG_BATCHES``: the config in force during the detection delay may have filled it with the new regime's,
        so what it lost is taken back from the target's history (observations since that regime began, ``since``)."""
        kept = [e for e in sg.q if e[0] < t_from]
        if len(kept) >= MAX_SIG_BATCHES // 2:
            return kept
        since = kept[-1][0] if kept else since
        old = [(h[0], h[2], h[3]) for h in ts.history if h[5] == cand and since < h[0] < t_from]
        return (kept + old)[-MAX_SIG_BATCHES:]

    def _recognizable(self, ts: TargetState, key) -> bool:
        if key == _BASE:
            return ts.regime_key is not None
        r = (self.memory.get(key) or {}).get(ts.target.key)
        return r is not None and r[3] and r[0] not in ts.unapplicable

    def _recognize(self, ts: TargetState, cand: Candidate | None, o: Observation) -> None:
        pol = self.policy
        cur = ts.regime_key or _BASE
        if len(ts.sig) < 2:
            return
        m_cur = self._sig_mean(ts, cur, cand)
        if m_cur is None or o.mean_s <= 0:
            ts.recog = None
            return
        d_cur = _log_dist(o.mean_s, m_cur)
        if d_cur < math.log1p(pol.min_change):
            ts.recog = None
            return
        best, d_best, m_best = None, math.inf, math.nan
        for k in ts.sig:
            if k == cur:
                continue
            mk = self._sig_mean(ts, k, cand)
            if mk is not None:
                d = _log_dist(o.mean_s, mk)
                if d < d_best:
                    best, d_best, m_best = k, d, mk
        if best is None or d_best > math.log1p(pol.recognize_tolerance) or 3.0 * d_best > d_cur or \
                not self._recognizable(ts, best):
            ts.recog = None
            return
        if ts.recog is not None and ts.recog[0] == best:
            ts.recog = (best, ts.recog[1] + 1, ts.recog[2])
        else:
            ts.recog = (best, 1, o.t_start)
        if ts.recog[1] < pol.recognize_obs or self.now - ts.recog_t < pol.recognize_cooldown_s:
            return
        self._recognized(ts, best, ts.recog[2], {"config": _n(cand), "measured_s": o.mean_s,
                                                 "current_regime_s": m_cur, "recognized_regime_s": m_best,
                                                 "observations": ts.recog[1]})

    def _recognized(self, ts: TargetState, key, onset: float, evidence: dict) -> None:
        old_key = ts.regime_key or _BASE
        self._switch_recognized(ts, key, onset, evidence)
        if self.policy.recognize_siblings:
            for sib in self._siblings(ts, old_key, key):
                self._switch_recognized(sib, key, onset, {**evidence, "via": _tname(ts.target)})

    def _siblings(self, ts: TargetState, old_key, key) -> list[TargetState]:
        """The other targets of ``ts``'s communicator in the same regime: a network regime is the communicator's, so
        when one target's config measures another known regime, the others are in it too -- including those whose
        own config has no signature there (a config first run in the regime: the baseline cannot be recognised from
        it). Each switch is checked on its own first measurement (``_check_recognized``) and undone if wrong."""
        return [o for o in self.targets.values()
                if o is not ts and o.target.comm_hash == ts.target.comm_hash and (o.regime_key or _BASE) == old_key
                and o.pinned is None and o.recog_check is None and self._recognizable(o, key)]

    def _switch_recognized(self, ts: TargetState, key, onset: float, evidence: dict) -> None:
        x = self.explorations.get(ts.exploration) if ts.exploration else None
        old_key = ts.regime_key or _BASE
        self._sig_move(ts, old_key, key, onset, onset)
        ts.recog = None
        ts.recog_t, ts.recog_onset = self.now, onset
        ts.recog_check = {"old": old_key, "new": key, "onset": onset, "active": ts.active, "regime": ts.regime,
                          "regime_kind": ts.regime_kind, "regime_start": ts.regime_start, "t": self.now}
        ev = {"recognized": True, "onset_s": onset, **evidence}
        if x is not None:
            self._abort(x, reason="recognised a known regime from the measurements", cutoff=onset)
        if key == _BASE:
            old, prev = ts.active, ts.regime
            ts.active = ts.baseline if ts.baseline not in ts.unapplicable else None
            ts.regime = ts.regime_kind = ts.regime_key = None
            self.metrics.set_gain(_labels(ts.target), None)
            ts.last_decision_t = self.now
            ts.recog_check["config"] = ts.active
            self._decide("revert", ts.target, regime=None, recovers=prev, was=_n(old), now=_n(ts.active),
                         note="the baseline recognised from the measurements (before any detector report)", **ev)
            return
        r = self.memory.get(key)[ts.target.key]
        ts.recog_check["config"] = r[0]
        self._rn += 1
        rid = f"recognized-{self._rn}"
        ts.regime, ts.regime_kind, ts.regime_start, ts.regime_key = rid, key[0], onset, key
        self._start(Exploration(self._xid(), trigger=rid, kind=key[0], members=[ts.target], incumbent=ts.active,
                                policy=self.policy, fingerprint=key, t_start=self.now, reuse=r[0], reuse_ref_s=r[1]),
                    "reuse", candidate=_n(r[0]), remembered_mean_s=r[1], regime=rid, kind=key[0], magnitude=key[2],
                    note="a remembered regime recognised from the measurements (before any detector report)", **ev)

    def _check_recognized(self, ts: TargetState, cand: Candidate | None, o: Observation) -> None:
        """The first measurement of the config a recognised switch put in force: if it measures what it measures in
        the regime we thought had ended (and not what it measures in the recognised one), the recognition was
        wrong (an odd step): undo the switch at once (no cooldown), restoring the regime and config before it."""
        chk = ts.recog_check
        if cand != chk.get("config", cand) or o.t_start < chk["t"]:
            return                  # the switch has not reached the job yet, or this ran before the switch was made
        ts.recog_check = None
        m_old, m_new = self._sig_mean(ts, chk["old"], cand), self._sig_mean(ts, chk["new"], cand)
        if m_old is None or o.mean_s <= 0:
            return
        d_old = _log_dist(o.mean_s, m_old)
        d_new = _log_dist(o.mean_s, m_new) if m_new is not None else math.inf
        if d_old > math.log1p(self.policy.recognize_tolerance) or d_old >= d_new:
            return
        x = self.explorations.get(ts.exploration) if ts.exploration else None
        if x is not None:
            self._abort(x, reason="recognition undone")
        self._sig_move(ts, chk["new"], chk["old"], chk["onset"], chk["onset"])
        was = ts.active
        ts.active = chk["active"]
        ts.regime, ts.regime_kind, ts.regime_start = chk["regime"], chk["regime_kind"], chk["regime_start"]
        ts.regime_key = None if chk["old"] == _BASE else chk["old"]
        ts.recog_onset = -math.inf
        self._decide("unrecognize", ts.target, was=_n(was), now=_n(ts.active), config=_n(cand), measured_s=o.mean_s,
                     previous_regime_s=m_old, recognized_regime_s=m_new, regime=ts.regime,
                     reason="the config put in force measures what it measured before the recognised change: "
                            "the recognition was wrong; switched back")

    def _not_applied(self, ts: TargetState, cand: Candidate, o: Observation) -> None:
        ts.not_applied += 1
        self.metrics.drop("unattributed")
        if ts.not_applied < self.policy.max_not_applied:
            return
        ts.not_applied = 0
        ts.unapplicable.add(cand)
        self._decide("unapplicable", ts.target, candidate=cand.name, observed=f"{o.algo}/{o.proto}",
                     note="the plugin did not apply this config (NCCL disabled the cell?); not tried again here")
        x = self.explorations.get(ts.exploration) if ts.exploration else None
        if x is not None:
            x.eliminated.add(cand)
            if x.phase == "verify" and x.committed == cand:
                self._abort(x, reason=f"{cand.name} cannot be applied")
            else:                                     # a probe: drop it, the others go on
                for k, c in x.assignment.items():
                    if c == cand:
                        x.fresh[k] = True
        if ts.active == cand:
            ts.active = ts.baseline if ts.baseline not in ts.unapplicable else None

