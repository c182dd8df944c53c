"""The retuner: regime changes + measured durations in, tuner config versions out.

In-process API (what ``dynamiccl demo`` and ``dynamiccl retuner run`` use)::

    rt = Retuner(RetunerConfig(dry_run=False, topology="h100-2x8", tuner_config_path=path))
    rt.on_change(rc)          # detector.events.RegimeChange (or its JSON line)
    rt.on_window(wf)          # collector.features.WindowFeatures: measured durations per (comm, func, size)
    rt.observe([obs, ...])    # or retuner.types.Observation directly (evaluation, tests)
    rt.status()               # per-target state, for views and tests

Every call returns the tuner-config version it wrote, or None. Nothing here raises on bad input after
construction: malformed inputs are counted (``dynamiccl_retuner_inputs_dropped_total{reason}``), failed
writes leave the last good file in place (``dynamiccl_retuner_push_errors_total``), and every decision
goes to the audit log and ``dynamiccl_retuner_decisions_total{action}``.

Time is event time (the ``window_start`` / ``detected_s`` clock of the inputs); the injected ``clock`` only
stamps audit lines.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from dynamiccl.contracts.collectives import bucket_range, collective
from dynamiccl.nccl_tuner_plugin.config import Rule

from dynamiccl.retuner.audit import AuditLog
from dynamiccl.retuner.config import Pin, RetunerConfig
from dynamiccl.retuner.explore import Event, Exploration, _n
from dynamiccl.retuner.memory import Memory
from dynamiccl.retuner.metrics import RetunerMetrics
from dynamiccl.retuner.planner import Planner
from dynamiccl.retuner.learned.hook import learned_plan
from dynamiccl.retuner.learned.policy import DEFAULT_WEIGHTS, LearnedPolicy
from dynamiccl.retuner.push import ConfigPusher, PushError
from dynamiccl.retuner.stats import Running, slower_p
from dynamiccl.retuner.types import Candidate, Observation, Target

__all__ = ["Retuner", "TargetState"]

log = logging.getLogger("retuner")
Key = tuple[int, str, int]
MAX_TARGETS = 4096


def _token(func: str) -> str | None:
    """The tuner file's token for a collective; None when the tuner is never asked about it (or unknown)."""
    try:
        return collective(func).tuner_token
    except ValueError:
        return None


def _log_dist(a: float, b: float) -> float:
    """How far apart two positive durations are, as a ratio: |log(a / b)|."""
    return abs(math.log(a / b))


@dataclass
class TargetState:
    target: Target
    active: Candidate | None = None          # what the retuner has in force (None = NCCL's choice)
    baseline: Candidate | None = None        # the config of the baseline regime (start-up tuning result)
    regime: str | None = None                # id of the regime change affecting it (None = baseline)
    regime_kind: str | None = None
    regime_start: float = -math.inf
    exploration: str | None = None
    history: deque = field(default_factory=lambda: deque(maxlen=512))   # (t0, t1, n, mean, var, cand)
    applies: deque = field(default_factory=lambda: deque(maxlen=64))    # (event time, cand)
    time_s: float = 0.0
    first_t: float = math.inf
    start_done: bool = False
    last_decision_t: float = -math.inf
    not_applied: int = 0
    unapplicable: set = field(default_factory=set)
    bias: dict = field(default_factory=dict)          # (algo, proto) -> measured / modelled
    observed_cell: tuple[str, str] | None = None
    observed_channels: int | None = None
    pinned: Candidate | None = None
    # regime recognition from the measured durations (``_recognize``)
    regime_key: tuple | None = None          # fingerprint of the regime it is in (Memory.key_for); None = baseline
    sig: OrderedDict = field(default_factory=OrderedDict)   # regime key -> {cand: _Sig (newest (t0, n, mean))}
    recog: tuple | None = None               # current streak: (regime key, observations, onset estimate)
    recog_t: float = -math.inf               # event time of the last recognised switch
    recog_onset: float = -math.inf           # the onset it estimated
    recog_check: dict | None = None          # a recognised switch whose first measurement is still to be checked


