"""The evaluation suite: workloads x scenarios x policies, the per-scenario table and the summary line.

Detections come from the scenario's ground truth (:meth:`~dynamiccl.harness.retuner_eval.truth.Truth.changes`): the onset
rounded down to the 1 s window, detected ``delay_s`` (default 1 s, what the demo's CUSUM watch measures) after
the onset, rounded up to the end of a window. Convergence ("collectives to within 5 % of the oracle") is
counted per detection and per heavy affected op (≥ 1 % of the collective time) on one of its communicators:
the collectives issued from the detection until the first step from which the configuration in force stays
within 5 % of the regime's oracle (expected times, noise-free) until the regime ends; ``inf`` if it never does.

``reactive`` (a reference, not a score) is the oracle's configuration of each regime switched in at the moment
the detection arrives, nothing paid to find it: :attr:`ScenarioResult.reactive_bound` is the share of the
oracle's gain it captures, i.e. what the detection delay alone leaves for any retuner driven by detections alone.
It is not a bound for ours: the retuner also recognises a regime it has seen before (and the baseline) from its own
measurements, before the detector reports it (``PolicyConfig.recognize``), so on recurring and bursty regimes and
on recoveries it can capture more than ``reactive``.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.harness.retuner_eval.runner import RunResult, run
from dynamiccl.harness.retuner_eval.truth import Op, Truth

__all__ = ["WORKLOADS", "SCENARIOS", "QUICK", "ScenarioResult", "evaluate_one", "summarize", "summary_line"]

ROOT = Path(__file__).resolve().parents[2]
_WL = ROOT / "retuner" / "workloads"
_SC = ROOT / "harness" / "simulator" / "scenarios" / "retune"

WORKLOADS = ("llama7b-tp8-dp2", str(_WL / "ddp-roce-5x8.yaml"), str(_WL / "ddp-efa-2x8.yaml"))
SCENARIOS = tuple(str(_SC / f"{n}.yaml") for n in
                  ("stationary", "bw-drop", "bw-drop-node", "latency", "incast", "recurring"))
QUICK = tuple(str(_SC / f"{n}.yaml") for n in ("quick-stationary", "quick"))
GAIN_FLOOR = 0.01       # an oracle gain below 1 % of the default's collective time is "nothing to capture"


@dataclass
class Convergence:
    rc_id: str
    kind: str
    recurrence: bool
    op: str
    collectives: float          # inf = never within 5 % before the regime ended
    oracle_gain: float          # default / oracle time in this regime for this op


@dataclass
class ScenarioResult:
    workload: str
    scenario: str
    stationary: bool
    runs: dict[str, RunResult]
    convergence: list[Convergence] = field(default_factory=list)

    def coll(self, p: str) -> float:
        """Collective time of policy ``p`` over the whole run: its mean duration per (regime segment, op) times
        the number of those collectives in the default run."""
        d = self.runs["default"].seg
        x = self.runs[p].seg
        tot = 0.0
        for k, (s_d, n_d) in d.items():
            s_x, n_x = x.get(k, (s_d, n_d))
            tot += n_d * (s_x / n_x if n_x else s_d / n_d)
        return tot

    @property
    def oracle_gain(self) -> float:
        return (self.coll("default") - self.coll("oracle")) / self.coll("default")

    @property
    def captured(self) -> float | None:
        d, o, u = self.coll("default"), self.coll("oracle"), self.coll("ours")
        if (d - o) / d < GAIN_FLOOR:
            return None
        return (d - u) / (d - o)

    @property
    def reactive_bound(self) -> float | None:
        """The share of the oracle's gain the ``reactive`` reference captures (the oracle's config of each regime
        from its detection on, nothing paid to find it): what no retuner driven by these detections alone can beat
        (up to noise). A reference, not a score; a retuner that recognises known regimes from its measurements
        before the detection can exceed it."""
        if "reactive" not in self.runs:
            return None
        d, o, u = self.coll("default"), self.coll("oracle"), self.coll("reactive")
        if (d - o) / d < GAIN_FLOOR:
            return None
        return (d - u) / (d - o)

    @property
    def slowdown(self) -> float:
        return self.coll("ours") / self.coll("default") - 1.0

    @property
    def beats_tune_once(self) -> bool:
        return self.coll("ours") < self.coll("tune_once")

    @property
    def tune_once_gap(self) -> float:
        """How far tune-once is from the oracle (share of the default's collective time): < 1 % means the
        regime change does not change the best configuration, so nothing can beat tune-once there."""
        return (self.coll("tune_once") - self.coll("oracle")) / self.coll("default")


def _load(workload: str, scenario: str):
    from dynamiccl.harness.simulator.scenario import load_yaml
    from dynamiccl.harness.simulator.workload import load as load_workload
    return load_workload(workload), load_yaml(scenario)


def evaluate_one(workload: str, scenario: str, *, seed: int = 0, delay_s: float = 1.0,
                 retuner_cfg: RetunerConfig | None = None, tuner_mode: str = "per-rank",
                 delivery_faults: float = 0.2, fault_stream: str = "push") -> ScenarioResult:
    w, sc = _load(workload, scenario)
    truth = Truth(w, sc, sc.duration_s or 60.0)
    runs: dict[str, RunResult] = {}
    runs["default"] = run(w, sc, "default", truth=truth, seed=seed)
    n = runs["default"].steps
    for p in ("tune_once", "oracle"):
        runs[p] = run(w, sc, p, truth=truth, seed=seed, steps=n)
    runs["reactive"] = run(w, sc, "reactive", truth=truth, seed=seed, steps=n, delay_s=delay_s)
    runs["ours"] = run(w, sc, "ours", truth=truth, seed=seed, steps=n, delay_s=delay_s, retuner_cfg=retuner_cfg,
                       record_ops=True, tuner_mode=tuner_mode, delivery_faults=delivery_faults,
                       fault_stream=fault_stream)
    res = ScenarioResult(w.name, sc.name, not any(not e.benign for e in sc.events), runs)
    res.convergence = convergence(truth, runs["ours"], delay_s=delay_s)
    return res


def convergence(truth: Truth, ours: RunResult, *, delay_s: float) -> list[Convergence]:
    rcs = truth.changes(delay_s=delay_s)
    segs = truth.segments()
    per_step = truth.calls_per_step()
    base = truth.baseline_state()
    heavy_w = {op.key: per_step[op.key] * truth.time_us(op, truth.default_cfg(op), base) for op in truth.ops}
    tot = sum(heavy_w.values())
    heavy = [op for op in truth.ops if heavy_w[op.key] / tot >= 0.01]
    by_id = {rc.id: rc for rc in rcs}
    seen_states: set = set()
    out: list[Convergence] = []
    steps = ours.step_ops
    t_steps = np.array([s.t_start for s in steps])
    last = steps[-1].t_start if steps else -math.inf
    for rc in rcs:
        if rc.detected_s >= last:          # the run ended (fixed step count) before this detection
            continue
        onset = next((s for s in segs if s[0] >= rc.start_s - 1e-9), None)
        if onset is None:
            continue
        seg_start, seg_end, state = onset
        skey = truth.state_key(state)
        recurrence = skey in seen_states
        seen_states.add(skey)
        comms_hex = rc.comms if rc.kind != "recovery" else by_id.get(rc.recovers, rc).comms
        comms = {int(c, 16) for c in comms_hex}
        groups: dict[tuple[str, int], Op] = {}
        for op in heavy:
            if op.comm.comm_hash in comms:
                groups.setdefault((op.func, op.nbytes), op)
        for (func, nbytes), op in groups.items():
            best_cfg, best_t = truth.best(op, state)
            d_t = truth.time_us(op, truth.default_cfg(op), state)
            i0 = int(np.searchsorted(t_steps, rc.detected_s, side="right")) - 1
            i0 = max(i0, 0)
            i1 = int(np.searchsorted(t_steps, seg_end, side="left"))
            ok = []
            for i in range(i0, i1):
                cfg = steps[i].cfg.get(op.key)
                ok.append(cfg is not None and truth.time_us(op, cfg, state) <= 1.05 * best_t)
            settle = None
            for j in range(len(ok)):
                if all(ok[j:]):
                    settle = i0 + j
                    break
            t_settle = steps[settle].t_start if settle is not None else None
            count = 0
            for i in range(i0, i1 if settle is None else settle):
                st = steps[i].starts.get(op.key)
                if st is not None:
                    count += int(np.sum(st >= rc.detected_s))
            out.append(Convergence(rc.id, rc.kind, recurrence, f"{op.comm.name}/{func}/{nbytes}",
                                   float(count) if t_settle is not None else math.inf, d_t / best_t))
    return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def summarize(results: list[ScenarioResult]) -> dict:
    reg = [r for r in results if not r.stationary]
    caps = [r.captured for r in reg if r.captured is not None]
    bounds = [r.reactive_bound for r in reg if r.captured is not None and r.reactive_bound is not None]
    self_ign = [sum(1 for a in r.runs["ours"].audit if a.get("self_induced")) for r in results]
    recog = [a for r in results for a in r.runs["ours"].audit      # switches made before any detector report
             if a.get("recognized") is True and a.get("action") in ("revert", "reuse")]
    matters = [r for r in reg if r.tune_once_gap >= GAIN_FLOOR]
    first = [c.collectives for r in results for c in r.convergence if c.kind != "recovery" and not c.recurrence]
    rec = [c.collectives for r in results for c in r.convergence if c.kind != "recovery" and c.recurrence]
    recov = [c.collectives for r in results for c in r.convergence if c.kind == "recovery"]
    stat = [r.slowdown for r in results if r.stationary]
    return {
        "oracle_gain_captured_min": min(caps) if caps else math.nan,
        "oracle_gain_captured_mean": float(np.mean(caps)) if caps else math.nan,
        "reactive_bound_min": min(bounds) if bounds else math.nan,
        "self_induced_ignored": sum(self_ign),
        "recognized": len(recog), "recognized_reverts": sum(a["action"] == "revert" for a in recog),
        "recognized_reuses": sum(a["action"] == "reuse" for a in recog),
        "unrecognized": sum(1 for r in results for a in r.runs["ours"].audit if a.get("action") == "unrecognize"),
        "worst_stationary_slowdown": max(stat) if stat else math.nan,
        "beats_tune_once": sum(r.beats_tune_once for r in matters), "regime_scenarios": len(matters),
        "beats_tune_once_all": sum(r.beats_tune_once for r in reg), "regime_scenarios_all": len(reg),
        "no_gain_worst_slowdown": max([r.slowdown for r in reg if r.captured is None], default=math.nan),
        "collectives_to_5pct_median": _median(first),
        "recurrence_collectives_median": _median(rec),
        "recovery_collectives_median": _median(recov),
        "n_detections": len(first), "n_recurrences": len(rec),
    }


def summary_line(s: dict, mismatches: str) -> str:
    def f(x: float, nd: int = 3) -> str:
        return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else (
            "inf" if math.isinf(x) else f"{x:.{nd}f}")
    return (f"oracle_gain_captured={f(s['oracle_gain_captured_min'])} "
            f"worst_stationary_slowdown={f(s['worst_stationary_slowdown'], 4)} "
            f"beats_tune_once={s['beats_tune_once']}/{s['regime_scenarios']} mismatches={mismatches} "
            f"collectives_to_5pct_median={f(s['collectives_to_5pct_median'], 0)}")
