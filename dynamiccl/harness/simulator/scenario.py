"""Scenarios: timed network (and benign workload) events, compiled to a :class:`NetworkState` at any time.

An event is ``{at_s, kind, magnitude, duration_s?, nodes?|links?, ranks?, groups?, period_s?, duty?, ramp_s?}``.
``nodes`` (alias ``links``: link *i* is node *i*'s uplink) is a list of node ids or ``all`` (default);
``ranks`` lists global ranks. An event lasts ``duration_s``, or until the next ``recovery``, or to the end.

========================  ======================================================  ====================
kind                      effect (overlapping events compose)                     regime (nccl-cost-model §5.3)
========================  ======================================================  ====================
``bw_drop``               uplinks of ``nodes`` lose ``magnitude`` ∈ [0,1) of bw   R1 bandwidth loss
``latency``               ``magnitude`` µs added per network crossing             R2 latency inflation
``incast``                competing tenant holds share ``magnitude`` ∈ [0,1)      R3 incast (bursty)
                          while *on*: on for ``duty`` of every ``period_s``
``straggler``             ``ranks`` arrive ``magnitude`` µs late at every op      R5 straggler
``flap``                  like ``bw_drop`` but only for ``duty`` of each period   R5 flapping link
``degrading_nic``         lost bw ramps 0 → ``magnitude`` over ``ramp_s``         R5 degrading NIC
``recovery``              ends every network event active at ``at_s``             back to baseline
``mix`` (benign)          op sizes of ``groups`` (default all) × ``magnitude``    benign
``pause`` (benign)        checkpoint: no collectives for ``duration_s``           benign
========================  ======================================================  ====================

:meth:`Scenario.truth` is the ground-truth timeline (one dict per event, ``t_start``/``t_end`` in simulated
seconds and absolute ns); :func:`write_truth` writes it as JSON lines.

>>> from dynamiccl.harness.simulator.topology import preset as topo
>>> s = from_dict({"name": "x", "events": [{"at_s": 10, "kind": "bw_drop", "magnitude": 0.6, "nodes": [1]},
...                                        {"at_s": 20, "kind": "recovery"}]})
>>> [float(f) for f in s.state_at(15.0, topo("h100-2x8")).link_bw_factor]
[1.0, 0.4]
>>> s.state_at(25.0, topo("h100-2x8")).link_bw_factor
1.0
>>> [(e["kind"], e["t_start"], e["t_end"]) for e in s.truth(duration_s=30)]
[('bw_drop', 10.0, 20.0), ('recovery', 20.0, 20.0)]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.harness.simulator.perf_model import NetworkState
from dynamiccl.harness.simulator.topology import Topology

__all__ = ["Event", "Scenario", "ScenarioError", "KINDS", "BENIGN_KINDS", "from_dict", "load_yaml",
           "preset", "preset_names", "load", "write_truth"]

SCENARIO_DIR = Path(__file__).with_name("scenarios")
KINDS = ("bw_drop", "latency", "incast", "straggler", "flap", "degrading_nic", "recovery", "mix", "pause")
BENIGN_KINDS = ("mix", "pause")
REGIMES = {"bw_drop": "R1", "latency": "R2", "incast": "R3", "straggler": "R5", "flap": "R5",
           "degrading_nic": "R5", "recovery": "baseline", "mix": "benign", "pause": "benign"}
RAMP_QUANTUM_S = 0.5      # degrading_nic changes in steps of this size (bounded caches, few state changes)
_NODE_KINDS = ("bw_drop", "latency", "incast", "flap", "degrading_nic")


class ScenarioError(ValueError):
    """A scenario is invalid; the message names the offending field."""


@dataclass(frozen=True)
class Event:
    at_s: float
    kind: str
    magnitude: float = 0.0
    duration_s: float | None = None
    nodes: tuple[int, ...] | None = None     # None = all nodes
    ranks: tuple[int, ...] = ()
    groups: tuple[str, ...] | None = None    # mix: None = all groups
    period_s: float = 2.0
    duty: float = 0.5
    ramp_s: float = 10.0
    end_s: float = math.inf                  # resolved by Scenario (duration, recovery, or never)

    @property
    def benign(self) -> bool:
        return self.kind in BENIGN_KINDS

    def active(self, t: float) -> bool:
        return self.at_s <= t < self.end_s

    def on(self, t: float) -> bool:
        """For flap/incast: inside an on (bad) phase."""
        return ((t - self.at_s) % self.period_s) < self.duty * self.period_s

    def ramp(self, t: float) -> float:
        q = math.floor((t - self.at_s) / RAMP_QUANTUM_S + 1e-9) * RAMP_QUANTUM_S
        return min(1.0, max(0.0, q / self.ramp_s))


@dataclass(frozen=True)
class Scenario:
    name: str
    events: tuple[Event, ...] = ()
    noise_sigma: float = 0.02
    duration_s: float | None = None
    description: str = ""
    _net: tuple[Event, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_net", tuple(e for e in self.events if not e.benign and e.kind != "recovery"))

    # ---- validation against a topology --------------------------------------------------------------
    def validate_for(self, topology: Topology, groups: tuple[str, ...] = ()) -> "Scenario":
        for i, e in enumerate(self.events):
            if e.nodes is not None and any(not 0 <= n < topology.n_nodes for n in e.nodes):
                raise ScenarioError(f"events[{i}].nodes {list(e.nodes)} outside [0, {topology.n_nodes}) "
                                    f"of topology {topology.name}")
            if any(not 0 <= r < topology.n_ranks for r in e.ranks):
                raise ScenarioError(f"events[{i}].ranks {list(e.ranks)} outside [0, {topology.n_ranks}) "
                                    f"of topology {topology.name}")
            if groups and e.groups is not None and set(e.groups) - set(groups):
                raise ScenarioError(f"events[{i}].groups {sorted(set(e.groups) - set(groups))} not in the "
                                    f"workload's groups {list(groups)}")
        return self

    # ---- compilation ------------------------------------------------------------------------------
    def state_at(self, t: float, topology: Topology) -> NetworkState:
        """The network at simulated time ``t`` (s). Scalars when uniform, else per-node / per-rank arrays."""
        nn, nr = topology.n_nodes, topology.n_ranks
        bw = np.ones(nn)
        lat = np.zeros(nn)
        free = np.ones(nn)          # 1 - competing share, multiplied over incasts
        delay = np.zeros(nr)
        for e in self._net:
            if not e.active(t):
                continue
            sel = slice(None) if e.nodes is None else list(e.nodes)
            if e.kind == "bw_drop":
                bw[sel] *= 1.0 - e.magnitude
            elif e.kind == "flap":
                if e.on(t):
                    bw[sel] *= 1.0 - e.magnitude
            elif e.kind == "degrading_nic":
                bw[sel] *= 1.0 - e.magnitude * e.ramp(t)
            elif e.kind == "latency":
                lat[sel] += e.magnitude
            elif e.kind == "incast":
                if e.on(t):
                    free[sel] *= 1.0 - e.magnitude
            elif e.kind == "straggler":
                delay[list(e.ranks)] += e.magnitude

        def pack(a: np.ndarray) -> float | tuple[float, ...]:
            return float(a[0]) if np.all(a == a[0]) else tuple(float(x) for x in a)

        return NetworkState(link_bw_factor=pack(np.maximum(bw, 1e-3)), added_latency_us=pack(lat),
                            competing_share=pack(np.minimum(1.0 - free, 0.999)), rank_delay_us=pack(delay),
                            noise_sigma=self.noise_sigma)

    def change_times(self, until_s: float) -> np.ndarray:
        """Sorted simulated times (s) in (0, until_s] at which :meth:`state_at` may change."""
        ts: list[float] = []
        for e in self._net:
            end = min(e.end_s, until_s)
            ts += [e.at_s, end]
            if e.kind in ("flap", "incast"):
                k = np.arange(0, max(0.0, end - e.at_s) / e.period_s + 1)
                ts += list(e.at_s + k * e.period_s) + list(e.at_s + (k + e.duty) * e.period_s)
            elif e.kind == "degrading_nic":
                ts += list(e.at_s + np.arange(0.0, min(e.ramp_s, end - e.at_s) + 1e-9, RAMP_QUANTUM_S))
        a = np.unique(np.asarray(ts, dtype=np.float64))
        return a[(a > 0) & (a <= until_s)]

    def pause_until(self, t: float) -> float | None:
        """End of a checkpoint pause covering ``t``, else None."""
        ends = [e.end_s for e in self.events if e.kind == "pause" and e.active(t)]
        return max(ends) if ends else None

    def size_scale(self, t: float, group: str) -> float:
        s = 1.0
        for e in self.events:
            if e.kind == "mix" and e.active(t) and (e.groups is None or group in e.groups):
                s *= e.magnitude
        return s

    # ---- ground truth -----------------------------------------------------------------------------
    def truth(self, *, duration_s: float, epoch_ns: int = 0) -> list[dict[str, Any]]:
        out = []
        for i, e in enumerate(self.events):
            if e.at_s > duration_s:
                continue
            end = e.at_s if e.kind == "recovery" else min(e.end_s, duration_s)
            where: dict[str, Any] = {}
            if e.kind in _NODE_KINDS:
                where["nodes"] = "all" if e.nodes is None else list(e.nodes)
            if e.ranks:
                where["ranks"] = list(e.ranks)
            if e.kind == "mix":
                where["groups"] = "all" if e.groups is None else list(e.groups)
            params: dict[str, float] = {}
            if e.kind in ("flap", "incast"):
                params = {"period_s": e.period_s, "duty": e.duty}
            elif e.kind == "degrading_nic":
                params = {"ramp_s": e.ramp_s}
            out.append({
                "id": i, "kind": e.kind, "t_start": float(e.at_s), "t_end": float(end),
                "t_start_ns": int(epoch_ns + round(e.at_s * 1e9)), "t_end_ns": int(epoch_ns + round(end * 1e9)),
                "magnitude": float(e.magnitude), "where": where, "benign": e.benign,
                "regime": REGIMES[e.kind], "params": params,
            })
        return out


def write_truth(path: str | Path, scenario: Scenario, *, duration_s: float, epoch_ns: int = 0) -> Path:
    """Write the ground-truth timeline as JSON lines (atomically: tmp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, "".join(json.dumps(row) + "\n"
                               for row in scenario.truth(duration_s=duration_s, epoch_ns=epoch_ns)))
    return path


