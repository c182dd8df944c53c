"""One evaluation run: a workload under a scenario, with one tuning policy, in the simulator's fast mode.

Policies: ``default`` (no tuner: NCCL's choice), ``tune_once`` (the oracle's configuration for the baseline
network, from the first step to the last: an idealised AutoCCL-style tuner that never retunes and paid nothing
to find its config), ``oracle`` (the best static configuration of each regime, switched at the first step
boundary of every regime with perfect knowledge), ``reactive`` (the oracle's configuration of each regime from
the moment a detector with the evaluation's detection delay reports it: the bound for any retuner that only
reacts to detections -- a reference, not part of the scoring; ours can beat it where it recognises a known regime or
the baseline from its own measurements before the report) and ``ours`` (the :class:`~dynamiccl.retuner.agent.Retuner`, fed the
measured per-step durations and the regime changes from :meth:`Truth.changes`, writing the tuner config file that
a :func:`~dynamiccl.harness.retuner_eval.sim_tuner.make_file_tuner` tuner reloads at every step boundary).

Every run executes the same number of training steps (the number NCCL's default needs to cover the scenario)
with the same seed, so noise and arrival jitter are common random numbers. Per regime segment and op the run
records the summed duration and count of its collective instances (per instance: last rank's end − last rank's
start); :mod:`.suite` weighs every policy's mean per (segment, op) by the default run's counts, so a policy that
shifts its steps in time does not dodge or catch more of a regime.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from dynamiccl.collector.wire_format import ALGOS as WIRE_ALGOS
from dynamiccl.collector.wire_format import FUNCS as WIRE_FUNCS
from dynamiccl.collector.wire_format import PROTOS as WIRE_PROTOS
from dynamiccl.harness.simulator.cost_model import ALGOS, PROTOS
from dynamiccl.harness.simulator.engine import Engine
from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.harness.retuner_eval.sim_tuner import RuleTuner, make_file_tuner, make_rank_tuners
from dynamiccl.harness.retuner_eval.truth import Truth
from dynamiccl.retuner.types import Observation, Target

__all__ = ["RunResult", "run", "POLICIES"]

POLICIES = ("default", "tune_once", "oracle", "reactive", "ours")
_P2P = np.array([WIRE_FUNCS.index("Send"), WIRE_FUNCS.index("Recv")])
_FULL = {WIRE_FUNCS.index("AllGather"), WIRE_FUNCS.index("ReduceScatter")}


@dataclass
class StepOps:
    """Per step and op key: what ran and when (for convergence measurement)."""
    t_start: float
    cfg: dict[tuple[int, str, int], tuple[int, int, int]]     # op key -> (algo, proto, channels) as run
    starts: dict[tuple[int, str, int], np.ndarray]            # op key -> instance start times (s)


@dataclass
class RunResult:
    policy: str
    steps: int
    sim_s: float
    coll_s: float                      # total collective time (sum over instances), seconds
    wall_s: float
    retuner_s: float = 0.0             # CPU time inside the retuner
    step_ops: list[StepOps] = field(default_factory=list)
    audit: list[dict] = field(default_factory=list)
    tuner_kind: str = ""
    pushes: int = 0
    excess_s: float = 0.0
    seg: dict = field(default_factory=dict)   # (regime segment index, op key) -> [sum of durations s, count]
    mismatches: int | None = None      # per-rank runs: collectives on which ranks' plugins disagreed
    decisions: int = 0
    switches: int = 0                  # applied-version changes (all ranks at once)
    faults: dict = field(default_factory=dict)


def _names(codes: np.ndarray, table) -> list[str]:
    return [table[int(c)] if 0 <= int(c) < len(table) else "UNKNOWN" for c in codes]


def _instances(b, epoch_ns: int, dtype_size: int, comms) -> dict:
    """Per collective instance of one step: comm, func, nbytes, algo/proto/channels, start/end, mean duration."""
    ops = b.ops
    keep = ~np.isin(ops["func"], _P2P)
    if not keep.any():
        return {}
    o = ops[keep]
    comm = b.comm[keep].astype(np.int64)
    st = (o["gpu_start_ns"].astype(np.int64) - epoch_ns) / 1e9
    en = (o["gpu_end_ns"].astype(np.int64) - epoch_ns) / 1e9
    key = (comm << 44) | (o["func"].astype(np.int64) << 40) | o["seq_number"].astype(np.int64)
    order = np.argsort(key, kind="stable")
    ks = key[order]
    lo = np.r_[0, np.flatnonzero(np.diff(ks)) + 1]
    cnt = np.diff(np.r_[lo, len(ks)])
    first = order[lo]
    return {
        "comm": comm[first], "func": o["func"][first], "count": o["count"][first].astype(np.int64),
        "algo": o["algo"][first], "proto": o["proto"][first], "nch": o["n_channels"][first],
        "start": np.maximum.reduceat(st[order], lo), "end": np.maximum.reduceat(en[order], lo),
        "mean": np.add.reduceat((en - st)[order], lo) / cnt,
    }


def run(workload, scenario, policy: str, *, truth: Truth, steps: int | None = None, seed: int = 0,
        duration_s: float | None = None, retuner_cfg: RetunerConfig | None = None, delay_s: float = 1.0,
        record_ops: bool = False, workdir: str | None = None, tuner_mode: str = "per-rank",
        delivery_faults: float = 0.2, fault_stream: str = "push") -> RunResult:
    """``tuner_mode`` (policy ``ours``): ``per-rank`` = every rank its own real plugin + lossy delivery +
    agreement hook (mismatches counted), ``plugin`` = one real plugin instance, ``python`` = the Python
    reference; an unavailable plugin falls back to ``python`` (``RunResult.tuner_kind`` says what ran)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    dur = duration_s if duration_s is not None else (scenario.duration_s or 60.0)
    tuner, rt, rcs = None, None, []
    if policy == "tune_once":
        tuner = RuleTuner(truth.rules_for(truth.baseline_state(), 1))
    elif policy in ("oracle", "reactive"):
        tuner = RuleTuner(None)
    elif policy == "ours":
        tuner, rt = _ours(workload, scenario, seed, retuner_cfg, workdir, tuner_mode, delivery_faults, fault_stream)
        rcs = truth.changes(delay_s=delay_s)
    eng = Engine(workload, scenario, seed=seed, tuner=tuner, duration_s=dur)
    chooser = _Chooser(policy, tuner, truth, scenario, workload, delay_s)
    feed = _RetunerFeed(rt, rcs, workload.comms) if rt is not None else None
    comms, dsz = workload.comms, workload.dtype_size
    coll = 0.0
    n = 0
    step_ops: list[StepOps] = []
    seg_starts = np.array([a for a, _, _ in truth.segments()])
    seg: dict = {}
    wall0 = time.perf_counter()
    while (steps is None and not eng.done) or (steps is not None and n < steps):
        version = chooser.before_step(eng.now_s)
        b = eng.step()
        if getattr(tuner, "delivery", None) is not None:      # per-rank: the agreement ran at the step start
            version = tuner.delivery.applied
        n += 1
        inst = _instances(b, eng.epoch_ns, dsz, comms)
        if not inst:
            continue
        coll += float(np.sum(inst["end"] - inst["start"]))
        grp = _group(inst, comms, dsz)
        _by_segment(seg, grp, seg_starts)
        if record_ops:
            step_ops.append(StepOps(b.t_start_s, {k: v[0] for k, v in grp.items()},
                                    {k: v[1] for k, v in grp.items()}))
        if feed is not None:
            feed.step(b, grp, version)
    res = RunResult(policy, n, eng.now_s, coll, time.perf_counter() - wall0, feed.cpu_s if feed else 0.0, step_ops,
                    seg=seg)
    if rt is not None:
        _close_ours(res, rt, tuner)
    return res


