"""The retuner: regime changes + measured durations in, tuner config versions out.

In-process API (what ``dynamiccl demo`` and ``dynamiccl retuner run`` use)::

    rt = Retuner(RetunerConfig(dry_run=False, topology="h100-2x8", tuner_config_path=path))
    rt.on_change(rc)          # dynamiccl.detector.events.RegimeChange (or its JSON line)
    rt.on_window(wf)          # dynamiccl.collector.features.WindowFeatures: measured durations per (comm, func, size)
    rt.observe([obs, ...])    # or dynamiccl.retuner.types.Observation directly (evaluation, tests)
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
from collections import OrderedDict
from typing import Callable, Iterable

from dynamiccl.nccl_tuner_plugin.config import Rule
from dynamiccl.retuner.audit import AuditLog
from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.retuner.explore import Exploration, _n
from dynamiccl.retuner.inflight import InFlight
from dynamiccl.retuner.exploring import ExploringMixin
from dynamiccl.retuner.learned.policy import DEFAULT_WEIGHTS, LearnedPolicy
from dynamiccl.retuner.memory import Memory
from dynamiccl.retuner.metrics import RetunerMetrics
from dynamiccl.retuner.planner import Planner
from dynamiccl.retuner.push import ConfigPusher, PushError
from dynamiccl.retuner.recognition import RecognitionMixin
from dynamiccl.retuner.steps import StepMap
from dynamiccl.retuner.state import (
    Key,
    TargetState,
    _labels,
    _pin_rule,
    _tname,
    _token,
    observations_from_window,
)
from dynamiccl.retuner.triage import TriageMixin
from dynamiccl.retuner.types import Candidate, Observation, Target

__all__ = ["Retuner", "TargetState", "observations_from_window"]

log = logging.getLogger("retuner")


class Retuner(RecognitionMixin, TriageMixin, ExploringMixin):
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
        # the collector's window length (from the features; observe()'s callers use 1 s windows): how far back
        # from a detection the window that held it starts
        self.window_s = 1.0
        self.tokens = self.policy.budget_initial_s
        self.total_s = 0.0
        self._pushed_rules: tuple[Rule, ...] | None = None
        self._push_t = -math.inf             # event time of the newest push
        self._stale = False                  # a step that started after it still ran an older version
        self._republished = 0                # re-pushes of the same rules since the last change of them
        self._versions_echoed = False        # seen one of our versions in the input (else versions are not ours)
        self._inflight = InFlight(self.policy.max_in_flight_s)   # one version in flight
        self._lock = threading.RLock()
        self._xn = 0
        self._rn = 0                          # regimes recognised from the measurements
        self._started = False
        self._self_induced: OrderedDict[str, None] = OrderedDict()   # ids of changes ignored as self-induced
        self._steps = StepMap()               # steps of open incidents -> the regime their targets are in
        self._bad_targets: set[Key] = set()   # targets whose rule could not be built (audited once each)

    # ================================================================ inputs
    def on_change(self, rc) -> int | None:
        """A :class:`dynamiccl.detector.events.RegimeChange` (or its JSON line). Returns the version written, if any."""
        from dynamiccl.detector.events import RegimeChange
        from dynamiccl.detector.where_refresh import is_where_update
        with self._lock:
            if isinstance(rc, (str, bytes, dict)) and is_where_update(rc):
                self.metrics.inc("where_updates")   # a newer where on a change: no rule of ours uses it
                return None
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

    def on_transient_end(self, te) -> int | None:
        """A transient excursion ended (:class:`dynamiccl.detector.events.TransientEnd`, handed by the loop, not on
        the change stream): triaged as the recovery it stands for, so whatever was chosen for its changes reverts."""
        return self.on_change(te.as_recovery())

    def on_window(self, wf) -> int | None:
        """A :class:`dynamiccl.collector.features.WindowFeatures`; its ``keys`` rows become observations."""
        with self._lock:
            self.metrics.inc("windows")
            try:
                obs = list(observations_from_window(wf))
                if math.isfinite(float(wf.window_s)) and float(wf.window_s) > 0:
                    self.window_s = float(wf.window_s)
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
            if not stale and self._inflight.holds(self.now, self._versions_echoed):
                self.metrics.inc("pushes_held")
                return None              # written at the first call after it is seen applied (or the bound)
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
        self._inflight.pushed(v, self.now)
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
