"""The detector suite: simulated jobs with injected regime changes and stationary runs, generated (seeded).

Built by :func:`build_suite`; run and scored by :mod:`dynamiccl.harness.detector_eval`."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("dynamiccl.harness.detector_suite")

MAGNITUDES = (1.05, 1.1, 1.25, 1.5, 2.0, 4.0)
EVENT_KINDS = ("bw_drop", "latency", "straggler", "flap", "incast", "degrading_nic")
EXPECTED_KIND = {"bw_drop": {"bandwidth"}, "latency": {"latency"}, "straggler": {"straggler"},
                 "flap": {"flapping"}, "incast": {"bandwidth", "flapping"},
                 "degrading_nic": {"bandwidth"}}
BURSTY = ("flap", "incast")
WORKLOADS = ("llama7b-tp8-dp2", "eval-mixed", "llama70b-fsdp")
DETECT_WITHIN_S = 5.0
GAP_S = 60.0
WARM_S = 70.0

EVAL_MIXED = {
    "name": "eval-mixed", "topology": "h100-2x8", "dtype": "ncclBfloat16", "step_gap_us": 20000,
    "arrival_jitter_us": 3.0,
    "description": "Evaluation workload: TP/DP/world collectives over six size buckets (64 KiB-64 MiB).",
    "groups": [{"name": "tp", "layout": "block", "size": 8}, {"name": "dp", "layout": "stride", "size": 2},
               {"name": "world", "layout": "world"}],
    "schedule": [
        {"repeat": 16, "ops": [{"group": "tp", "func": "AllReduce", "bytes": 67108864, "compute_us": 2000},
                               {"group": "tp", "func": "AllReduce", "bytes": 2097152, "compute_us": 500},
                               {"group": "dp", "func": "AllReduce", "bytes": 26214400},
                               {"group": "dp", "func": "AllReduce", "bytes": 1048576, "compute_us": 200}]},
        {"repeat": 4, "ops": [{"group": "world", "func": "AllGather", "bytes": 262144, "compute_us": 300},
                              {"group": "world", "func": "ReduceScatter", "bytes": 4194304, "compute_us": 300},
                              {"group": "dp", "func": "AllReduce", "bytes": 65536, "compute_us": 100}]},
        {"ops": [{"group": "world", "func": "AllReduce", "bytes": 8, "compute_us": 200},
                 {"group": "world", "func": "AllReduce", "bytes": 8, "compute_us": 50}]},
    ],
}


def realism(**over):
    from dynamiccl.harness.simfeed import Realism
    base = dict(tail_prob=0.01, tail_scale=1.0, hiccup_rate_per_s=1 / 120, hiccup_s=0.2, hiccup_factor=1.5,
                bg_sigma=0.005, bg_rho=0.5)
    base.update(over)
    return Realism(**base)


def load_workload(name: str):
    from dynamiccl.harness.simulator import workload as W
    if name == "eval-mixed":
        return W.from_dict(EVAL_MIXED)
    return W.preset(name)


# ------------------------------------------------------------------------------------------------
# magnitude calibration through the simulator's performance model
# ------------------------------------------------------------------------------------------------
class _Calibrator:
    """Slowdown of the dominant affected collective for an event parameter (noise-free)."""

    def __init__(self, workload):
        from dynamiccl.harness.simulator.engine import Engine
        self.w = workload
        self.eng = Engine(workload, seed=0)       # uses the engine's own model and caches
        eng = self.eng
        self.sizes = [nb for (_, _, nb) in eng._uniq]
        self.dec = [[eng._decide(c, func, self.sizes[u]) for c in eng._groups[g].comms]
                    for u, (g, func, _) in enumerate(eng._uniq)]
        counts = np.bincount(eng._slot_u, minlength=len(eng._uniq)).astype(float)
        self.counts = counts
        from dynamiccl.harness.simulator.perf_model import NetworkState
        self.base = eng._durations(NetworkState(noise_sigma=0.0), self.sizes, self.dec)
        self._ns = NetworkState

    def ratio(self, kind: str, param: float, nodes=None, rank: int | None = None) -> float:
        eng, NS = self.eng, self._ns
        nn = self.w.topology.n_nodes
        if kind == "straggler":
            best, best_w = 1.0, -1.0
            for u, (g, func, _) in enumerate(eng._uniq):
                for cpos, c in enumerate(eng._groups[g].comms):
                    if rank in c.ranks:
                        T = self.base[u, cpos]
                        weight = T * self.counts[u]
                        if weight > best_w:
                            best, best_w = (T + param) / T, weight
            return best

        def per_node(v, neutral):
            a = np.full(nn, neutral, dtype=float)
            a[list(nodes) if nodes is not None else slice(None)] = v
            return tuple(a)
        if kind in ("bw_drop", "flap", "degrading_nic"):
            st = NS(link_bw_factor=per_node(1.0 - param, 1.0), noise_sigma=0.0)
        elif kind == "latency":
            st = NS(added_latency_us=per_node(param, 0.0), noise_sigma=0.0)
        elif kind == "incast":
            st = NS(competing_share=per_node(param, 0.0), noise_sigma=0.0)
        else:
            raise ValueError(kind)
        T = eng._durations(st, self.sizes, self.dec)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(self.base > 0, T / np.where(self.base > 0, self.base, 1.0), 1.0)
        weight = np.where(r > 1.001, self.base * self.counts[:, None], -1.0)
        j = np.unravel_index(int(np.argmax(weight)), weight.shape)
        return float(r[j]) if weight[j] > 0 else 1.0

    def solve(self, kind: str, target: float, nodes=None, rank=None) -> float | None:
        """Event parameter giving ``target`` slowdown, or None if out of the kind's range."""
        if kind in ("bw_drop", "flap", "degrading_nic", "incast"):
            lo, hi = 0.0, 0.995
        else:  # latency / straggler: µs
            lo, hi = 0.0, 1.0
            while self.ratio(kind, hi, nodes, rank) < target and hi < 1e7:
                hi *= 2.0
        if self.ratio(kind, hi, nodes, rank) < target:
            return None
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            if self.ratio(kind, mid, nodes, rank) < target:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)