def _ours(workload, scenario, seed, retuner_cfg, workdir, tuner_mode, delivery_faults, fault_stream):
    """The retuner writing a tuner file, and the tuner(s) the simulated job reads it with."""
    wd = workdir or tempfile.mkdtemp(prefix="dccl-retune-")
    path = os.path.join(wd, "tuner.conf")
    if os.path.exists(path):
        os.unlink(path)
    # in process the job receives a push at the event time it is written (no window/lateness lag)
    cfg = (retuner_cfg or RetunerConfig()).replace(policy={"republish_after_s": 0.0})
    cfg = cfg.replace(dry_run=False, tuner_config_path=path, audit_path=None,
                      topology=retuner_cfg.topology if retuner_cfg and retuner_cfg.topology
                      else workload.topology.name)
    rt = Retuner(cfg, clock=lambda: 0.0)
    tuner = None
    if tuner_mode == "per-rank":
        try:
            import zlib
            dseed = seed * 1_000_003 + zlib.crc32(f"{workload.name}/{scenario.name}".encode())
            tuner = make_rank_tuners(workload.topology.n_ranks, path, wd, seed=dseed, p_fault=delivery_faults,
                                     fault_stream=fault_stream)
        except Exception as e:
            import logging
            logging.getLogger(__name__).warning("per-rank plugins unavailable (%s); one plugin instance", e)
    if tuner is None:
        tuner = make_file_tuner(path, prefer_plugin=tuner_mode != "python")
    return tuner, rt


