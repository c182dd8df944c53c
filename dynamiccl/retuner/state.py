"""The retuner's per-target state and the pure helpers around it (no decisions here)."""
from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Iterable

from dynamiccl.contracts.collectives import bucket_range, collective
from dynamiccl.nccl_tuner_plugin.config import Rule
from dynamiccl.retuner.config import Pin
from dynamiccl.retuner.stats import Running
from dynamiccl.retuner.types import Candidate, Observation, Target


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
    sig_since: float = -math.inf             # event time the regime of ``regime_key`` began (its signature's start)


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