# ------------------------------------------------------------------------------------------------
# suite
# ------------------------------------------------------------------------------------------------
@dataclass
class RunSpec:
    name: str
    workload: str
    seed: int
    duration_s: float
    events: list[dict]
    meta: list[dict] = field(default_factory=list)   # per event: kind, target, truth index
    stationary: bool = False
    realism: dict = field(default_factory=dict)


def build_suite(seeds: int, *, quick: bool = False, stationary_hours: dict | None = None,
                workloads: tuple[str, ...] | None = None, kinds: tuple[str, ...] | None = None,
                magnitudes: tuple[float, ...] | None = None) -> list[RunSpec]:
    """The suite. ``workloads`` / ``kinds`` / ``magnitudes`` select a subset for iteration: the
    same runs as the full suite (same seeds, event order and benign changes), keeping only the
    event runs holding a selected event; scoring then counts only selected events (`score`)."""
    _check_selection(workloads, kinds, magnitudes)
    runs: list[RunSpec] = []
    for w in ("llama7b-tp8-dp2",) if quick else WORKLOADS:
        if not workloads or w in workloads:
            runs += _event_runs(w, seeds, quick, kinds, magnitudes)
    hours = stationary_hours or ({"llama70b-fsdp": 0.15} if quick else
                                 {"llama70b-fsdp": 24.0, "llama7b-tp8-dp2": 2.0, "eval-mixed": 2.0})
    if stationary_hours is not None and sum(stationary_hours.values()) <= 0:
        return runs                                           # event runs only (no bad-input run)
    for w, h in hours.items():
        if h > 0 and (not workloads or w in workloads):
            runs += _stationary_runs(w, h)
    runs.append(_bad_input_run(quick))
    return runs


def _check_selection(workloads, kinds, magnitudes) -> None:
    for name, sel, allowed in (("workload", workloads, WORKLOADS), ("kind", kinds, EVENT_KINDS)):
        bad = sorted(set(sel or ()) - set(allowed))
        if bad:
            raise ValueError(f"unknown {name} {bad}; expected some of {list(allowed)}")
    bad = sorted(set(magnitudes or ()) - set(MAGNITUDES))
    if bad:
        raise ValueError(f"unknown magnitude {bad}; expected some of {list(MAGNITUDES)}")


