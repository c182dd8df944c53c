"""Ground truth for the evaluation: what every configuration really costs, the per-regime oracle, and the
regime changes a detector would report.

Times come from the simulator's performance model (:func:`dynamiccl.harness.simulator.perf_model.expected_time`, noise-free) with
exactly the decision the :class:`~dynamiccl.harness.simulator.engine.Engine` derives from a tuner's answer (channels from the
tuner or ``topoGetAlgoInfo``, chunk from ``calcCollChunking``), on the communicator's nodes and ranks.
The retuner never sees any of this: it only gets measured durations and regime changes.

The **oracle** is the best static configuration per regime (a regime = a stretch of constant network state),
over everything the tuner plugin can express through the engine: every (algo, proto) cell NCCL enabled x a
channel grid up to NCCL's budget (plus NCCL's own count); NCCL's default is always a candidate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dynamiccl.detector.events import RegimeChange
from dynamiccl.harness.simulator.cost_model import ALGOS, NVLS, NVLS_TREE, PROTOS, NcclModel
from dynamiccl.harness.simulator.perf_model import NetworkState, expected_time
from dynamiccl.harness.simulator.scenario import Scenario
from dynamiccl.harness.simulator.workload import Comm, Workload
from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig
from dynamiccl.retuner.model import sub_topology

__all__ = ["Op", "Truth", "CHANNEL_GRID", "KIND_OF"]

CHANNEL_GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
#: simulator event kind -> the detector's regime-change kind
KIND_OF = {"bw_drop": "bandwidth", "degrading_nic": "bandwidth", "incast": "bandwidth", "latency": "latency",
           "flap": "flapping", "straggler": "straggler"}

Cfg = tuple[int, int, int]          # (algo index, proto index, channels; 0 = NCCL's)


@dataclass(frozen=True)
class Op:
    comm: Comm
    func: str
    nbytes: int         # NCCL nBytes (what the tuner sees)

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.comm.comm_hash, self.func, self.nbytes)


class Truth:
    def __init__(self, workload: Workload, scenario: Scenario, duration_s: float) -> None:
        self.w = workload
        self.sc = scenario
        self.duration_s = duration_s
        self.topo = workload.topology
        self._models: dict[tuple[int, int], NcclModel] = {}
        self._time: dict[tuple, float] = {}
        self._best: dict[tuple, tuple[Cfg, float]] = {}
        self.ops = self._ops()

    # ---- workload --------------------------------------------------------------------------------------
    def _ops(self) -> list[Op]:
        seen, out = set(), []
        for op in self.w.schedule:
            if op.func == "Send":
                continue
            for c in self.w.group(op.group).comms:
                k = (c.comm_hash, op.func, op.bytes)
                if k not in seen:
                    seen.add(k)
                    out.append(Op(c, op.func, op.bytes))
        return out

    def calls_per_step(self) -> dict[tuple[int, str, int], int]:
        n: dict[tuple[int, str, int], int] = {}
        for op in self.w.schedule:
            if op.func == "Send":
                continue
            for c in self.w.group(op.group).comms:
                k = (c.comm_hash, op.func, op.bytes)
                n[k] = n.get(k, 0) + 1
        return n

    def model(self, comm: Comm) -> NcclModel:
        k = (comm.n_nodes, comm.n_ranks)
        if k not in self._models:
            self._models[k] = NcclModel(sub_topology(self.topo, comm.n_nodes, comm.n_ranks))
        return self._models[k]

    # ---- costs -----------------------------------------------------------------------------------------
    def default_cfg(self, op: Op) -> Cfg:
        r = self.model(op.comm).cost_table(op.func, np.array([op.nbytes]))
        return int(r.algo[0]), int(r.proto[0]), 0

    def decision(self, op: Op, cfg: Cfg) -> tuple[int, int, int, int]:
        """(algo, proto, channels, chunk) the engine runs for a tuner answer ``cfg``."""
        m = self.model(op.comm)
        a, p, ch = cfg
        nb = np.array([op.nbytes])
        if ch <= 0:
            ch = int(m.algo_info(a, p, nb)[0][0])
        ck = int(m.chunk_size(op.func, a, p, nb, np.array([ch]))[0])
        return a, p, ch, ck

    def _state_for(self, comm: Comm, state: NetworkState) -> NetworkState:
        st = state.resolve(self.topo)
        nodes, ranks = list(comm.nodes), list(comm.ranks)
        return NetworkState(link_bw_factor=tuple(st["link_bw_factor"][nodes]),
                            added_latency_us=tuple(st["added_latency_us"][nodes]),
                            competing_share=tuple(st["competing_share"][nodes]),
                            rank_slowdown=tuple(st["rank_slowdown"][ranks]), noise_sigma=0.0)

    @staticmethod
    def state_key(state: NetworkState) -> tuple:
        return (state.link_bw_factor, state.added_latency_us, state.competing_share, state.rank_delay_us,
                state.rank_slowdown)

    def time_us(self, op: Op, cfg: Cfg, state: NetworkState) -> float:
        d = self.decision(op, cfg)
        k = (op.key, d, self.state_key(state))
        t = self._time.get(k)
        if t is None:
            sub = self.model(op.comm).topology
            t = float(expected_time(sub, op.func, np.array([op.nbytes]), d[0], d[1], d[2], d[3],
                                    self._state_for(op.comm, state))[0])
            self._time[k] = t
        return t

    def candidates(self, op: Op) -> list[Cfg]:
        m = self.model(op.comm)
        r = m.cost_table(op.func, np.array([op.nbytes]))
        out: list[Cfg] = []
        for a in range(7):
            for p in range(3):
                if r.table[0, a, p] < 0:
                    continue
                lim = m.comm_channels
                if a in (NVLS, NVLS_TREE):
                    lim = int(m.algo_info(a, p, np.array([op.nbytes]))[0][0])
                out.append((a, p, 0))
                out += [(a, p, c) for c in CHANNEL_GRID if c <= lim]
        return out

    def best(self, op: Op, state: NetworkState) -> tuple[Cfg, float]:
        k = (op.key, self.state_key(state))
        b = self._best.get(k)
        if b is None:
            d = self.default_cfg(op)
            best, bt = d, self.time_us(op, d, state)
            for c in self.candidates(op):
                t = self.time_us(op, c, state)
                if t < bt * (1 - 1e-9):
                    best, bt = c, t
            b = self._best[k] = (best, bt)
        return b

    # ---- regimes -----------------------------------------------------------------------------------------
    def baseline_state(self) -> NetworkState:
        return Scenario("baseline", noise_sigma=self.sc.noise_sigma).state_at(0.0, self.topo)

    def segments(self) -> list[tuple[float, float, NetworkState]]:
        """Stretches of constant network state over [0, duration_s]."""
        ts = [0.0] + [float(t) for t in self.sc.change_times(self.duration_s + 3600.0)]
        ts = sorted(set(t for t in ts if t <= self.duration_s * 2)) + [math.inf]
        out: list[tuple[float, float, NetworkState]] = []
        for a, b in zip(ts[:-1], ts[1:]):
            st = self.sc.state_at(a, self.topo)
            if out and self.state_key(out[-1][2]) == self.state_key(st):
                out[-1] = (out[-1][0], b, st)
            else:
                out.append((a, b, st))
        return out

    def rules_for(self, state: NetworkState, version: int) -> TunerConfig:
        """The oracle's config for ``state`` as exact-size tuner rules."""
        rules = []
        for op in self.ops:
            (a, p, ch), _ = self.best(op, state)
            rules.append(Rule(op.func, op.nbytes, op.nbytes, ALGOS[a], PROTOS[p], ch, 0, op.comm.comm_hash))
        return TunerConfig(version, tuple(rules))

    def affected_comms(self, events) -> list[Comm]:
        out = []
        for c in self.w.comms:
            for e in events:
                if e.kind == "straggler":
                    if set(e.ranks) & set(c.ranks):
                        out.append(c)
                        break
                elif c.n_nodes > 1 and (e.nodes is None or set(e.nodes) & set(c.nodes)):
                    out.append(c)
                    break
        return out

    def changes(self, *, delay_s: float = 1.0, window_s: float = 1.0, job_id: str = "sim") -> list[RegimeChange]:
        """The regime changes a detector with ``delay_s`` delay and ``window_s`` windows reports: one per state
        change (a return to the baseline state is a ``recovery`` of the change in force)."""
        base_key = self.state_key(self.baseline_state())
        out: list[RegimeChange] = []
        active_id: str | None = None
        prev = None
        n = 0
        for t0, _t1, st in self.segments():
            if t0 >= self.duration_s:
                break
            key = self.state_key(st)
            if prev is None:
                prev = st
                continue
            ev = [e for e in self.sc.events if not e.benign and e.kind != "recovery" and e.active(t0)]
            start = math.floor(t0 / window_s) * window_s
            det = math.ceil((t0 + delay_s) / window_s - 1e-9) * window_s
            n += 1
            if key == base_key:
                if active_id is not None:
                    out.append(RegimeChange(id=f"rc-{job_id}-{n}", kind="recovery", job_id=job_id, start_s=start,
                                            detected_s=det, magnitude=self._magnitude(prev, st, None),
                                            comms=[], recovers=active_id))
                active_id = None
            else:
                kinds = sorted({KIND_OF.get(e.kind, "bandwidth") for e in ev}) or ["bandwidth"]
                comms = self.affected_comms(ev)
                rid = f"rc-{job_id}-{n}"
                out.append(RegimeChange(
                    id=rid, kind=kinds[0], job_id=job_id, start_s=start, detected_s=det,
                    magnitude=self._magnitude(prev, st, comms), comms=[f"0x{c.comm_hash:x}" for c in comms],
                    comm_names=[c.name for c in comms], ranks=sorted({r for e in ev for r in e.ranks}),
                    evidence={"source": "ground truth", "events": [e.kind for e in ev]}))
                active_id = rid
            prev = st
        return out

    def _magnitude(self, old: NetworkState, new: NetworkState, comms) -> float:
        """New/old duration of the heaviest affected op under NCCL's default (what the detector measures)."""
        ids = None if comms is None else {c.comm_hash for c in comms}
        per = self.calls_per_step()
        best, weight = 1.0, -1.0
        for op in self.ops:
            if ids is not None and op.comm.comm_hash not in ids:
                continue
            d = self.default_cfg(op)
            t0, t1 = self.time_us(op, d, old), self.time_us(op, d, new)
            w = per[op.key] * t0
            if w > weight and t0 > 0:
                best, weight = t1 / t0, w
        return float(best)