# ------------------------------------------------------------------------------------------------
# parsing
# ------------------------------------------------------------------------------------------------
_EVENT_KEYS = {"at_s", "kind", "magnitude", "duration_s", "nodes", "links", "ranks", "groups", "period_s",
               "duty", "ramp_s"}


def _num(d: Mapping, key: str, where: str, *, lo: float | None = None, hi: float | None = None,
         lo_open: bool = False, hi_open: bool = False, default: float | None = None) -> float | None:
    v = d.get(key, default)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise ScenarioError(f"{where}.{key} must be a finite number, got {v!r}")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ScenarioError(f"{where}.{key} must be {'>' if lo_open else '>='} {lo}, got {v!r}")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise ScenarioError(f"{where}.{key} must be {'<' if hi_open else '<='} {hi}, got {v!r}")
    return float(v)


def _ints(v: Any, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ScenarioError(f"{where} must be a non-empty list of ints, got {v!r}")
    return tuple(v)


def _event(d: Any, where: str) -> Event:
    if not isinstance(d, Mapping):
        raise ScenarioError(f"{where} must be a mapping")
    unknown = set(d) - _EVENT_KEYS
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_EVENT_KEYS)}")
    kind = d.get("kind")
    if kind not in KINDS:
        raise ScenarioError(f"{where}.kind must be one of {KINDS}, got {kind!r}")
    at = _num(d, "at_s", where, lo=0.0)
    if at is None:
        raise ScenarioError(f"{where}.at_s is required")
    mag_rules = {"bw_drop": dict(lo=0.0, hi=1.0, hi_open=True), "flap": dict(lo=0.0, hi=1.0, hi_open=True),
                 "degrading_nic": dict(lo=0.0, hi=1.0, hi_open=True), "incast": dict(lo=0.0, hi=1.0, hi_open=True),
                 "latency": dict(lo=0.0), "straggler": dict(lo=0.0), "mix": dict(lo=0.0, lo_open=True)}
    if kind in mag_rules:
        if "magnitude" not in d:
            raise ScenarioError(f"{where}.magnitude is required for kind {kind}")
        mag = _num(d, "magnitude", where, **mag_rules[kind])
    else:
        if "magnitude" in d:
            raise ScenarioError(f"{where}.magnitude is not used by kind {kind}")
        mag = 0.0
    dur = _num(d, "duration_s", where, lo=0.0, lo_open=True)
    if kind == "pause" and dur is None:
        raise ScenarioError(f"{where}.duration_s is required for kind pause")
    if kind == "recovery" and dur is not None:
        raise ScenarioError(f"{where}.duration_s is not used by kind recovery")
    if "nodes" in d and "links" in d:
        raise ScenarioError(f"{where}: give nodes or links (an alias), not both")
    nkey = "links" if "links" in d else "nodes"
    nodes_v = d.get(nkey, "all")
    if nkey in d and kind not in _NODE_KINDS:
        raise ScenarioError(f"{where}.{nkey} is not used by kind {kind}")
    nodes = None if nodes_v == "all" else _ints(nodes_v, f"{where}.{nkey}")
    ranks: tuple[int, ...] = ()
    if kind == "straggler":
        ranks = _ints(d.get("ranks"), f"{where}.ranks")
    elif "ranks" in d:
        raise ScenarioError(f"{where}.ranks is only used by kind straggler")
    groups = None
    if "groups" in d:
        if kind != "mix":
            raise ScenarioError(f"{where}.groups is only used by kind mix")
        g = d["groups"]
        if not isinstance(g, list) or not g or not all(isinstance(x, str) for x in g):
            raise ScenarioError(f"{where}.groups must be a non-empty list of group names, got {g!r}")
        groups = tuple(g)
    for key in ("period_s", "duty"):
        if key in d and kind not in ("flap", "incast"):
            raise ScenarioError(f"{where}.{key} is only used by kinds flap and incast")
    if "ramp_s" in d and kind != "degrading_nic":
        raise ScenarioError(f"{where}.ramp_s is only used by kind degrading_nic")
    period = _num(d, "period_s", where, lo=0.0, lo_open=True, default=2.0)
    duty = _num(d, "duty", where, lo=0.0, hi=1.0, lo_open=True, hi_open=True, default=0.5)
    ramp = _num(d, "ramp_s", where, lo=0.0, lo_open=True, default=10.0)
    return Event(at_s=at, kind=kind, magnitude=float(mag), duration_s=dur, nodes=nodes, ranks=ranks,
                 groups=groups, period_s=float(period), duty=float(duty), ramp_s=float(ramp))