def _event_runs(w: str, seeds: int, quick: bool, kinds, magnitudes) -> list[RunSpec]:
    """Per seed, every (kind, magnitude) pair in a seeded order, six events per run, each followed by
    a benign change in its gap; a run is kept if it holds a selected event."""
    wl = load_workload(w)
    cal = _Calibrator(wl)
    runs = []
    for seed in range(seeds):
        rng = np.random.default_rng([seed, 17, len(w)])
        pairs = [(k, m) for k in EVENT_KINDS for m in MAGNITUDES]
        if quick:
            pairs = [("bw_drop", 2.0), ("latency", 1.5), ("straggler", 1.25), ("flap", 2.0),
                     ("bw_drop", 1.1)]
        rng.shuffle(pairs)
        per_run = 6
        for r0 in range(0, len(pairs), per_run):
            events, meta = [], []
            t = WARM_S
            for kind, target in pairs[r0:r0 + per_run]:
                placed = _place_event(w, wl, cal, rng, kind, target, t)
                if placed is not None:
                    events += placed
                    meta.append({"kind": kind, "target": target, "rank": placed[0].get("ranks", [None])[0],
                                 "nodes": placed[0].get("nodes")})
                t += GAP_S
            if not meta:
                continue
            for m in meta:
                m["selected"] = (not kinds or m["kind"] in kinds) and (not magnitudes or m["target"] in magnitudes)
            if any(m["selected"] for m in meta):
                runs.append(RunSpec(f"{w}-s{seed}-r{r0 // per_run}", w, seed, t + 10.0, events, meta))
    return runs


def _place_event(w, wl, cal, rng, kind: str, target: float, t: float) -> list[dict] | None:
    """The event of ``kind`` at ``target`` x starting within a second of ``t`` (its parameter solved
    for that magnitude; None when out of the model's range) and the benign change after it."""
    nn, nr = wl.topology.n_nodes, wl.topology.n_ranks
    at = round(t + float(rng.uniform(0.0, 1.0)), 3)
    nodes = None
    rank = None
    if kind == "straggler":
        rank = int(rng.integers(0, nr))
    elif nn > 2 or rng.random() < 0.5:
        nodes = [int(rng.integers(0, nn))]
    param = cal.solve(kind, target, nodes, rank)
    if param is None:
        log.info("%s: %s %.2fx is out of the model's range; skipped", w, kind, target)
        return None
    ev: dict = {"at_s": at, "kind": kind, "magnitude": round(param, 6)}
    if kind == "straggler":
        ev["ranks"] = [rank]
    elif nodes is not None:
        ev["nodes"] = nodes
    if kind in BURSTY:
        ev.update(period_s=float(rng.choice([6.0, 8.0])) if kind == "flap" else 2.0, duty=0.5,
                  duration_s=30.0)
    elif kind == "degrading_nic":
        ev.update(ramp_s=4.0, duration_s=25.0)
    else:
        ev["duration_s"] = 25.0
    bt = at + 35.0 + float(rng.uniform(0, 10))        # a benign change in the gap
    if rng.random() < 0.5:
        benign = {"at_s": round(bt, 3), "kind": "pause", "duration_s": float(rng.uniform(3, 10))}
    else:
        g = wl.groups[int(rng.integers(0, len(wl.groups)))].name
        benign = {"at_s": round(bt, 3), "kind": "mix", "groups": [g],
                  "magnitude": float(rng.choice([0.7, 1.3, 2.0])), "duration_s": 12.0}
    return [ev, benign]


def _stationary_runs(w: str, h: float) -> list[RunSpec]:
    """``h`` hours of stationary training in runs of at most 6 h: pauses and workload-mix changes only."""
    dur = h * 3600.0
    chunk = min(dur, 6 * 3600.0)
    runs = []
    for i in range(max(1, int(math.ceil(dur / chunk)))):
        rng = np.random.default_rng([i, 99, len(w)])
        wl = load_workload(w)
        events, t = [], 300.0
        while t < chunk - 60:
            if rng.random() < 0.5:
                events.append({"at_s": round(t, 3), "kind": "pause", "duration_s": float(rng.uniform(3, 30))})
            else:
                g = wl.groups[int(rng.integers(0, len(wl.groups)))].name
                events.append({"at_s": round(t, 3), "kind": "mix", "groups": [g],
                               "magnitude": float(rng.choice([0.5, 0.8, 1.25, 2.0])),
                               "duration_s": float(rng.uniform(60, 1800))})
            t += float(rng.uniform(600, 3600))
        runs.append(RunSpec(f"stationary-{w}-{i}", w, 1000 + i, chunk, events, [], stationary=True))
    return runs


def _bad_input_run(quick: bool) -> RunSpec:
    """A stationary run with a clock jump, a rank that vanishes and garbage records."""
    return RunSpec("stationary-bad-input", "llama7b-tp8-dp2", 7, 200.0 if quick else 900.0,
                   [{"at_s": 150.0, "kind": "pause", "duration_s": 5.0}], [], stationary=True,
                   realism={"clock_jump_at_s": 100.0, "clock_jump_s": 30.0, "clock_jump_node": 1,
                            "vanish_at_s": 170.0, "vanish_rank": 3, "garbage_prob": 0.001})


# ------------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------------
