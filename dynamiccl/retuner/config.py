"""Typed retuner configuration, validated at start-up (every error names the field).

Defaults follow docs/architecture.md (ports, tuner config path). ``dry_run`` is **on** by default: the
retuner then only recommends (audit log + metrics) and never writes the tuner config file.

>>> cfg = RetunerConfig()
>>> from dynamiccl.contracts.runtime_paths import default_tuner_config
>>> cfg.dry_run, cfg.tuner_config_path == default_tuner_config(), cfg.policy.exploration_budget
(True, True, 0.05)
>>> RetunerConfig(policy=PolicyConfig(exploration_budget=1.5)).validate()
Traceback (most recent call last):
...
ValueError: policy.exploration_budget must be in [0, 1], got 1.5
>>> RetunerConfig(deny=("RING/LLX",)).validate()
Traceback (most recent call last):
...
ValueError: deny[0]: 'RING/LLX' is not ALGO/PROTO[/CHANNELS] with names from NCCL (wildcard * allowed)
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dynamiccl.contracts import addresses
from dynamiccl.contracts.runtime_paths import runtime_dir
from dynamiccl.nccl_tuner_plugin.config import ALGOS, DEFAULT_PATH, FUNCS, PROTOS

__all__ = ["PolicyConfig", "Pin", "RetunerConfig", "DEFAULT_METRICS", "DEFAULT_CHANGES", "DEFAULT_FEATURES",
           "DEFAULT_AUDIT", "from_dict", "load_yaml"]

DEFAULT_METRICS = addresses.RETUNER_METRICS
DEFAULT_CHANGES = addresses.DETECTOR_EVENTS
DEFAULT_FEATURES = addresses.COLLECTOR_FEATURES
DEFAULT_AUDIT = "./runs/retuner-audit.jsonl"


def _num(obj: Any, name: str, lo: float, hi: float = math.inf, *, lo_open: bool = False, where: str) -> None:
    v = getattr(obj, name)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < lo or v > hi \
            or (lo_open and v == lo):
        lo_s, hi_s = f"{lo:g}", ("inf" if hi == math.inf else f"{hi:g}")
        rng = f"({lo_s}, {hi_s}]" if lo_open else f"[{lo_s}, {hi_s}]"
        raise ValueError(f"{where}{name} must be in {rng}, got {v!r}")


def _int(obj: Any, name: str, lo: int, hi: int = 1 << 30, *, where: str) -> None:
    v = getattr(obj, name)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"{where}{name} must be an int in [{lo}, {hi}], got {v!r}")


@dataclass(frozen=True)
class PolicyConfig:
    """How the retuner decides. Times are event-time seconds; counts are collectives of one target."""

    tune_at_start: bool = True          # explore each heavy target once at start-up (the "baseline" regime)
    start_after_s: float = 0.0          # ... once it has been seen this long (event time) and min_samples times. No
                                        # wait by default: min_samples already demands measurements, live windows
                                        # (1 s) show a whole step, and every step waited runs NCCL's choice (dev
                                        # a100-2x8 16 MiB +60 us, learned: captured 0.843 at 0.5 s, 0.929 at 0)
    min_change: float = 0.10            # hysteresis: ignore changes with |magnitude − 1| below this
    cooldown_s: float = 5.0             # after a commit/rollback, ignore further non-recovery changes this long
    max_cells: int = 4                  # (algo, proto) cells explored per trigger, best predicted first
    max_pred_ratio: float = 1.5         # skip cells the refitted model predicts this much slower than the incumbent
    prune_ratio: float = 1.5            # start-up: drop unrun candidates predicted this much slower than the best
    regime_prune_ratio: float = 3.0     # after a regime change (looser: NCCL's model misjudges regimes more)
    probe_parallel: int = 1             # unmeasured candidates started at once (best predicted first; their
                                        # results prune the others before they cost a step)
    regime_default_probe: bool = True   # after a regime change, NCCL's default is always one of the probes, so the
                                        # retuner never keeps a config measured slower than NCCL's own choice
    regime_family_probes: int = 2       # ... and the best cell of up to this many protocols/algorithms the round
                                        # lacks (not pruned by the model: its refit can rank the right cell away)
    start_cells: int = 7                # cells explored at start-up (no urgency: learn the model's per-cell bias)
    ranker: str = "model"               # who ranks round-1 candidates: "model" (NCCL's refitted model) | "learned"
    learned_extra_cells: int = 0        # ranker "learned": round 1 holds this many candidates more than the model's
    learned_cell_variants: bool = False  # ranker "learned": round 1 may hold one cell at several channel counts (else
                                        # its best-valued count only; the channel rounds refine the winner)
    learned_chunk_choices: bool = False  # ranker "learned": round 1 may hold the policy's chunk choices (½x, ¼x NCCL's
                                        # chunk; needs a weights file trained with them), else NCCL's chunk only
    learned_prune_ratio: float | None = 1.2    # ranker "learned": drop unrun candidates it predicts this much slower
                                        # than the best measured (None = prune_ratio / regime_prune_ratio, as the model;
                                        # its predictions are closer than the refit's: 0.7 % vs 13 % on validation)
    learned_start_max_rel: float | None = None  # ranker "learned", start-up: after its best-ranked candidate, only those
                                        # it predicts faster than this x NCCL's choice (None = no limit; 1.0 lost on
                                        # the development data: start-up probes also measure the baseline signatures
                                        # recognition needs, docs/evaluation/2026-11-27-retuner.md, session 10)
    learned_weights: str | None = None  # ranker "learned": weights file (None = the shipped retuner/learned/policy.npz)
    channel_rounds: int = 2             # channel coordinate-descent rounds (x2 / ÷2) on the winning cell
    min_samples: int = 24               # collectives per candidate before any test
    max_samples: int = 256              # per candidate; after this the exploration decides on the means
    alpha: float = 0.01                 # error rate of each sequential test (early stop, commit, rollback)
    min_gain: float = 0.01              # commit only if at least this much faster (and significant)
    rollback_margin: float = 0.01       # roll back if the committed config is this much slower than before
    verify_samples: int = 48            # collectives observed after a commit before it is confirmed
    exploration_budget: float = 0.05    # exploration excess time ≤ this fraction of observed collective time
    budget_initial_s: float = 0.0       # starting allowance (seconds of collective time)
    min_time_share: float = 0.01        # targets below this share of collective time are not tuned
    max_targets: int = 32               # per trigger
    apply_grace_s: float = 1.0          # windows starting this soon after a push are not attributed (the job
                                        # applies a version at its next step boundary; measured by version
                                        # instead when the input carries it); also how close to one of our
                                        # pushes a regime change's onset must be to be checked as self-induced
    max_not_applied: int = 2            # observations showing another algo/proto before "cannot apply"
    not_applied_s: float = 10.0         # ... counted only this long after push + grace (inputs without versions)
    recurrence_tolerance: float = 1.5   # magnitudes within this factor are the same regime fingerprint
    memory_max: int = 256               # fingerprints remembered
    history_s: float = 30.0             # observation history kept per target (before/after a change)
    lead_share: float = 0.5             # after a regime change, the best-predicted candidate starts on this share of
    lead_ratio: float = 0.8             # the cohort's members when predicted <= lead_ratio x the incumbent's
                                        # measured time (0 = one member, like every other candidate)
    max_republish: int = 3              # re-pushes of unchanged rules when inputs show (by version) that a step
                                        # began on an older version (a rank's copy was late or lost); 0 = never
    republish_after_s: float = 3.0      # only steps starting this long (event time) after a push count as missed: the
                                        # pipeline's lag (a live job's input is window + lateness ~3 s behind the job
                                        # its pushes reach; the in-process evaluation has no lag and uses 0)
    max_in_flight_s: float = 5.0        # new rules wait while our newest version is not yet seen applied in the input
                                        # (one version in flight, `dynamiccl.retuner.inflight`), at most this long
                                        # (event time) after its push; 0 = off
    recognize: bool = True              # recognise a regime seen before (or the baseline) from the measured durations
                                        # of the config in force, without waiting for the detector
    recognize_tolerance: float = 0.05   # ... when its measured mean is within this of what it measured in that regime
    recognize_obs: int = 1              # ... in this many consecutive observations (and far from the current regime's)
    recognize_cooldown_s: float = 2.0   # at most one recognised switch per target in this long (event time)
    recognize_siblings: bool = True     # ... and then switch the other targets of its communicator in the same regime
                                        # too (a config first run in the regime has no baseline time to match)

    def validate(self, where: str = "policy.") -> "PolicyConfig":
        for n in ("min_change", "rollback_margin", "min_gain", "apply_grace_s", "budget_initial_s", "cooldown_s",
                  "not_applied_s", "republish_after_s", "start_after_s", "max_in_flight_s"):
            _num(self, n, 0.0, where=where)
        _num(self, "exploration_budget", 0.0, 1.0, where=where)
        _num(self, "min_time_share", 0.0, 1.0, where=where)
        _num(self, "lead_share", 0.0, 1.0, where=where)
        _num(self, "lead_ratio", 0.0, 1.0, where=where)
        _num(self, "alpha", 0.0, 0.5, lo_open=True, where=where)
        _num(self, "max_pred_ratio", 1.0, where=where)
        _num(self, "prune_ratio", 1.0, where=where)
        _num(self, "regime_prune_ratio", 1.0, where=where)
        _num(self, "recurrence_tolerance", 1.0, lo_open=True, where=where)
        _num(self, "history_s", 0.0, lo_open=True, where=where)
        _num(self, "recognize_tolerance", 0.0, 0.5, lo_open=True, where=where)
        _num(self, "recognize_cooldown_s", 0.0, where=where)
        for n, lo in (("max_cells", 1), ("start_cells", 1), ("channel_rounds", 0), ("min_samples", 2), ("max_samples", 2),
                      ("verify_samples", 2), ("max_targets", 1), ("max_not_applied", 1), ("memory_max", 1),
                      ("probe_parallel", 1), ("max_republish", 0), ("recognize_obs", 1), ("regime_family_probes", 0),
                      ("learned_extra_cells", 0)):
            _int(self, n, lo, where=where)
        if self.ranker not in ("model", "learned"):
            raise ValueError(f"{where}ranker must be 'model' or 'learned', got {self.ranker!r}")
        if self.learned_weights is not None and not isinstance(self.learned_weights, str):
            raise ValueError(f"{where}learned_weights must be a path")
        if self.learned_start_max_rel is not None:
            _num(self, "learned_start_max_rel", 0.0, lo_open=True, where=where)
        if self.learned_prune_ratio is not None:
            _num(self, "learned_prune_ratio", 1.0, where=where)
        if self.max_samples < self.min_samples:
            raise ValueError(f"{where}max_samples ({self.max_samples}) must be >= min_samples ({self.min_samples})")
        for n in ("tune_at_start", "recognize", "recognize_siblings", "regime_default_probe", "learned_cell_variants",
                  "learned_chunk_choices"):
            if not isinstance(getattr(self, n), bool):
                raise ValueError(f"{where}{n} must be true or false")
        return self


@dataclass(frozen=True)
class Pin:
    """An operator's fixed choice: always applied, never explored. ``comm``/``size_bucket`` None = any."""

    func: str
    algo: str
    proto: str
    n_channels: int = 0
    comm: str | None = None            # "0x…" hash or a comm name
    size_bucket: int | None = None

    def validate(self, where: str) -> "Pin":
        if self.func not in FUNCS:
            raise ValueError(f"{where}.func {self.func!r} is not one of {', '.join(FUNCS)}")
        if self.algo not in ALGOS or self.proto not in PROTOS:
            raise ValueError(f"{where}: {self.algo}/{self.proto} is not an NCCL algorithm/protocol")
        if not 0 <= self.n_channels <= 64:
            raise ValueError(f"{where}.n_channels must be in [0, 64]")
        if self.size_bucket is not None and not 0 <= self.size_bucket <= 63:
            raise ValueError(f"{where}.size_bucket must be in [0, 63]")
        return self


