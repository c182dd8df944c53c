"""Simulator → collector features, in process (for the evaluation and tests).

The simulator's :class:`~dynamiccl.harness.simulator.engine.Engine` produces, per step, one emulator record
(``emu_coll_t``) per rank per collective. The real path replays them through the C profiler
plugin and a socket into the collector; this module builds the same ``EVENT_DTYPE`` records the
plugin would emit (KERNEL_GPU timing, communicator rank, bytes = count × type size, one batch per
node process with host ``sim-node-NN``) and hands them to the collector's own
:class:`~dynamiccl.collector.processors.window_agg.WindowAggregator`, so the detector sees the collector's
real features without the plugin's cost.

Optional *realism* (``Realism``) perturbs records before aggregation, to model what the idealised
simulator lacks: heavy-tailed per-instance slowdowns, short job-wide hiccups (OS jitter, GC) and
bad input (a node's clock jumping, a rank vanishing from the stream, garbage durations).

>>> from dynamiccl.harness.simulator.workload import preset
>>> feed = SimFeed(preset("small"), seed=1, duration_s=3.0)
>>> windows = list(feed.windows())
>>> len(windows) >= 2, set(windows[0].keys["func"].to_list()) >= {"AllReduce"}
(True, True)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import WindowConfig
from dynamiccl.collector.features import WindowFeatures
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.collector.wire_format import DATATYPE_SIZES, EVENT_DTYPE, FUNCS, Kind, TimingSource

__all__ = ["SimFeed", "Realism"]

_P2P = np.zeros(256, bool)
for _name in ("Send", "Recv", "SendRecv"):
    if _name in FUNCS:
        _P2P[FUNCS.index(_name)] = True


@dataclass(frozen=True)
class Realism:
    """Perturbations applied to simulated records (all off by default).

    tail_prob / tail_scale
        Each collective instance is, with probability ``tail_prob``, slowed by a Pareto(α=2)
        factor ``1 + tail_scale × (Pareto − 1)`` (all ranks of the instance).
    hiccup_rate_per_s / hiccup_s / hiccup_factor
        Job-wide hiccups (Poisson, per simulated second) during which every collective's duration
        is multiplied by ``hiccup_factor`` for ``hiccup_s`` seconds.
    clock_jump_at_s / clock_jump_s / clock_jump_node
        From ``clock_jump_at_s`` on, node ``clock_jump_node``'s timestamps are shifted by
        ``clock_jump_s`` (its durations are unchanged: both ends shift).
    vanish_at_s / vanish_rank
        From ``vanish_at_s`` on, global rank ``vanish_rank`` sends no more records.
    garbage_prob
        Fraction of records whose end time is replaced by garbage (before start, or hours later).
    bg_sigma / bg_rho
        Background load on the network: durations of multi-node collectives are multiplied by
        ``exp(b(t))``, ``b`` an AR(1) process per simulated second with stationary standard
        deviation ``bg_sigma`` and lag-1 correlation ``bg_rho``.
    """

    tail_prob: float = 0.0
    tail_scale: float = 1.0
    hiccup_rate_per_s: float = 0.0
    hiccup_s: float = 0.1
    hiccup_factor: float = 1.5
    clock_jump_at_s: float | None = None
    clock_jump_s: float = 0.0
    clock_jump_node: int = 0
    vanish_at_s: float | None = None
    vanish_rank: int = 0
    garbage_prob: float = 0.0
    bg_sigma: float = 0.0
    bg_rho: float = 0.0


class SimFeed:
    """Run a workload under a scenario and yield the collector's :class:`WindowFeatures`.

    Parameters are stored verbatim; the same arguments give identical windows.
    """

    def __init__(self, workload, scenario=None, *, seed: int = 0, duration_s: float | None = None,
                 job_id: str | None = None, window_s: float | None = None, realism: Realism | None = None,
                 epoch_ns: int | None = None):
        from dynamiccl.harness.simulator.engine import DEFAULT_EPOCH_NS, Engine

        self.workload = workload
        self.scenario = scenario
        self.seed = seed
        self.realism = realism or Realism()
        self.job_id = job_id or f"sim-{workload.name}-s{seed}"
        self.engine = Engine(workload, scenario, seed=seed, duration_s=duration_s,
                             epoch_ns=DEFAULT_EPOCH_NS if epoch_ns is None else epoch_ns)
        self.epoch_s = self.engine.epoch_ns / 1e9
        self._rng = np.random.default_rng([seed, 0x5EED])
        self._out: list[WindowFeatures] = []
        window_s = WindowConfig().window_s if window_s is None else window_s   # the collector's default
        self._agg = WindowAggregator(WindowConfig(window_s=window_s, allowed_lateness_s=0.5,
                                                  idle_flush_s=1e9, max_open_windows=1 << 20),
                                     next_consumer=self, clock=lambda: 0.0)
        self._compile()
        self._hiccups = self._hiccup_times()
        self._bg = self._background()

    # consumer of the aggregator
    def consume(self, result) -> None:
        self._out.append(result.features)

    def _compile(self) -> None:
        w = self.workload
        comms = w.comms
        ppn = w.topology.gpus_per_node
        self._comm_hash = np.array([c.comm_hash for c in comms], dtype=np.uint64)
        self._comm_nranks = np.array([c.n_ranks for c in comms], dtype=np.int32)
        self._comm_nnodes = np.array([c.n_nodes for c in comms], dtype=np.int32)
        n_ranks = w.topology.n_ranks
        self._comm_rank = np.full((len(comms), n_ranks), -1, dtype=np.int32)
        for ci, c in enumerate(comms):
            for m, r in enumerate(c.ranks):
                self._comm_rank[ci, r] = m
        self._names = [{int(c.comm_hash): c.name for c in comms if any(r // ppn == n for r in c.ranks)}
                       for n in range(w.topology.n_nodes)]
        self._dsize = DATATYPE_SIZES[list(__import__("dynamiccl.collector.wire_format", fromlist=["DATATYPES"]).DATATYPES)
                                     .index(w.dtype)]

    def _hiccup_times(self) -> np.ndarray:
        r = self.realism
        if r.hiccup_rate_per_s <= 0:
            return np.zeros(0)
        dur = self.engine.duration_s + 60.0
        n = self._rng.poisson(r.hiccup_rate_per_s * dur)
        return np.sort(self._rng.uniform(0.0, dur, n))

    def _background(self) -> np.ndarray:
        r = self.realism
        if r.bg_sigma <= 0:
            return np.zeros(0)
        n = int(self.engine.duration_s + 120)
        e = self._rng.standard_normal(n) * r.bg_sigma * np.sqrt(1.0 - r.bg_rho ** 2)
        b = np.empty(n)
        b[0] = self._rng.standard_normal() * r.bg_sigma
        for i in range(1, n):
            b[i] = r.bg_rho * b[i - 1] + e[i]
        return b

    # ---------------------------------------------------------------------------------------
    def windows(self) -> Iterator[WindowFeatures]:
        """Every closed window, in order, until the engine's duration; then the last ones."""
        for step in self.engine.steps():
            self._push(step)
            if self._out:
                out, self._out = self._out, []
                yield from out
        self._agg.shutdown()
        out, self._out = self._out, []
        yield from out

    def _push(self, step) -> None:
        ops = step.ops
        n = len(ops)
        ev = np.zeros(n, dtype=EVENT_DTYPE)
        func = ops["func"].astype(np.uint8)
        ev["kind"] = np.where(_P2P[func], Kind.P2P, Kind.COLL)
        ev["func"] = func
        ev["datatype"] = ops["datatype"]
        ev["algo"] = ops["algo"]
        ev["proto"] = ops["proto"]
        ev["n_channels"] = np.minimum(ops["n_channels"], 255)
        ev["n_warps"] = np.minimum(ops["n_warps"], 255)
        ev["timing_source"] = TimingSource.KERNEL_GPU
        ci = step.comm
        ev["rank"] = self._comm_rank[ci, step.rank]
        ev["nranks"] = self._comm_nranks[ci]
        ev["nnodes"] = self._comm_nnodes[ci]
        ev["pid"] = 1000 + step.rank
        ev["root"] = ops["root"]
        ev["comm_hash"] = self._comm_hash[ci]
        ev["seq_number"] = ops["seq_number"]
        ev["count"] = ops["count"]
        ev["bytes"] = ops["count"] * np.uint64(self._dsize)
        start = ops["gpu_start_ns"].astype(np.int64)
        end = ops["gpu_end_ns"].astype(np.int64)
        start, end, keep = self._perturb(step, start, end)
        ev["gpu_start_ns"] = start.astype(np.uint64)
        ev["gpu_end_ns"] = end.astype(np.uint64)
        ev["enqueue_ns"] = np.maximum(start - 5000, 0).astype(np.uint64)
        ev["cpu_end_ns"] = ev["gpu_end_ns"]
        bounds = step.node_bounds
        for node in range(len(bounds) - 1):
            a, b = int(bounds[node]), int(bounds[node + 1])
            sel = ev[a:b][keep[a:b]]
            if len(sel):
                self._agg.consume(RecordBatch(sel, f"sim-node-{node:02d}", self.job_id, self._names[node]))

    def _perturb(self, step, start: np.ndarray, end: np.ndarray):
        r = self.realism
        n = len(start)
        keep = np.ones(n, bool)
        epoch = self.engine.epoch_ns
        if r.tail_prob > 0 or len(self._hiccups) or len(self._bg):
            dur = (end - start).astype(np.float64)
            factor = np.ones(n)
            if r.tail_prob > 0:
                # one draw per instance: (comm, seq_number) identifies it across ranks
                inst = self._comm_hash[step.comm].astype(np.uint64) ^ (step.ops["seq_number"] * np.uint64(0x9E3779B97F4A7C15))
                u = (inst % np.uint64(1 << 24)).astype(np.float64) / float(1 << 24)
                u2 = ((inst >> np.uint64(24)) % np.uint64(1 << 24)).astype(np.float64) / float(1 << 24)
                hit = ((u + self.seed * 0.618034) % 1.0) < r.tail_prob
                pareto = 1.0 / np.sqrt(np.maximum(1.0 - u2, 1e-9))  # Pareto(alpha=2) >= 1
                factor = np.where(hit, 1.0 + r.tail_scale * (pareto - 1.0), factor)
            if len(self._hiccups):
                t = (start - epoch) / 1e9
                idx = np.searchsorted(self._hiccups, t, side="right") - 1
                inside = (idx >= 0) & (t - self._hiccups[np.maximum(idx, 0)] < r.hiccup_s)
                factor = np.where(inside, factor * r.hiccup_factor, factor)
            if len(self._bg):
                sec = np.clip(((start - epoch) // 10**9).astype(np.int64), 0, len(self._bg) - 1)
                multi = self._comm_nnodes[step.comm] > 1
                factor = np.where(multi, factor * np.exp(self._bg[sec]), factor)
            end = start + np.rint(dur * factor).astype(np.int64)
        if r.garbage_prob > 0:
            g = self._rng.random(n) < r.garbage_prob
            if g.any():
                bad = np.where(self._rng.random(n) < 0.5, start - 10_000_000, start + 7_200 * 10**9)
                end = np.where(g, bad, end)
        if r.clock_jump_at_s is not None:
            ppn = self.workload.topology.gpus_per_node
            on = ((start - epoch) / 1e9 >= r.clock_jump_at_s) & (step.rank // ppn == r.clock_jump_node)
            shift = int(round(r.clock_jump_s * 1e9))
            start = np.where(on, start + shift, start)
            end = np.where(on, end + shift, end)
        if r.vanish_at_s is not None:
            keep &= ~(((start - epoch) / 1e9 >= r.vanish_at_s) & (step.rank == r.vanish_rank))
        return start, end, keep
