"""Test-bed scenarios: the job's shape and a timeline of link changes (the ground truth).

An action happens ``at_s`` seconds after the warm-up ends:

* ``throttle`` — shape ``ranks``' links (``all`` = every rank) to ``mbit`` in both directions;
* ``release``  — back to the scenario's ``base_mbit``;
* ``bulk_on`` / ``bulk_off`` — start / stop a competing bulk TCP flow from the data node into
  each of ``ranks``.

Every action is one change the detector must report: a throttle or ``bulk_on`` a degradation
(localised to the rank when it targets one rank), a release or ``bulk_off`` a recovery.
``validate()`` insists on the issue's terms: at least a 30 % capacity change per throttle,
actions in time order inside the run, a release only for something throttled.

Built in: ``ci`` (10 changes, 104 s with the warm-up: the CI test's), ``tour`` (14 changes,
2.5 minutes).
A YAML file with the same fields works too::

    name: mine
    nranks: 4
    base_mbit: 50
    actions:
      - {at_s: 0, do: throttle, ranks: [2], mbit: 20}
      - {at_s: 8, do: release, ranks: [2]}

``detector: defaults`` runs the live detector at ``DetectorConfig()`` and gives it every window
(``dynamiccl replay``'s twin; the sparse job's scenarios, docs/testbed.md); the default
``testbed`` uses the test bed's settings (``dynamiccl/harness/testbed/detect.py``).

>>> s = builtin("ci")
>>> len(s.actions), s.actions[0].do, s.actions[0].ranks, s.duration_s
(10, 'throttle', (2,), 104.0)
>>> Scenario("x", actions=(Action(0, "throttle", (1,), 45.0),)).validate()
Traceback (most recent call last):
...
ValueError: scenario x: action 0 throttles to 45 Mbit/s, a 10% change (need >= 30% of base 50)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Action", "Scenario", "builtin", "load", "BUILTIN", "MIN_CHANGE"]

ACTIONS = ("throttle", "release", "bulk_on", "bulk_off")
DETECTORS = ("testbed", "defaults")  # the live detector's settings: detect.py's, or DetectorConfig() unchanged
MIN_CHANGE = 0.30


@dataclass(frozen=True)
class Action:
    at_s: float
    do: str
    ranks: tuple[int, ...] | None = None  # None = all ranks
    mbit: float | None = None             # throttle only
    direction: str = "both"               # throttle: both, ingress (what the ranks receive) or egress

    @property
    def degrades(self) -> bool:
        return self.do in ("throttle", "bulk_on")

    def describe(self, base_mbit: float) -> str:
        who = "all ranks" if self.ranks is None else "rank " + ",".join(map(str, self.ranks))
        if self.do == "throttle":
            way = "" if self.direction == "both" else f" {self.direction}"
            return f"throttle {who}{way} {base_mbit:g} -> {self.mbit:g} Mbit/s"
        if self.do == "release":
            return f"release {who} -> {base_mbit:g} Mbit/s"
        return f"bulk traffic into {who} {'on' if self.do == 'bulk_on' else 'off'}"


@dataclass(frozen=True)
class Scenario:
    name: str
    nranks: int = 4
    base_mbit: float = 50.0
    data_mbit: float = 500.0        # the data node's link (not the bottleneck)
    buckets: str = "64k,64k,128k,128k"  # gradient buckets all-reduced each step (DDP-like)
    batch_bytes: int = 256 * 1024   # loaded from the data node each step
    compute_ms: float = 5.0
    warmup_s: float = 35.0          # before the first action (>= settle_s + the detector's 60-window baseline)
    settle_s: float = 0.0           # first seconds of streaming not given to the detector (docs/testbed.md)
    tail_s: float = 7.0             # after the last action
    window_s: float = 0.5           # collector window
    lateness_s: float = 0.05        # collector allowed lateness (each rank's records arrive in start order)
    flush_ms: int = 20              # the torch source's flush interval
    mlock: bool = False             # ranks mlockall() their memory (tried: no measurable effect)
    queue_ms: int = 200             # tbf queue (latency) per link
    detector: str = "testbed"       # live detector: the test bed's settings (detect.py) or "defaults" (DetectorConfig())
    actions: tuple[Action, ...] = field(default_factory=tuple)

    @property
    def duration_s(self) -> float:
        last = self.actions[-1].at_s if self.actions else 0.0
        return self.warmup_s + last + self.tail_s

    def validate(self) -> "Scenario":
        n = f"scenario {self.name}"
        if not isinstance(self.nranks, int) or self.nranks < 2:
            raise ValueError(f"{n}: nranks must be an int >= 2, got {self.nranks!r}")
        for name in ("base_mbit", "data_mbit", "warmup_s", "tail_s", "window_s", "compute_ms"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"{n}: {name} must be > 0, got {v!r}")
        if self.detector not in DETECTORS:
            raise ValueError(f"{n}: detector must be one of {', '.join(DETECTORS)}, got {self.detector!r}")
        if self.batch_bytes < 0:
            raise ValueError(f"{n}: batch_bytes must be >= 0")
        if not isinstance(self.settle_s, (int, float)) or not 0 <= self.settle_s < self.warmup_s:
            raise ValueError(f"{n}: settle_s must be in [0, warmup_s), got {self.settle_s!r}")
        if not isinstance(self.lateness_s, (int, float)) or self.lateness_s < 0:
            raise ValueError(f"{n}: lateness_s must be >= 0, got {self.lateness_s!r}")
        if not isinstance(self.flush_ms, int) or self.flush_ms < 1:
            raise ValueError(f"{n}: flush_ms must be an int >= 1, got {self.flush_ms!r}")
        from dynamiccl.harness.testbed.worker import parse_buckets
        parse_buckets(self.buckets)
        throttled: set[int] = set()
        bulk: set[int] = set()
        prev = -1.0
        everyone = set(range(self.nranks))
        for i, a in enumerate(self.actions):
            if a.do not in ACTIONS:
                raise ValueError(f"{n}: action {i}: unknown action {a.do!r} (expected one of {', '.join(ACTIONS)})")
            if a.at_s < prev or a.at_s < 0:
                raise ValueError(f"{n}: action {i} at {a.at_s}s is before the previous one ({prev}s)")
            prev = a.at_s
            targets = everyone if a.ranks is None else set(a.ranks)
            if not targets <= everyone or not targets:
                raise ValueError(f"{n}: action {i}: ranks {a.ranks} not in 0..{self.nranks - 1}")
            if a.direction not in ("both", "ingress", "egress"):
                raise ValueError(f"{n}: action {i}: direction must be both, ingress or egress, got {a.direction!r}")
            if a.do == "throttle":
                if a.mbit is None or a.mbit <= 0:
                    raise ValueError(f"{n}: action {i}: throttle needs mbit > 0")
                change = 1 - a.mbit / self.base_mbit
                if change < MIN_CHANGE:
                    raise ValueError(f"{n}: action {i} throttles to {a.mbit:g} Mbit/s, a {change:.0%} change "
                                     f"(need >= {MIN_CHANGE:.0%} of base {self.base_mbit:g})")
                throttled |= targets
            elif a.do == "release":
                if not targets <= throttled:
                    raise ValueError(f"{n}: action {i} releases ranks that are not throttled")
                throttled -= targets
            elif a.do == "bulk_on":
                bulk |= targets
            elif not targets <= bulk:
                raise ValueError(f"{n}: action {i} stops bulk traffic that is not running")
            else:
                bulk -= targets
        return self


def _a(at, do, ranks=None, mbit=None, direction="both") -> Action:
    return Action(float(at), do, None if ranks is None else tuple(ranks), None if mbit is None else float(mbit),
                  direction)


BUILTIN = {
    # 10 changes, every kind of action, ~85 s of scenario time: the CI test's
    "ci": Scenario("ci", actions=(
        _a(0, "throttle", [2], 20), _a(7, "release", [2]),
        _a(14, "throttle", None, 25), _a(21, "release", None),
        _a(28, "bulk_on", [1]), _a(35, "bulk_off", [1]),
        _a(42, "throttle", [3], 25), _a(49, "release", [3]),
        _a(56, "throttle", [0], 20), _a(62, "release", [0]),
    )),
    # 14 changes, two minutes
    "tour": Scenario("tour", actions=(
        _a(0, "throttle", [2], 20), _a(8, "release", [2]),
        _a(16, "throttle", None, 25), _a(24, "release", None),
        _a(32, "bulk_on", [1]), _a(40, "bulk_off", [1]),
        _a(48, "throttle", [3], 15), _a(56, "release", [3]),
        _a(64, "throttle", [0], 30), _a(72, "release", [0]),
        _a(80, "throttle", None, 15), _a(88, "release", None),
        _a(96, "throttle", [1], 25), _a(104, "release", [1]),
    )),
}


def builtin(name: str) -> Scenario:
    try:
        return BUILTIN[name].validate()
    except KeyError:
        raise ValueError(f"unknown scenario {name!r} (built in: {', '.join(BUILTIN)}; or a YAML file)") from None


def load(name_or_path: str) -> Scenario:
    """A built-in scenario name or a YAML file path."""
    if name_or_path in BUILTIN:
        return builtin(name_or_path)
    path = Path(name_or_path)
    if not path.exists():
        raise ValueError(f"unknown scenario {name_or_path!r} (built in: {', '.join(BUILTIN)}; or a YAML file)")
    import yaml
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    fields = {f.name for f in dataclasses.fields(Scenario)}
    unknown = set(raw) - fields
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")
    actions = []
    for i, a in enumerate(raw.pop("actions", []) or []):
        if not isinstance(a, dict) or "at_s" not in a or "do" not in a:
            raise ValueError(f"{path}: action {i} needs at_s and do")
        ranks = a.get("ranks")
        if ranks == "all":
            ranks = None
        actions.append(_a(a["at_s"], a["do"], ranks, a.get("mbit"), a.get("direction", "both")))
    raw.setdefault("name", path.stem)
    return Scenario(**raw, actions=tuple(actions)).validate()