def _pattern_ok(p: str) -> bool:
    parts = p.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        return False
    a, pr = parts[0].upper(), parts[1].upper()
    if not any(fnmatch.fnmatchcase(x, a) for x in ALGOS) or not any(fnmatch.fnmatchcase(x, pr) for x in PROTOS):
        return False
    return len(parts) == 2 or parts[2] == "*" or parts[2].isdigit()


@dataclass(frozen=True)
class RetunerConfig:
    dry_run: bool = True
    tuner_config_path: str = DEFAULT_PATH
    audit_path: str | None = DEFAULT_AUDIT
    topology: str | None = None          # simulator preset name or YAML path for NCCL's model; None = no model
    allow: tuple[str, ...] = ()          # ALGO/PROTO[/CHANNELS] patterns; empty = everything NCCL enables
    deny: tuple[str, ...] = ()
    pins: tuple[Pin, ...] = ()
    seed: int = 0
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    changes: str | None = DEFAULT_CHANGES     # detector regime-change stream (service only)
    features: str | None = DEFAULT_FEATURES   # collector feature stream (service only)
    metrics: str | None = DEFAULT_METRICS     # /metrics HOST:PORT (service only)
    jobs: tuple[str, ...] = ()           # service only: job_id patterns it acts on (dynamiccl/retuner/inputs.py)
    comms: tuple[str, ...] = ()          # service only: communicator name / 0x-hash patterns; empty = all
    allow_unauthenticated: bool = False  # service only: act on windows from a collector without tokens

    def validate(self) -> "RetunerConfig":
        if not isinstance(self.dry_run, bool):
            raise ValueError("dry_run must be true or false")
        if not isinstance(self.tuner_config_path, str) or not self.tuner_config_path:
            raise ValueError("tuner_config_path must be a non-empty path")
        parent = Path(self.tuner_config_path).parent
        if not self.dry_run and not parent.is_dir() and str(parent) != runtime_dir():  # that one is created
            raise ValueError(f"tuner_config_path: directory {str(parent)!r} does not exist")
        for name in ("allow", "deny"):
            for i, p in enumerate(getattr(self, name)):
                if not isinstance(p, str) or not _pattern_ok(p):
                    raise ValueError(f"{name}[{i}]: {p!r} is not ALGO/PROTO[/CHANNELS] with names from NCCL "
                                     f"(wildcard * allowed)")
        for i, pin in enumerate(self.pins):
            if not isinstance(pin, Pin):
                raise ValueError(f"pins[{i}] must be a Pin")
            pin.validate(f"pins[{i}]")
        if not isinstance(self.seed, int):
            raise ValueError("seed must be an int")
        self.policy.validate()
        if self.topology is not None:
            _load_topology(self.topology)
        return self

    def replace(self, **kw: Any) -> "RetunerConfig":
        if "policy" in kw and isinstance(kw["policy"], Mapping):
            kw["policy"] = dataclasses.replace(self.policy, **kw["policy"])
        return dataclasses.replace(self, **kw)

    def permitted(self, algo: str, proto: str, n_channels: int = 0) -> bool:
        """allow/deny lists: a candidate must match an allow pattern (if any) and no deny pattern."""
        name = f"{algo}/{proto}/{n_channels}"

        def match(p: str) -> bool:
            parts = p.upper().split("/")
            pat = "/".join(parts) if len(parts) == 3 else "/".join(parts) + "/*"
            return fnmatch.fnmatchcase(name, pat)

        if self.allow and not any(match(p) for p in self.allow):
            return False
        return not any(match(p) for p in self.deny)


