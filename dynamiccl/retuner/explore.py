"""One bounded exploration on the live job, for a cohort of equivalent targets.

A cohort is the targets one trigger affects that share (collective, size bucket, communicator shape,
incumbent config) — e.g. the 8 data-parallel communicators of a TP8/DP2 job. Every training step each
member runs one candidate; with several members the candidates are spread over them and rotated every
step (a Latin-square design: each candidate is measured on several communicators, in the same steps as
its rivals, so a slow phase of the network does not favour one candidate). With one member the
candidates run one after the other.

Phases: ``incumbent`` (measure what runs now under the new regime) → ``probe`` (rounds of candidates from
the :class:`~dynamiccl.retuner.planner.Planner`; a candidate stops as soon as it is significantly worse than the
best so far, or once its mean is known to ±``min_gain``/2) → ``verify`` (the committed config alone, against
the incumbent measured in the same regime: significantly slower → roll back) → ``done``. ``reuse`` skips to
``verify`` with a remembered config, checked against what it measured last time.

This class is pure logic: the :class:`~dynamiccl.retuner.agent.Retuner` feeds it attributed samples and pushes its
assignments.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dynamiccl.retuner.config import PolicyConfig
from dynamiccl.retuner.model import NO_FIT, Fit
from dynamiccl.retuner.stats import Running, rel_halfwidth, slower_p
from dynamiccl.retuner.types import Candidate, Target

__all__ = ["Exploration", "Event"]

Key = tuple[int, str, int]


@dataclass
class Event:
    action: str
    details: dict = field(default_factory=dict)


class Exploration:
    def __init__(self, xid: str, *, trigger: str, kind: str, members: list[Target], incumbent: Candidate | None,
                 policy: PolicyConfig, fingerprint: tuple[str, tuple[str, ...], float], t_start: float,
                 reuse: Candidate | None = None, reuse_ref_s: float | None = None) -> None:
        self.id = xid
        self.trigger = trigger
        self.kind = kind
        self.members = list(members)
        self.incumbent = incumbent
        self.policy = policy
        self.fingerprint = fingerprint
        self.t_start = t_start
        self.stats: dict[Candidate | None, Running] = {incumbent: Running()}
        self.round: list[Candidate | None] = []
        self.round_no = 0
        self.eliminated: set[Candidate | None] = set()
        self.assignment: dict[Key, Candidate | None] = {m.key: incumbent for m in members}
        self.fresh: dict[Key, bool] = {m.key: False for m in members}
        self.rot = 0
        self.committed: Candidate | None = incumbent
        self.verify = Running()
        self.inc_clean = Running()          # the incumbent while every member ran it (incumbent phase)
        self.reference: Running | None = None
        self.channel_dir: float | None = None
        self.plan_info: dict = {}
        self.outcome: str | None = None
        self.fit: Fit = NO_FIT                          # the refit round 1 was planned with
        self.inc_cell: tuple[str, str] | None = None    # (algo, proto) the incumbent runs
        self.default_cell: tuple[str, str] | None = None    # (algo, proto) NCCL's own choice runs
        self.model_ranked: list[tuple[tuple[str, str], float]] = []  # the refitted model's cells (µs, calibrated)
        self.model_inc_pred_us: float | None = None     # ... and the incumbent's cell on the same scale
        self.families_done = False                      # the family round (regime changes) was considered
        self.channel_rounds_done = 0
        self.best_before: Candidate | None = None       # best before the current round (channel descent)
        self.pred_us: dict[Candidate, float] = {}       # calibrated-by-bias model prediction per candidate
        self.inc_pred_us: float | None = None
        self.pruned: list[str] = []
        self.prune_ratio = policy.prune_ratio
        self.batches: dict[Candidate | None, list[tuple[float, int, float, float]]] = {}
        self.per_obs_n = policy.min_samples             # collectives one member measures per step (updated)
        if reuse is not None or reuse_ref_s is not None:
            self.phase = "verify"
            self.committed = reuse
            if reuse_ref_s is not None:
                self.reference = Running(n=policy.verify_samples, mean=reuse_ref_s, m2=0.0)
            self.assignment = {m.key: reuse for m in members}
            self.mode = "reuse"
        else:
            self.phase = "incumbent"
            self.mode = "explore"

    # ---- samples ---------------------------------------------------------------------------------------
    def record(self, key: Key, cand: Candidate | None, n: int, mean: float, var: float, t: float) -> None:
        if key not in self.assignment:
            return
        if self.phase == "verify":
            if cand == self.committed:
                self.verify.add_batch(n, mean, var, t)
        elif cand in self.stats or cand in self.round:
            self.stats.setdefault(cand, Running()).add_batch(n, mean, var, t)
            if self.phase == "incumbent" and cand == self.incumbent:
                self.inc_clean.add_batch(n, mean, var, t)
            b = self.batches.setdefault(cand, [])
            if len(b) < 4096:
                b.append((t, n, mean, var))
        if cand == self.assignment.get(key):
            self.fresh[key] = True
        self.per_obs_n = max(1, n)

    @property
    def inc_stats(self) -> Running:
        return self.stats[self.incumbent]

    # ---- the state machine ----------------------------------------------------------------------------
    def _done(self, c: Candidate | None, best: Candidate | None) -> bool:
        s = self.stats.get(c)
        pol = self.policy
        if c in self.eliminated:
            return True
        if s is None or s.n < pol.min_samples:
            return False
        if s.n >= pol.max_samples:
            return True
        if c != best and slower_p(s, self.stats[best], margin=pol.min_gain) < pol.alpha:
            self.eliminated.add(c)
            return True
        return rel_halfwidth(s) <= pol.min_gain / 2

    def best(self) -> Candidate | None:
        pol = self.policy
        measured = [(s.mean, c is not self.incumbent, i, c) for i, (c, s) in enumerate(self.stats.items())
                    if s.n >= pol.min_samples]
        return min(measured)[3] if measured else self.incumbent

    def start_round(self, cands: list[Candidate], info: dict | None = None) -> Event:
        self.round_no += 1
        self.round = [c for c in cands if c not in self.stats]
        for c in self.round:
            self.stats[c] = Running()
        self.phase = "probe"
        if info:
            self.plan_info.update(info)
        return Event("probe", {"round": self.round_no, "candidates": [_n(c) for c in self.round], **(info or {})})

    def incumbent_ready(self) -> bool:
        s = self.inc_stats
        return s.n >= self.policy.min_samples and rel_halfwidth(s) <= max(self.policy.min_gain, 0.02)

    def round_finished(self) -> bool:
        b = self.best()
        return all(self._done(c, b) for c in self.round)

    def assign(self, *, allow_probe: bool) -> dict[Key, Candidate | None]:
        """Next per-member assignment. A member that has not measured its current assignment yet keeps it.

        Each pending candidate gets just enough members to reach ``min_samples`` this step (at least one;
        one while it only needs more precision); the other members run the best configuration known so
        far. Member order rotates every step, so each candidate is measured on different communicators.
        Candidates whose calibrated prediction is more than ``prune_ratio`` x the best measured mean are
        dropped without being run.
        """
        if self.phase == "probe":
            b = self.best()
            self._prune(b)
            pending = [c for c in self.round if not self._done(c, b)]
            # unmeasured candidates start a few at a time, best predicted first: the first results prune the rest
            # (a candidate NCCL's model badly misjudges costs a whole step on a member before any test can stop it)
            started = [c for c in pending if self.stats[c].n > 0 or c in self.assignment.values()]
            waiting = [c for c in pending if c not in started]
            pending = started + waiting[:max(0, self.policy.probe_parallel - len(started))]
            keys = [m.key for m in self.members]
            keys = keys[self.rot % len(keys):] + keys[:self.rot % len(keys)]
            free = [k for k in keys if self.fresh[k] or self.assignment[k] not in pending]
            busy = {k: self.assignment[k] for k in keys if k not in free}
            want: list[Candidate | None] = []
            if allow_probe:
                for c in pending:
                    have = sum(1 for v in busy.values() if v == c)
                    s = self.stats[c]
                    k = max(1, self.per_obs_n)
                    need = math.ceil(max(0, self.policy.min_samples - s.n) / k) if s.n < self.policy.min_samples else 1
                    if s.n == 0 and self._promising(c):
                        need = max(need, math.ceil(len(self.members) * self.policy.lead_share))
                    want += [c] * max(0, need - have)
            for i, k in enumerate(free):
                c = want[i] if i < len(want) else b
                if c != self.assignment[k]:
                    self.fresh[k] = False
                self.assignment[k] = c
            self.rot += 1
        elif self.phase == "incumbent":
            self.assignment = {m.key: self.incumbent for m in self.members}
        elif self.phase == "verify":
            self.assignment = {m.key: self.committed for m in self.members}
        return dict(self.assignment)

    def _promising(self, c: Candidate | None) -> bool:
        """After a regime change, the first candidate of round 1 when its calibrated prediction is at most
        ``lead_ratio`` x the incumbent's measured time in the new regime: it then starts on ``lead_share`` of the
        members instead of one, because the incumbent the others would run is already known to be slow."""
        pol = self.policy
        if self.trigger == "start" or self.round_no != 1 or not self.round or c != self.round[0] or \
                pol.lead_share <= 0 or len(self.members) < 2:
            return False
        inc = self.inc_stats
        p = self.pred_us.get(c)
        if p is None or not self.inc_pred_us or inc.n < pol.min_samples:
            return False
        scale = inc.mean * 1e6 / self.inc_pred_us           # calibrate the prediction to the incumbent's measurement
        return p * scale <= pol.lead_ratio * inc.mean * 1e6

    def _prune(self, best: Candidate | None) -> None:
        s = self.stats.get(best)
        if not self.pred_us or s is None or s.n < self.policy.min_samples or not self.inc_pred_us:
            return
        inc = self.inc_stats
        if inc.n < 2:
            return
        scale = inc.mean * 1e6 / self.inc_pred_us
        for c in self.round:
            p = self.pred_us.get(c)
            if c in self.eliminated or self.stats[c].n > 0 or p is None:
                continue
            if p * scale > self.prune_ratio * s.mean * 1e6:
                self.eliminated.add(c)
                self.pruned.append(_n(c))

    def decide(self) -> Event:
        """End of the last round: commit the winner if it is significantly better than the incumbent."""
        pol = self.policy
        b = self.best()
        inc = self.inc_stats
        if len(self.members) > 1 and self.inc_clean.n >= pol.min_samples:
            # with several members, the incumbent's samples from probing steps are inflated by the probes (ranks
            # shared with the probing communicators arrive late): decide against the clean incumbent phase
            inc = self.inc_clean
        if b is self.incumbent or b == self.incumbent:
            self.outcome = "keep"
            self.committed = self.incumbent
            self.phase = "done"
            return Event("keep", {"incumbent": _n(self.incumbent), "incumbent_mean_s": inc.mean,
                                  "measured": self.summary()})
        p = slower_p(inc, self.stats[b], margin=pol.min_gain)
        if p >= pol.alpha:
            self.outcome = "keep"
            self.committed = self.incumbent
            self.phase = "done"
            return Event("keep", {"incumbent": _n(self.incumbent), "best": _n(b), "p_value": p,
                                  "measured": self.summary()})
        self.committed = b
        self.reference = inc
        self.phase = "verify"
        self.verify = Running()
        self.assignment = {m.key: b for m in self.members}
        return Event("commit", {"candidate": _n(b), "incumbent": _n(self.incumbent),
                                "expected_gain": inc.mean / self.stats[b].mean, "p_value": p,
                                "measured": self.summary()})

    def check_verify(self) -> Event | None:
        pol = self.policy
        if self.phase != "verify" or self.verify.n < pol.verify_samples:
            return None
        ref = self.reference
        self.phase = "done"
        if ref is None or ref.n < 2:
            self.outcome = "confirmed"
            return Event("confirmed", {"candidate": _n(self.committed), "mean_s": self.verify.mean})
        margin = pol.rollback_margin if self.mode == "explore" else max(pol.rollback_margin, 0.05)
        p = slower_p(self.verify, ref, margin=margin)
        gain = ref.mean / self.verify.mean
        if p < pol.alpha:
            self.outcome = "rollback" if self.mode == "explore" else "reuse_failed"
            return Event(self.outcome, {"candidate": _n(self.committed), "mean_s": self.verify.mean,
                                        "reference_mean_s": ref.mean, "p_value": p, "gain": gain})
        self.outcome = "confirmed"
        return Event("confirmed", {"candidate": _n(self.committed), "mean_s": self.verify.mean,
                                   "reference_mean_s": ref.mean, "gain": gain})

    def is_default(self, c: Candidate | None) -> bool:
        """``c`` is NCCL's own choice: no rule, or a rule naming NCCL's default cell at NCCL's channels and chunk."""
        return c is None or (c.n_channels == 0 and c.chunk_bytes == 0 and (c.algo, c.proto) == self.default_cell)

    def ranked_tie(self) -> str | None:
        """A ranked candidate (not the incumbent, not the unranked probe of NCCL's choice) measured within
        ``min_gain`` (the margin a commit needs) of the best, as 'CANDIDATE', else None: the ranking found a config
        as good as the best measured -- NCCL's own cell ranked first, or NCCL's cell at another channel count."""
        pol = self.policy
        best = self.stats.get(self.best())
        if best is None or best.n < pol.min_samples:
            return None
        for c, s in self.stats.items():
            if c is None or c == self.incumbent or s.n < pol.min_samples:
                continue
            if s.mean <= best.mean * (1.0 + pol.min_gain):
                return _n(c)
        return None

    def misjudged(self, ratio: float) -> str | None:
        """The first measured cell that ran ``ratio`` x faster (relative to the incumbent) than the refitted model
        predicted, as 'CELL measured/predicted', else None. Channel variants carry no cell prediction."""
        pol = self.policy
        inc = self.inc_clean if self.inc_clean.n >= pol.min_samples else self.inc_stats
        pred = {c: us for c, us in self.model_ranked if math.isfinite(us) and us > 0}
        if inc.n < 2 or not self.model_inc_pred_us:
            return None
        for c, s in self.stats.items():
            if c == self.incumbent or s.n < pol.min_samples:
                continue
            cell = self.default_cell if c is None else ((c.algo, c.proto) if c.n_channels == 0 and c.chunk_bytes == 0 else None)
            p = pred.get(cell)
            if p is None:
                continue
            err = (s.mean / inc.mean) / (p / self.model_inc_pred_us)
            if err < 1.0 / ratio:
                return f"{_n(c)} measured {err:.2f}x its predicted time"
        return None

    def stats_until(self, cand: Candidate | None, t: float) -> Running:
        """``cand``'s samples from intervals that ended by ``t`` (e.g. before the next regime's onset)."""
        r = Running()
        for te, n, mean, var in self.batches.get(cand, ()):
            if te <= t:
                r.add_batch(n, mean, var, te)
        return r

    def summary(self) -> dict[str, dict]:
        return {_n(c): {"n": s.n, "mean_s": s.mean} for c, s in self.stats.items() if s.n > 0}


def _n(c: Candidate | None) -> str:
    return "NCCL-default" if c is None else c.name