class _Chooser:
    """The configuration a policy sets before each step: the oracle's for the current regime
    (``oracle``), for the regime a detector with ``delay_s`` has reported (``reactive``: the
    detection times of Truth.changes, 1 s windows; the best any retuner reacting to detections can
    do), or whatever the tuner file holds now (``ours``). Returns the config version in force."""

    def __init__(self, policy, tuner, truth: Truth, scenario, workload, delay_s: float):
        self.policy, self.tuner, self.truth = policy, tuner, truth
        self.scenario, self.topology = scenario, workload.topology
        self.react = [(0.0 if t0 <= 0 else math.ceil(t0 + delay_s - 1e-9), st) for t0, _t1, st in truth.segments()]
        self.state = None

    def before_step(self, now_s: float) -> int:
        if self.policy == "oracle":
            self._set(self.scenario.state_at(now_s, self.topology))
        elif self.policy == "reactive":
            self._set(next((s_ for det, s_ in reversed(self.react) if det <= now_s + 1e-9), self.react[0][1]))
        elif self.tuner is not None and hasattr(self.tuner, "refresh"):
            return self.tuner.refresh()
        return 0

    def _set(self, st) -> None:
        k = self.truth.state_key(st)
        if k != self.state:
            self.tuner.set(self.truth.rules_for(st, (self.tuner.version or 0) + 1))
            self.state = k


def _by_segment(seg: dict, grp: dict, seg_starts: np.ndarray) -> None:
    """Each instance's duration to the regime segment it started in: (segment, op key) -> [sum, count]."""
    for k, v in grp.items():
        si = np.searchsorted(seg_starts, v[1], side="right") - 1
        for j in np.unique(si):
            m = si == j
            acc = seg.setdefault((int(j), k), [0.0, 0])
            acc[0] += float(np.sum(v[4][m]))
            acc[1] += int(m.sum())