def _load_topology(spec: str):
    from dynamiccl.nccl_model import topology as T
    try:
        if spec.endswith((".yaml", ".yml")) or "/" in spec:
            return T.load_yaml(spec)
        return T.preset(spec)
    except (KeyError, ValueError, OSError) as e:
        raise ValueError(f"topology: {e}") from None


def from_dict(data: Mapping[str, Any]) -> RetunerConfig:
    """Build from a mapping (YAML); unknown keys are errors naming the key."""
    if not isinstance(data, Mapping):
        raise ValueError("retuner config must be a mapping")
    names = {f.name for f in dataclasses.fields(RetunerConfig)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"retuner config: unknown key(s) {sorted(unknown)}; allowed: {sorted(names)}")
    kw = dict(data)
    if "policy" in kw:
        pol = kw["policy"] or {}
        pnames = {f.name for f in dataclasses.fields(PolicyConfig)}
        bad = set(pol) - pnames
        if bad:
            raise ValueError(f"policy: unknown key(s) {sorted(bad)}; allowed: {sorted(pnames)}")
        kw["policy"] = PolicyConfig(**pol)
    if "pins" in kw:
        pins = []
        for i, p in enumerate(kw["pins"] or []):
            if not isinstance(p, Mapping):
                raise ValueError(f"pins[{i}] must be a mapping")
            try:
                pins.append(Pin(**p))
            except TypeError as e:
                raise ValueError(f"pins[{i}]: {e}") from None
        kw["pins"] = tuple(pins)
    for k in ("allow", "deny"):
        if k in kw:
            kw[k] = tuple(kw[k] or ())
    return RetunerConfig(**kw).validate()


def load_yaml(path: str | Path) -> RetunerConfig:
    import yaml
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    try:
        return from_dict(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