MAX_SIG_REGIMES = 16        # per target: regimes whose signature (per-config measured means) is kept
MAX_SIG_BATCHES = 32        # per (regime, config): newest observations kept


class _RKey(tuple):
    """A regime fingerprint (Memory.key_for) with its hash computed once: it holds every affected communicator, and
    it is looked up for every observation. Equal to (and hashes like) the plain tuple."""

    def __new__(cls, t) -> "_RKey":
        o = super().__new__(cls, t)
        o._h = tuple.__hash__(o)
        return o

    def __hash__(self) -> int:
        return self._h


_BASE = _RKey(("baseline",))  # the baseline regime's key in TargetState.sig


class _Sig:
    """One config's newest observations in one regime: (t_start, n, mean), their collective count, and a cached
    median of the means (recomputed after every 4th new observation: it moves slowly, and this runs per observation)."""
    __slots__ = ("q", "n", "adds", "med", "med_at")

    def __init__(self, entries=()) -> None:
        self.q: deque = deque(maxlen=MAX_SIG_BATCHES)
        self.n = 0
        self.adds = 0
        self.med: float | None = None
        self.med_at = -1
        for e in entries:
            self.add(e)

    def add(self, e: tuple[float, int, float]) -> None:
        if len(self.q) == MAX_SIG_BATCHES:
            self.n -= self.q[0][1]
        self.q.append(e)
        self.n += e[1]
        self.adds += 1

    def reset(self, entries) -> None:
        self.q.clear()
        self.n = 0
        self.med = None
        for e in entries:
            self.add(e)

    def median(self, min_n: int) -> float | None:
        if self.n < min_n or not self.q:
            return None
        if self.med is None or self.adds - self.med_at >= 4:
            ms = sorted(e[2] for e in self.q)
            self.med, self.med_at = ms[len(ms) // 2], self.adds
        return self.med


class Retuner:
    def __init__(self, cfg: RetunerConfig | None = None, *, clock: Callable[[], float] = time.time,
                 registry=None) -> None:
        self.cfg = (cfg or RetunerConfig()).validate()
        self.policy = self.cfg.policy
        self.clock = clock
        self.metrics = RetunerMetrics(registry)
        self.metrics.set_dry_run(self.cfg.dry_run)
        self.audit = AuditLog(self.cfg.audit_path, clock=clock, dry_run=self.cfg.dry_run,
                              on_error=lambda: self.metrics.inc("audit_errors"))
        self.pusher = ConfigPusher(self.cfg.tuner_config_path, dry_run=self.cfg.dry_run, clock=clock)
        if self.pusher.load_error:
            self.metrics.push_error("invalid_config")
            self.audit.write("error", t=None, error=self.pusher.load_error)
        self.metrics.set_version(self.pusher.version)
        self.planner = Planner(self.cfg)
        self.learned = LearnedPolicy.load(self.policy.learned_weights or DEFAULT_WEIGHTS) \
            if self.policy.ranker == "learned" else None          # Policy seam (dynamiccl.retuner.learned)
        self.memory = Memory(tolerance=self.policy.recurrence_tolerance, max_entries=self.policy.memory_max)
        self.targets: dict[Key, TargetState] = {}
        self.explorations: dict[str, Exploration] = {}
        self.regimes: OrderedDict[str, object] = OrderedDict()
        self.versions: OrderedDict[int, dict[Key, Candidate | None]] = OrderedDict()
        self.now = -math.inf
        self.tokens = self.policy.budget_initial_s
        self.total_s = 0.0
        self._pushed_rules: tuple[Rule, ...] | None = None
        self._push_t = -math.inf             # event time of the newest push
        self._stale = False                  # a step that started after it still ran an older version
        self._republished = 0                # re-pushes of the same rules since the last change of them
        self._versions_echoed = False        # seen one of our versions in the input (else versions are not ours)
        self._lock = threading.RLock()
        self._xn = 0
        self._rn = 0                          # regimes recognised from the measurements
        self._started = False
        self._self_induced: OrderedDict[str, None] = OrderedDict()   # ids of changes ignored as self-induced
        self._bad_targets: set[Key] = set()   # targets whose rule could not be built (audited once each)

    # ================================================================ inputs
    def on_change(self, rc) -> int | None:
        """A :class:`detector.events.RegimeChange` (or its JSON line). Returns the version written, if any."""
        from dynamiccl.detector.events import RegimeChange
        with self._lock:
            self.metrics.inc("changes")
            if not isinstance(rc, RegimeChange):
                try:
                    rc = RegimeChange.from_json(rc)
                except (ValueError, TypeError) as e:
                    self.metrics.drop("malformed")
                    log.warning("regime change dropped: %s", e)
                    return None
            try:
                self._on_change(rc)
            except Exception as e:              # never let one event take the service down
                log.exception("regime change %s: internal error", rc.id)
                self.audit.write("error", t=self.now, error=f"internal error on {rc.id}: {e!r}")
                self.metrics.drop("malformed")
            return self._safe_sync()

    def on_window(self, wf) -> int | None:
        """A :class:`collector.features.WindowFeatures`; its ``keys`` rows become observations."""
        with self._lock:
            self.metrics.inc("windows")
            try:
                obs = list(observations_from_window(wf))
            except Exception as e:
                self.metrics.drop("malformed")
                log.warning("window dropped: %s", e)
                return None
            return self.observe(obs)

    def observe(self, observations: Iterable[Observation]) -> int | None:
        with self._lock:
            for o in observations:
                self.metrics.inc("observations")
                try:
                    self._ingest(o)
                except Exception as e:
                    self.metrics.drop("malformed")
                    log.warning("observation dropped: %s", e)
            try:
                self._advance()
            except Exception as e:
                log.exception("retuner: internal error while advancing")
                self.audit.write("error", t=self.now, error=f"internal error: {e!r}")
            return self._safe_sync()

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
        if not src or old == new:
            return
        dst = None
        for c, sg in list(src.items()):
            if not sg.q or sg.q[-1][0] < t_from:
                continue
            moved = [e for e in sg.q if e[0] >= t_keep]
            sg.reset([e for e in sg.q if e[0] < t_from])
            if moved:
                if dst is None:
                    dst = self._sig_slot(ts, new)
                d = dst.get(c)
                if d is None:
                    dst[c] = _Sig(moved)
                else:
                    d.reset(sorted(list(d.q) + moved))

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
        if cand != chk.get("config", cand):
            return                                   # the switch has not reached the job yet
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
        self.now = max(self.now, rc.detected_s)
        self.regimes[rc.id] = rc
        while len(self.regimes) > 1024:
            self.regimes.popitem(last=False)
        base = {"regime": rc.id, "kind": rc.kind, "magnitude": rc.magnitude}
        adopted = self._adopt_recognized(rc, base)
        if adopted is True:
            return
        if rc.kind == "recovery" and rc.recovers is not None and rc.recovers in self._self_induced:
            self._decide("ignore", None, **base, self_induced=True, recovers=rc.recovers,
                         reason="recovery of a change that was ignored as self-induced")
            return
        if rc.kind != "straggler" and not adopted:     # adopted: the change is real, we recognised it ourselves
            why = self._self_induced_by_push(rc)
            if why is not None:
                self._self_induced[rc.id] = None
                while len(self._self_induced) > 1024:
                    self._self_induced.popitem(last=False)
                self._decide("ignore", None, **base, self_induced=True, **why,
                             reason="self-induced: the change coincides with our own push on the same targets "
                                    f"(within apply_grace_s={self.policy.apply_grace_s:g} s) and no config that "
                                    "ran unchanged across the onset changed")
                return
        if rc.kind == "recovery":
            tss = [ts for ts in self.targets.values() if rc.recovers is not None and ts.regime == rc.recovers]
            g = self.policy.apply_grace_s
            if not tss:       # (targets that recognised a change of their own since this onset are not its)
                tss = [ts for ts in self._targets_for(rc) if ts.regime is not None and ts.recog_onset < rc.start_s - g]
            for ts in tss:
                self._revert(ts, rc)
            if not tss:
                n_rec = sum(1 for ts in self._targets_for(rc) if ts.recog_onset >= rc.start_s - g)
                self._decide("ignore", None, **base, reason="recovery of a regime no target is in" +
                             (" (already recognised from the measurements)" if n_rec else ""),
                             **({"recognized": True, "targets": n_rec} if n_rec else {}))
            return
        if rc.kind == "straggler":
            self._decide("ignore", None, **base, reason="straggler: not a configuration problem (reported only)")
            return
        if not (math.isfinite(rc.magnitude) and rc.magnitude > 0) or abs(rc.magnitude - 1.0) < self.policy.min_change:
            self._decide("ignore", None, **base, reason=f"|magnitude - 1| below hysteresis {self.policy.min_change}")
            return
        all_tss = self._heavy(self._targets_for(rc))
        tss = [ts for ts in all_tss if not adopted or ts.target.key not in adopted]
        if not tss:
            self._decide("ignore", None, **base, reason="no affected target carries enough collective time")
            return
        comms = [ts.target.comm_hex for ts in all_tss]
        key = _RKey(self.memory.key_for(rc.kind, comms, rc.magnitude))
        t_keep = max(rc.start_s, rc.detected_s - 1.0)
        for ts in tss:
            x = self.explorations.get(ts.exploration) if ts.exploration else None
            if x is not None:
                self._abort(x, reason=f"new regime {rc.id}", cutoff=rc.start_s)
            self._sig_move(ts, ts.regime_key or _BASE, key, rc.start_s, t_keep)
            ts.regime, ts.regime_kind, ts.regime_start, ts.regime_key = rc.id, rc.kind, rc.start_s, key
        fp = (rc.kind, tuple(sorted(set(comms))), float(rc.magnitude))
        remembered = self.memory.lookup(rc.kind, comms, rc.magnitude) or {}
        if self.cfg.dry_run:
            for cohort in self._cohorts(tss):
                self._recommend(cohort, rc, remembered)
            return
        fresh = []
        for ts in tss:
            r = remembered.get(ts.target.key)
            if r is not None and r[0] not in ts.unapplicable and r[3]:
                self._start(Exploration(self._xid(), trigger=rc.id, kind=rc.kind, members=[ts.target],
                                        incumbent=ts.active, policy=self.policy, fingerprint=fp, t_start=self.now,
                                        reuse=r[0], reuse_ref_s=r[1]),
                            "reuse", candidate=_n(r[0]), remembered_mean_s=r[1], **base)
            else:
                if r is not None and r[0] not in ts.unapplicable:
                    # an exploration of this regime was interrupted: start from what it had found, keep looking
                    ts.active = r[0]
                    self._decide("reuse", ts.target, candidate=_n(r[0]), partial=True, remembered_mean_s=r[1],
                                 note="continues exploring from the remembered config", **base)
                fresh.append(ts)
        if rc.kind == "flapping":
            if fresh:
                self._decide("ignore", None, **base, reason="flapping: nothing remembered; no exploration while "
                                                            "the network alternates", targets=len(fresh))
            return
        cool = [ts for ts in fresh if self.now - ts.last_decision_t < self.policy.cooldown_s]
        if cool:
            self._decide("ignore", None, **base, reason=f"cooldown {self.policy.cooldown_s} s", targets=len(cool))
        for cohort in self._cohorts([ts for ts in fresh if ts not in cool]):
            x = Exploration(self._xid(), trigger=rc.id, kind=rc.kind, members=[ts.target for ts in cohort],
                            incumbent=cohort[0].active, policy=self.policy, fingerprint=fp, t_start=self.now)
            seeded = self._seed_incumbent(x, rc)
            self._start(x, "explore", **base, members=[ts.target.comm_name or ts.target.comm_hex for ts in cohort],
                        incumbent_samples_since_onset=seeded)
            if seeded:                 # the incumbent may already be measured well enough: probe from this push on
                self._step(x)
                if x.id in self.explorations:
                    x.assign(allow_probe=self.tokens > 0)

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
        t_min = max(rc.start_s, rc.detected_s - 1.0)
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
        self._sig_move(ts, ts.regime_key or _BASE, _BASE, rc.start_s, max(rc.start_s, rc.detected_s - 1.0))
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
                    good.append((sc.mean, c.name, c, sc))
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
            if self.now - ts.first_t < 2.0 or sum(h[2] for h in ts.history) < pol.min_samples:
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
        learned_info = None
        if self.learned is not None:        # ---- Policy seam: the learned policy re-ranks round 1 ----
            plan, learned_info = learned_plan(
                self.learned, self.planner, self.cfg, ts, x, plan, ratio=ratio, inc_cell=inc_cell, rc=rc,
                unapplicable=unapp, max_cells=(self.policy.start_cells if x.trigger == "start" else self.policy.max_cells) + 2,
                inc_measured_us=x.inc_stats.mean * 1e6 if x.inc_stats.n >= 2 else None)
        x.fit = plan.fit
        x.inc_cell = inc_cell
        x.pred_us = dict(plan.predicted_us)
        x.inc_pred_us = plan.inc_pred_us
        x.prune_ratio = self.policy.prune_ratio if x.trigger == "start" else self.policy.regime_prune_ratio
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

    def _update_bias(self, x: Exploration) -> None:
        m = self.planner.model(x.members[0])
        if m is None:
            return
        t = x.members[0]
        for c, s in x.stats.items():
            if s.n < self.policy.min_samples:
                continue
            if c is None:
                cell = x.inc_cell
            elif c.n_channels == 0:
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
        if x.round_no > pol.channel_rounds:
            return False
        best = x.best()
        ts = self.targets[x.members[0].key]
        obs_ch = None
        if best is None:                  # NCCL's own choice won: vary its channels
            if x.inc_cell is None:
                return False
            obs_ch = ts.observed_channels
            best_c = Candidate(x.inc_cell[0], x.inc_cell[1], 0)
        else:
            best_c = best
        if x.round_no == 1:
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

    # ================================================================ output
    def _pin_for(self, t: Target) -> Candidate | None:
        for p in self.cfg.pins:
            if p.func != _token(t.func):
                continue
            if p.size_bucket is not None and p.size_bucket != t.size_bucket:
                continue
            if p.comm is not None and p.comm.lower() not in (t.comm_hex, (t.comm_name or "").lower()):
                continue
            return Candidate(p.algo, p.proto, p.n_channels)
        return None

    def current(self) -> dict[Key, Candidate | None]:
        """What every target should run now (exploration assignment, else the active config)."""
        out = {}
        for k, ts in self.targets.items():
            if ts.pinned is not None:
                continue
            x = self.explorations.get(ts.exploration) if ts.exploration else None
            out[k] = x.assignment.get(k, ts.active) if x is not None else ts.active
        return out

    def _rules(self, cur: dict[Key, Candidate | None]) -> tuple[Rule, ...]:
        rules = [_pin_rule(p, self.targets) for p in self.cfg.pins]
        rules = [r for r in rules if r is not None]
        for k in sorted(cur):
            c = cur[k]
            if c is None:
                continue
            try:
                rules.append(c.rule(self.targets[k].target))
            except ValueError as e:             # one target the file cannot express never stops the others
                self._bad_target(k, e)
        return tuple(rules)

    def _bad_target(self, k: Key, e: ValueError) -> None:
        """Count every rule left out; audit and log once per target."""
        self.metrics.push_error("bad_target")
        if k in self._bad_targets:
            return
        self._bad_targets.add(k)
        tgt = self.targets[k].target
        self.audit.write("push_error", t=self.now, reason="bad_target", target=_tname(tgt), error=str(e),
                         note="this target's rule is left out; the other targets are pushed")
        log.error("target %s left out of the tuner config: %s", _tname(tgt), e)

    def _safe_sync(self) -> int | None:
        try:
            return self._sync()
        except Exception as e:                  # a failed push keeps the last good file; the next call retries
            log.exception("retuner: internal error while pushing")
            self.metrics.push_error("internal")
            self.audit.write("error", t=self.now, error=f"internal error while pushing: {e!r}")
            return None

    def _sync(self) -> int | None:
        if self.cfg.dry_run:
            return None
        cur = self.current()
        rules = self._rules(cur)
        stale, self._stale = self._stale, False
        if rules == self._pushed_rules:
            # the job reports (by version) that a step began after our push on an older version: a rank's copy
            # of the file was late or lost. Publish the same rules again as a new version so a rank that missed
            # one copy catches up at the next step boundary instead of at the distributor's next re-send (the
            # agreement still makes every rank switch together). Bounded: max_republish per change of rules.
            if not stale or self._republished >= self.policy.max_republish:
                return None
            self._republished += 1
            republish = True
        else:
            self._republished = 0
            republish = False
        try:
            v = self.pusher.push(list(rules))
        except PushError as e:
            self.metrics.push_error(e.reason)
            self.audit.write("push_error", t=self.now, reason=e.reason, error=str(e),
                             note=f"the plugin keeps version {self.pusher.version}")
            log.error("push failed (%s): %s; the plugin keeps version %d", e.reason, e, self.pusher.version)
            return None
        if v is None:
            return None
        prev = self.versions[next(reversed(self.versions))] if self.versions else {}
        self._pushed_rules = rules
        self._push_t = self.now
        self.versions[v] = {k: c for k, c in cur.items() if c is not None}
        while len(self.versions) > 64:
            self.versions.popitem(last=False)
        for k, ts in self.targets.items():
            if ts.pinned is None and prev.get(k) != cur.get(k):
                ts.applies.append((self.now, cur.get(k)))
                self.metrics.set_active(_labels(ts.target), None if cur.get(k) is None else
                                        (cur[k].algo, cur[k].proto, str(cur[k].n_channels)))
        self.metrics.inc("pushes")
        self.metrics.set_version(v)
        self.audit.write("push", t=self.now, version=v, rules=len(rules),
                         **({"republish": self._republished,
                             "reason": "the previous version was not applied at the last step boundary"}
                            if republish else {}))
        return v

    def _decide(self, action: str, tgt: Target | None, /, **details) -> None:
        self.metrics.decision(action)
        if tgt is not None:
            details.setdefault("target", _tname(tgt))
        self.audit.write(action, t=self.now, **details)

    # ================================================================ views
    def status(self) -> list[dict]:
        with self._lock:
            cur = self.current()
            return [{"target": _tname(ts.target), "active": _n(ts.active), "running": _n(cur.get(k, ts.pinned)),
                     "baseline": _n(ts.baseline), "regime": ts.regime, "exploring": ts.exploration,
                     "time_share": ts.time_s / self.total_s if self.total_s else 0.0}
                    for k, ts in sorted(self.targets.items())]

    def close(self) -> None:
        self.audit.close()


def _same_config_ratio(ts: TargetState, onset: float) -> float | None:
    """Mean after / before ``onset`` of the config with the most samples on both sides (intervals that straddle
    the onset left out); None if no config ran on both sides."""
    before: dict = {}
    after: dict = {}
    for t0, t1, n, mean, var, cand in ts.history:
        if t1 <= onset:
            before.setdefault(cand, Running()).add_batch(n, mean, var)
        elif t0 >= onset:
            after.setdefault(cand, Running()).add_batch(n, mean, var)
    both = [(min(before[c].n, after[c].n), c) for c in after if c in before]
    both = [(k, c) for k, c in both if k >= 2]
    if not both:
        return None
    c = max(both, key=lambda kc: kc[0])[1]
    return after[c].mean / before[c].mean if before[c].mean > 0 else None


def _mean_between(history, cand: Candidate | None, t_lo: float, t_hi: float) -> float | None:
    r = Running()
    for t0, t1, n, mean, var, c in history:
        if c == cand and t0 >= t_lo and t1 <= t_hi:
            r.add_batch(n, mean, var)
    return r.mean if r.n >= 2 and r.mean > 0 else None


def _mean_before(ts: TargetState, cand: Candidate | None, onset: float) -> float | None:
    """Mean of ``cand`` measured before ``onset`` in the regime the target is in (since its onset)."""
    return _mean_between(ts.history, cand, ts.regime_start, onset)


def _tname(t: Target) -> str:
    return f"{t.comm_name or t.comm_hex}/{t.func}/{t.size_bucket}"


def _labels(t: Target) -> tuple[str, str, str]:
    return (t.comm_name or t.comm_hex, t.func, str(t.size_bucket))


def _pin_rule(p: Pin, targets: dict[Key, TargetState]) -> Rule | None:
    comm = None
    if p.comm is not None:
        if p.comm.lower().startswith("0x"):
            comm = int(p.comm, 16)
        else:
            comm = next((ts.target.comm_hash for ts in targets.values() if ts.target.comm_name == p.comm), None)
            if comm is None:
                return None            # name not seen yet
    lo, hi = 0, (1 << 64) - 1
    if p.size_bucket is not None:
        t = next((ts.target for ts in targets.values() if _token(ts.target.func) == p.func
                  and ts.target.size_bucket == p.size_bucket and (comm is None or ts.target.comm_hash == comm)), None)
        lo, hi = t.byte_range() if t is not None else bucket_range(p.size_bucket)
    return Rule(p.func, lo, hi, p.algo, p.proto, p.n_channels, 0, comm)


def observations_from_window(wf) -> Iterable[Observation]:
    """Rows of a window's ``keys`` table → one :class:`Observation` each (P2P rows and rows without timing skipped).

    Variance per collective is estimated from the row's p50/p90 (normal: σ ≈ (p90 − p50) / 1.2816).
    """
    keys = wf.keys
    if keys is None or keys.height == 0:
        return
    t0, t1 = float(wf.window_start), float(wf.window_start) + float(wf.window_s)
    names = ["comm_hash", "comm_name", "func", "algo", "proto", "size_bucket", "nranks", "nnodes",
             "instances", "lat_mean_s", "lat_p50_s", "lat_p90_s"]
    # if the collector forwards the applied tuner-config version (profiler records carry it), attribute exactly
    has_v = "tuner_config_version" in keys.columns
    cols = keys.select(names + (["tuner_config_version"] if has_v else [])).rows()
    for row in cols:
        h, name, func, algo, proto, b, nr, nn, inst, mean, p50, p90 = row[:12]
        version = int(row[12]) if has_v and row[12] is not None else None
        if _token(str(func)) is None or mean is None or not inst or not (mean > 0):
            continue
        sig = (p90 - p50) / 1.2816 if (p90 is not None and p50 is not None and p90 > p50) else 0.01 * mean
        yield Observation(Target(int(h), str(func), int(b), int(nr or 0), int(nn or 0), str(name or "")),
                          t0, t1, int(inst), float(mean), float(sig * sig),
                          None if algo in (None, "UNKNOWN") else str(algo),
                          None if proto in (None, "UNKNOWN") else str(proto), version=version)
