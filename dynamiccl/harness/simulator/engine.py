"""The job engine: runs a :class:`~dynamiccl.harness.simulator.workload.Workload` in simulated time under a
:class:`~dynamiccl.harness.simulator.scenario.Scenario` and emits, per step, one emulator record (``emu_coll_t``) per rank per
collective, ready for :mod:`dynamiccl.harness.simulator.driver` to replay through the real profiler plugin.

Per collective instance (one comm, one schedule slot):

1. NCCL's cost table for the comm's shape (:class:`~dynamiccl.harness.simulator.cost_model.NcclModel`, cached per
   (comm shape, func, size)), then the :class:`Tuner` hook (default: none, NCCL's choice stands), argmin →
   (algo, proto), channels (the tuner's, else NCCL's ``topoGetAlgoInfo``), chunk (``calcCollChunking``).
2. Its duration ``T`` from :func:`~dynamiccl.harness.simulator.perf_model.expected_time` under the scenario's
   :class:`~dynamiccl.harness.simulator.perf_model.NetworkState` restricted to the comm's nodes and ranks (cached per state).
3. Arrival of each member rank = its previous end + the op's ``compute_us`` + straggler delay + arrival
   jitter (exponential, mean ``arrival_jitter_us``); the common finish = last arrival + ``T`` × shared noise;
   each rank's GPU interval runs from its own arrival to the finish (× its own small noise), so a
   straggler's own duration is the shortest (the semantics of :func:`~dynamiccl.harness.simulator.perf_model.sample_durations`).
4. ``gpu_start_ns``/``gpu_end_ns`` = ``epoch_ns`` + simulated offset; ``seq_number`` counts per (comm, func),
   identical on every rank of an instance.

Everything static (who takes part in which slot, record order, wire codes) is compiled once into a step
template; per step the only Python loop is over schedule slots (each slot is a few numpy operations over its
ranks), because every rank's next arrival depends on its previous finish. The network state is re-evaluated
whenever simulated time crosses one of the scenario's change times (also mid-step); benign ``pause``/``mix``
events apply at step boundaries.

>>> from dynamiccl.harness.simulator.workload import preset
>>> eng = Engine(preset("small"), seed=1)
>>> b = eng.step()
>>> len(b.ops), b.node_bounds.tolist(), bool((b.ops["gpu_end_ns"] > b.ops["gpu_start_ns"]).all())
(128, [0, 64, 128], True)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import numpy as np

from dynamiccl.collector.wire_format import FUNCS as WIRE_FUNCS
from dynamiccl.collector.wire_format import UNKNOWN
from dynamiccl.harness.simulator.cost_model import NcclModel, RING, SIMPLE
from dynamiccl.harness.simulator.perf_model import NetworkState, expected_time
from dynamiccl.harness.simulator.scenario import Scenario
from dynamiccl.harness.simulator.topology import Topology
from dynamiccl.harness.simulator.workload import COLL_FUNCS, Comm, Workload

__all__ = ["Engine", "StepRecords", "CommInit", "Tuner", "Decision", "EMU_OP_DTYPE", "EMU_F_CROSS_NODE", "DEFAULT_EPOCH_NS"]

from dynamiccl.harness.simulator.engine_schedule import _RECV, _SEND, _Records, _schedule_records
from dynamiccl.harness.simulator.engine_types import (
    DEFAULT_EPOCH_NS, EMU_F_CROSS_NODE, EMU_OP_DTYPE, CommInit, Decision, StepRecords, Tuner,
)



def _sub_topology(topo: Topology, comm: Comm) -> Topology:
    same = comm.n_nodes == topo.n_nodes and comm.gpus_per_node == topo.gpus_per_node
    return dataclasses.replace(topo, name=f"{topo.name}[{comm.n_nodes}x{comm.gpus_per_node}]", nodes=comm.n_nodes,
                               gpus_per_node=comm.gpus_per_node, graph=topo.graph if same else None)


class Engine:
    """Deterministic given ``seed``: the same inputs give identical records.

    Parameters are stored verbatim; ``tuner`` may be None (NCCL's default choice).
    """

    def __init__(self, workload: Workload, scenario: Scenario | None = None, *, seed: int = 0,
                 epoch_ns: int = DEFAULT_EPOCH_NS, tuner: Tuner | None = None,
                 duration_s: float | None = None) -> None:
        self.workload = workload
        self.scenario = scenario if scenario is not None else Scenario("stationary")
        self.seed = seed
        self.epoch_ns = int(epoch_ns)
        self.tuner = tuner
        self.duration_s = duration_s if duration_s is not None else (self.scenario.duration_s or 60.0)
        self.scenario.validate_for(workload.topology, tuple(g.name for g in workload.groups))
        self._rng = np.random.default_rng(seed)
        self._topo = workload.topology
        self._models: dict[tuple[int, int], NcclModel] = {}
        self._subtopo: dict[tuple[int, int], Topology] = {}
        self._cost_cache: dict[tuple, Decision] = {}
        self._time_cache: dict[tuple, float] = {}
        self._compile()
        self._end_us = np.zeros(self._topo.n_ranks)
        self._seq = np.zeros(self._n_pairs, dtype=np.uint64)
        self._step = 0
        self._bp_us = self.scenario.change_times(self.duration_s + 3600.0) * 1e6

    # ---- static compilation ----------------------------------------------------------------------
    def _compile(self) -> None:
        """The workload's schedule as flat tables: one row per (op, communicator, rank) record, in
        node-major (node, communicator key, op) order, and an `EMU_OP_DTYPE` template of them."""
        w = self.workload
        key_of = self._node_comm_keys()
        self._groups = w.groups
        self._members = [g.members() for g in w.groups]
        r = _schedule_records(w, self._topo.gpus_per_node)
        self._uniq = list(r.uniq)                     # [(group, func, base bytes)]
        self._slot_u = np.array(r.slot_u, dtype=np.int64)
        self._slot_g = r.slot_g
        self._gap = np.array(r.gap, dtype=np.float64)
        self._rec_lo = r.rec_lo
        self._inst_lo = r.inst_lo
        self._n_rec, self._n_inst = r.n_rec, r.n_inst
        self._n_pairs = len(r.pair_count)
        self._pair_count = np.array([r.pair_count[p] for p in range(len(r.pair_count))], dtype=np.uint64)
        self._output_tables(r, key_of)
        # per unique op: count divisor (AllGather/ReduceScatter count is per rank)
        self._u_div = np.array([w.dtype_size * (w.groups[g].size if f in ("AllGather", "ReduceScatter") else 1)
                                for g, f, _ in self._uniq], dtype=np.int64)
        self._cmax = max(len(g.comms) for g in w.groups)

    def _node_comm_keys(self) -> dict[tuple[int, int], int]:
        """Node-local (comm, rank) keys, in init order (``_node_comms`` per node); returns the key of
        each (communicator index, rank)."""
        topo = self._topo
        ppn = topo.gpus_per_node
        self._node_comms: list[list[CommInit]] = [[] for _ in range(topo.n_nodes)]
        key_of: dict[tuple[int, int], int] = {}
        for ci, c in enumerate(self.workload.comms):
            for m, r in enumerate(c.ranks):
                lst = self._node_comms[r // ppn]
                key_of[(ci, r)] = len(lst)
                lst.append(CommInit(len(lst), c.comm_hash, c.name, c.n_nodes, c.n_ranks, m, r))
        return key_of

    def _output_tables(self, r: "_Records", key_of: dict[tuple[int, int], int]) -> None:
        """The records permuted node-major: (node, key, slot)."""
        rec_rank_a = np.array(r.rank, dtype=np.int64)
        rec_key = np.array([key_of[(c, k)] for c, k in zip(r.comm, r.rank)], dtype=np.int64)
        rec_node_a = np.array(r.node, dtype=np.int64)
        rec_slot_a = np.array(r.slot, dtype=np.int64)
        perm = np.lexsort((rec_slot_a, rec_key, rec_node_a))
        self._perm = perm
        self._out_rank = rec_rank_a[perm].astype(np.int32)
        self._out_comm = np.array(r.comm, dtype=np.int32)[perm]
        self._out_key = rec_key[perm].astype(np.int32)
        self._node_bounds = np.searchsorted(rec_node_a[perm], np.arange(self._topo.n_nodes + 1)).astype(np.int64)
        self._out_u = self._slot_u[rec_slot_a][perm]
        self._out_cpos = np.array(r.cpos, dtype=np.int64)[perm]
        self._out_pair = np.array(r.pair, dtype=np.int64)[perm]
        self._out_off = np.array(r.off, dtype=np.uint64)[perm]
        self._out_p2p = np.isin(np.array(r.func)[perm], (_SEND, _RECV))
        tmpl = np.zeros(r.n_rec, dtype=EMU_OP_DTYPE)
        tmpl["func"] = np.array(r.func, dtype=np.int32)[perm]
        tmpl["datatype"] = _wire_dtype(self.workload.dtype)
        tmpl["root"] = np.array(r.root, dtype=np.int32)[perm]
        tmpl["flags"] = np.array(r.flags, dtype=np.uint32)[perm]
        self._template = tmpl

    # ---- public ---------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return self._topo.n_nodes

    def node_comms(self, node: int) -> list[CommInit]:
        return list(self._node_comms[node])

    @property
    def now_s(self) -> float:
        return float(self._end_us.max()) / 1e6

    @property
    def done(self) -> bool:
        return self.now_s >= self.duration_s

    def steps(self) -> Iterator[StepRecords]:
        """Steps until simulated time reaches ``duration_s`` (whole steps; the last may end a little later)."""
        while not self.done:
            yield self.step()

    # ---- decisions -------------------------------------------------------------------------------
    def _model(self, comm: Comm) -> tuple[NcclModel, Topology]:
        k = (comm.n_nodes, comm.gpus_per_node)
        if k not in self._models:
            self._subtopo[k] = _sub_topology(self._topo, comm)
            self._models[k] = NcclModel(self._subtopo[k])
        return self._models[k], self._subtopo[k]

    def _decide(self, comm: Comm, func: str, nbytes: int) -> Decision:
        model, _ = self._model(comm)
        shape = (comm.n_nodes, comm.gpus_per_node)
        if func == "Send":      # P2P: modelled as a 2-rank Ring/Simple transfer
            key = (shape, func, nbytes)
            d = self._cost_cache.get(key)
            if d is None:
                nb = np.array([nbytes])
                nch, nw = model.algo_info(RING, SIMPLE, nb)
                ck = model.chunk_size("Broadcast", RING, SIMPLE, nb, nch)
                d = self._cost_cache[key] = Decision(RING, SIMPLE, int(nch[0]), int(nw[0]), int(ck[0]))
            return d
        key = (shape, func, nbytes)
        if self.tuner is None and key in self._cost_cache:
            return self._cost_cache[key]
        res = model.cost_table(func, np.array([nbytes]))
        if self.tuner is None:
            d = Decision(int(res.algo[0]), int(res.proto[0]), int(res.n_channels[0]), int(res.n_warps[0]),
                         int(res.chunk[0]))
            self._cost_cache[key] = d
            return d
        table, nch = self.tuner.get_coll_info(comm, func, nbytes, res.table[0].copy())
        flat = np.where(np.asarray(table) >= 0, np.asarray(table), np.inf).reshape(-1)
        best = int(np.argmin(flat))
        if not math.isfinite(flat[best]):
            raise ValueError(f"tuner disabled every (algo, proto) for {comm.name} {func} {nbytes} B")
        a, p = divmod(best, 3)
        nb = np.array([nbytes])
        ch, nw = model.algo_info(a, p, nb)
        if nch and nch > 0:
            ch = np.array([int(nch)])
        ck = model.chunk_size(func, a, p, nb, ch)
        chunk = int(ck[0])
        get_chunk = getattr(self.tuner, "get_chunk_size", None)     # v6 getChunkSize: NCCL clamps to its buffer
        if get_chunk is not None:
            chunk = max(1, min(int(get_chunk(comm, func, nbytes, a, p, int(ch[0]), chunk)), chunk))
        return Decision(a, p, int(ch[0]), int(nw[0]), chunk)

    def _time(self, comm: Comm, func: str, nbytes: int, d: Decision, st: dict, state_key: bytes,
              sigma: float) -> float:
        key = (comm.n_nodes, comm.gpus_per_node, state_key, func, nbytes, d)
        t = self._time_cache.get(key)
        if t is None:
            _, sub = self._model(comm)
            nodes, ranks = list(comm.nodes), list(comm.ranks)
            ns = NetworkState(link_bw_factor=tuple(st["link_bw_factor"][nodes]),
                              added_latency_us=tuple(st["added_latency_us"][nodes]),
                              competing_share=tuple(st["competing_share"][nodes]),
                              rank_slowdown=tuple(st["rank_slowdown"][ranks]), noise_sigma=sigma)
            f = "Broadcast" if func == "Send" else func
            t = float(expected_time(sub, f, np.array([nbytes]), d.algo, d.proto, d.n_channels, d.chunk, ns)[0])
            if not math.isfinite(t):
                raise ValueError(f"{comm.name}: {func} {nbytes} B cannot run as algo {d.algo} proto {d.proto}")
            if len(self._time_cache) > 200_000:
                self._time_cache.clear()
            self._time_cache[key] = t
        return t

    def _durations(self, state: NetworkState, sizes: list[int], dec: list[list[Decision]]) -> np.ndarray:
        """Noise-free duration (µs) per unique op and comm position: (n_uniq, cmax)."""
        st = state.resolve(self._topo)
        Tu = np.zeros((len(self._uniq), self._cmax))
        for u, (g, func, _) in enumerate(self._uniq):
            for cpos, c in enumerate(self._groups[g].comms):
                nodes, ranks = list(c.nodes), list(c.ranks)
                skey = b"".join(st[k][nodes].tobytes() for k in ("link_bw_factor", "added_latency_us", "competing_share"))
                skey += st["rank_slowdown"][ranks].tobytes()
                Tu[u, cpos] = self._time(c, func, sizes[u], dec[u][cpos], st, skey, state.noise_sigma)
        return Tu

    # ---- one step --------------------------------------------------------------------------------
    def step(self) -> StepRecords:
        """One training step: every slot of the schedule timed on the network state of its moment
        (arrival = own previous end + compute gap + straggler delay + jitter; finish = last arrival
        + duration x shared noise), returned as records in node-major order."""
        t0 = self.now_s
        pause_end = self.scenario.pause_until(t0)
        if pause_end is not None:                      # checkpoint: nobody issues collectives
            self._end_us[:] = pause_end * 1e6
            t0 = pause_end
        on_step = getattr(self.tuner, "on_step", None)    # step boundary: config delivery / agreement hook
        if on_step is not None:
            on_step(self._step)
        sizes = self._step_sizes(t0)
        dec = [[self._decide(c, func, sizes[u]) for c in self._groups[g].comms]
               for u, (g, func, _) in enumerate(self._uniq)]
        start, end_out = self._time_slots(t0, sizes, dec)
        self._end_us += self.workload.step_gap_us
        ops = self._assemble(start, end_out, sizes, dec)
        rec = StepRecords(self._step, t0, self.now_s, ops, self._out_rank, self._out_comm, self._out_key,
                          self._node_bounds)
        self._step += 1
        return rec

    def _step_sizes(self, t0: float) -> list[int]:
        """Bytes of each unique op at ``t0`` (a benign mix event scales a group's sizes, kept a
        multiple of the op's count divisor)."""
        sizes = []
        for u, (g, func, nb) in enumerate(self._uniq):
            scale = self.scenario.size_scale(t0, self._groups[g].name)
            if scale != 1.0:
                div = int(self._u_div[u])
                nb = max(div, int(round(nb * scale / div)) * div)
            sizes.append(int(nb))
        return sizes

    def _time_slots(self, t0: float, sizes: list[int], dec: list) -> tuple[np.ndarray, np.ndarray]:
        """Start and end (µs) of every record of the step, slot by slot; the network state is
        looked up again whenever the scenario's next breakpoint is passed mid-step."""
        sc, w = self.scenario, self.workload
        state = sc.state_at(t0, self._topo)
        Tu = self._durations(state, sizes, dec)
        delay = state.resolve(self._topo)["rank_delay_us"]
        # randomness for the whole step at once
        rng = self._rng
        jit_mean = w.arrival_jitter_us
        jit = rng.exponential(jit_mean, self._n_rec) if jit_mean > 0 else np.zeros(self._n_rec)
        sig = state.noise_sigma
        shared = rng.lognormal(0.0, sig, self._n_inst) if sig > 0 else np.ones(self._n_inst)
        prn = rng.lognormal(0.0, sig / 4, self._n_rec) if sig > 0 else np.ones(self._n_rec)
        start = np.empty(self._n_rec)
        end_out = np.empty(self._n_rec)
        end = self._end_us
        bp = self._bp_us
        nbp = int(np.searchsorted(bp, t0 * 1e6, side="right"))
        next_bp = bp[nbp] if nbp < len(bp) else math.inf
        tnow = t0 * 1e6
        slot_u, slot_g, gap, members = self._slot_u, self._slot_g, self._gap, self._members
        rec_lo, inst_lo = self._rec_lo, self._inst_lo
        for i in range(len(slot_g)):
            if tnow >= next_bp:                        # the network changed mid-step
                while nbp < len(bp) and bp[nbp] <= tnow:
                    nbp += 1
                next_bp = bp[nbp] if nbp < len(bp) else math.inf
                state = sc.state_at(tnow / 1e6, self._topo)
                Tu = self._durations(state, sizes, dec)
                delay = state.resolve(self._topo)["rank_delay_us"]
            m = members[slot_g[i]]
            C, S = m.shape
            a, b = rec_lo[i], rec_lo[i + 1]
            arr = end[m] + gap[i] + delay[m] + jit[a:b].reshape(C, S)
            fin = arr.max(axis=1) + Tu[slot_u[i], :C] * shared[inst_lo[i]:inst_lo[i + 1]]
            e = arr + (fin[:, None] - arr) * prn[a:b].reshape(C, S)
            end[m] = e
            start[a:b] = arr.ravel()
            end_out[a:b] = e.ravel()
            tnow = fin[0]
        return start, end_out

    def _assemble(self, start: np.ndarray, end_out: np.ndarray, sizes: list[int], dec: list) -> np.ndarray:
        """The step's records in node-major order: GPU times, each communicator's decision, counts and
        sequence numbers."""
        perm = self._perm
        ops = self._template.copy()
        s_ns = np.rint(start[perm] * 1000.0).astype(np.int64)
        e_ns = np.rint(end_out[perm] * 1000.0).astype(np.int64)
        e_ns = np.maximum(e_ns, s_ns + 64 + 1)          # room for per-channel pTimer offsets
        ops["gpu_start_ns"] = (s_ns + self.epoch_ns).astype(np.uint64)
        ops["gpu_end_ns"] = (e_ns + self.epoch_ns).astype(np.uint64)
        nu = len(self._uniq)

        def per_comm(attr: str) -> np.ndarray:
            return np.array([[getattr(d, attr) for d in row] + [0] * (self._cmax - len(row)) for row in dec],
                            dtype=np.int32)

        algo, proto, nch, nw = (per_comm(k) for k in ("algo", "proto", "n_channels", "n_warps"))
        ou, oc = self._out_u, self._out_cpos
        ops["algo"] = np.where(self._out_p2p, UNKNOWN, algo.reshape(nu, -1)[ou, oc])
        ops["proto"] = np.where(self._out_p2p, UNKNOWN, proto.reshape(nu, -1)[ou, oc])
        ops["n_channels"] = np.minimum(nch[ou, oc], 64)
        ops["n_warps"] = nw[ou, oc]
        ops["count"] = (np.array(sizes, dtype=np.int64) // self._u_div)[ou].astype(np.uint64)
        ops["seq_number"] = self._seq[self._out_pair] + self._out_off
        self._seq += self._pair_count
        return ops


def _wire_dtype(name: str) -> int:
    from dynamiccl.collector.wire_format import DATATYPES

    return DATATYPES.index(name)


assert set(COLL_FUNCS) <= set(WIRE_FUNCS)