class _RetunerFeed:
    """What the retuner sees of each step: one observation per op (mean and variance of its instances'
    durations, the configuration it ran with), and the true changes as a detector with a delay reports
    them. Its CPU time is counted (``cpu_s``)."""

    def __init__(self, rt, rcs: list, comms):
        self.rt, self.rcs, self.comms = rt, rcs, comms
        self.rc_i = 0
        self.cpu_s = 0.0
        self.targets: dict[tuple[int, int, int], Target] = {}

    def step(self, b, grp: dict, version: int) -> None:
        t0 = time.process_time()
        obs = []
        for (h, func, nbytes), (cfg, starts, means, ci, _d) in grp.items():
            m = float(means.mean())
            var = float(means.var(ddof=1)) if len(means) > 1 else (0.01 * m) ** 2
            obs.append(Observation(self._target(h, func, nbytes, ci), b.t_start_s, b.t_end_s, len(means), m, var,
                                   ALGOS[cfg[0]], PROTOS[cfg[1]], int(cfg[2]), version=version))
        self.rt.observe(obs)
        while self.rc_i < len(self.rcs) and self.rcs[self.rc_i].detected_s <= b.t_end_s:
            self.rt.on_change(self.rcs[self.rc_i])
            self.rc_i += 1
        self.cpu_s += time.process_time() - t0

    def _target(self, h, func: str, nbytes: int, ci: int) -> Target:
        c = self.comms[ci]
        per_rank = nbytes // c.n_ranks if func in ("AllGather", "ReduceScatter") else nbytes
        tk = (ci, WIRE_FUNCS.index(func), per_rank)
        tg = self.targets.get(tk)
        if tg is None:
            tg = self.targets[tk] = Target(h, func, max(0, int(per_rank).bit_length() - 1), c.n_ranks,
                                           c.n_nodes, c.name)
        return tg


def _close_ours(res: RunResult, rt, tuner) -> None:
    res.audit = list(rt.audit.recent)
    res.tuner_kind = getattr(tuner, "kind", type(tuner).__name__)
    res.pushes = int(rt.metrics.counters["pushes"])
    res.excess_s = float(rt.metrics.counters["excess_s"])
    rt.close()
    if hasattr(tuner, "mismatches"):
        res.mismatches = int(tuner.mismatches)
        res.decisions = int(tuner.decisions)
        res.switches = tuner.delivery.switches
        res.faults = dict(tuner.delivery.faults)
    if hasattr(tuner, "close"):
        tuner.close()


def _group(inst: dict, comms, dsz: int) -> dict:
    """op key (comm hash, func, nbytes) -> ((algo, proto, channels), instance starts, instance mean durations,
    comm idx, instance durations (last end − last start))."""
    out = {}
    func = inst["func"]
    comm = inst["comm"]
    cnt = inst["count"]
    key = (comm << 40) | (func.astype(np.int64) << 36) | cnt
    order = np.argsort(key, kind="stable")
    ks = key[order]
    lo = np.r_[0, np.flatnonzero(np.diff(ks)) + 1]
    hi = np.r_[lo[1:], len(ks)]
    for a, b_ in zip(lo, hi):
        idx = order[a:b_]
        i0 = idx[0]
        ci = int(comm[i0])
        c = comms[ci]
        f = int(func[i0])
        fname = WIRE_FUNCS[f]
        nbytes = int(cnt[i0]) * dsz * (c.n_ranks if f in _FULL else 1)
        cfg = (WIRE_ALGOS_INDEX.get(int(inst["algo"][i0]), -1), WIRE_PROTOS_INDEX.get(int(inst["proto"][i0]), -1),
               int(inst["nch"][i0]))
        out[(c.comm_hash, fname, nbytes)] = (cfg, inst["start"][idx], inst["mean"][idx], ci,
                                             inst["end"][idx] - inst["start"][idx])
    return out


# wire codes -> simulator cost-model indices (the engine writes cost-model indices; both follow NCCL's enums)
WIRE_ALGOS_INDEX = {i: ALGOS.index(a) for i, a in enumerate(WIRE_ALGOS) if a in ALGOS}
WIRE_PROTOS_INDEX = {i: PROTOS.index(p) for i, p in enumerate(WIRE_PROTOS) if p in PROTOS}