def from_dict(data: Mapping[str, Any]) -> Scenario:
    """Build and validate a scenario (errors name the field: ``events[2].magnitude …``)."""
    if not isinstance(data, Mapping):
        raise ScenarioError("scenario must be a mapping")
    allowed = {"name", "description", "duration_s", "noise_sigma", "events"}
    unknown = set(data) - allowed
    if unknown:
        raise ScenarioError(f"scenario: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"name must be a non-empty string, got {name!r}")
    sigma = _num(data, "noise_sigma", "scenario", lo=0.0, default=0.02)
    dur = _num(data, "duration_s", "scenario", lo=0.0, lo_open=True)
    evs = data.get("events", []) or []
    if not isinstance(evs, list):
        raise ScenarioError("events must be a list")
    parsed = sorted(((_event(e, f"events[{i}]"), i) for i, e in enumerate(evs)), key=lambda x: (x[0].at_s, x[1]))
    recoveries = [e.at_s for e, _ in parsed if e.kind == "recovery"]
    resolved = []
    for e, _ in parsed:
        end = math.inf
        if e.duration_s is not None:
            end = e.at_s + e.duration_s
        if not e.benign and e.kind != "recovery":
            later = [r for r in recoveries if r > e.at_s]
            if later:
                end = min(end, later[0])
        resolved.append(Event(**{**e.__dict__, "end_s": end}))
    return Scenario(name=name, events=tuple(resolved), noise_sigma=float(sigma), duration_s=dur,
                    description=str(data.get("description", "")))


def load_yaml(path: str | Path) -> Scenario:
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    try:
        return from_dict(data)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def preset_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))


def preset(name: str) -> Scenario:
    path = SCENARIO_DIR / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(f"unknown scenario preset {name!r}; known: {', '.join(preset_names())}")
    return load_yaml(path)


def load(spec: str | Path) -> Scenario:
    s = str(spec)
    if s.endswith((".yaml", ".yml")) or "/" in s:
        return load_yaml(s)
    return preset(s)
