"""Model-guided candidates: NCCL's own cost model, refitted to what the job measures.

For a communicator of ``nnodes`` x ``nranks/nnodes`` GPUs on the configured topology, :class:`CommModel` wraps
:class:`dynamiccl.nccl_model.cost_model.NcclModel` (NCCL v2.30's ``ncclTopoTuneModel``/``ncclTopoGetAlgoTime``) and
re-evaluates it with two network parameters changed:

* ``dlat_us`` — extra inter-node latency per network hop (NCCL's ``graph.latencyInter``), for latency regimes;
* ``beta`` — fraction of the inter-node bandwidth left (NCCL's ``bwInter``/``bwIntra`` of multi-node graphs and
  the NVLS graph's ``bwInter``), for bandwidth regimes.

:meth:`CommModel.refit` finds the parameter that makes the model's time for the configuration that was
running change by the ratio the job measured (after/before the change). The refitted model then ranks
every (algo, proto) cell NCCL enabled; the retuner multiplies each cell's prediction by that cell's
measured/modelled bias when it has measured the cell before (NCCL's model is not reality).

>>> from dynamiccl.nccl_model.topology import preset
>>> m = CommModel(preset("h100-2x8"), nnodes=2, nranks=16)
>>> f = m.refit("latency", "AllReduce", 1 << 26, ("NVLS_TREE", "SIMPLE"), ratio=2.0)
>>> round(f.dlat_us, 1), f.beta           # +57.8 µs per network hop doubles NVLS_TREE/Simple's time
(57.8, 1.0)
>>> [c for c, _ in m.ranked("AllReduce", 1 << 26, f)][:2]
[('NVLS_TREE', 'SIMPLE'), ('RING', 'LL128')]
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dynamiccl.contracts.collectives import busbw_factor
from dynamiccl.nccl_model.cost_model import ALGOS, NCCL_STEPS, NVLS, NVLS_TREE, PROTOS, RING, SIMPLE, NcclModel
from dynamiccl.nccl_model.topology import Topology

__all__ = ["Fit", "CommModel", "sub_topology", "NO_FIT"]

Cell = tuple[str, str]


@dataclass(frozen=True)
class Fit:
    dlat_us: float = 0.0
    beta: float = 1.0


NO_FIT = Fit()


def sub_topology(topo: Topology, nnodes: int, nranks: int) -> Topology:
    """The topology a communicator of ``nnodes`` x ``nranks/nnodes`` GPUs sees (as the simulator builds it)."""
    if nnodes < 1 or nranks < nnodes or nranks % nnodes:
        raise ValueError(f"communicator shape {nranks} ranks on {nnodes} nodes is not uniform")
    ppn = nranks // nnodes
    same = nnodes == topo.n_nodes and ppn == topo.gpus_per_node
    return dataclasses.replace(topo, name=f"{topo.name}[{nnodes}x{ppn}]", nodes=nnodes, gpus_per_node=ppn,
                               graph=topo.graph if same else None)


class CommModel:
    """NCCL's model for one communicator shape; refits are cached (quantised) so ranking stays cheap."""

    def __init__(self, topology: Topology, *, nnodes: int, nranks: int) -> None:
        self.topology = sub_topology(topology, nnodes, nranks)
        self.nnodes = nnodes
        self.nranks = nranks
        self._base = NcclModel(self.topology)
        self._graph = self.topology.graph_params()
        self._cached = lru_cache(maxsize=64)(self._build)

    # ---- the model under a fit ---------------------------------------------------------------------
    def _build(self, dlat_q: float, beta_q: float) -> NcclModel:
        if dlat_q == 0.0 and beta_q == 1.0:
            return self._base
        g = self._graph
        multi = self.nnodes > 1
        g2 = dataclasses.replace(
            g, latency_inter=max(0.0, g.latency_inter + dlat_q),
            bw_inter=g.bw_inter * beta_q, bw_intra=g.bw_intra * beta_q if multi else g.bw_intra,
            nvls_bw_inter=g.nvls_bw_inter * beta_q, comm_channels=self._base.comm_channels)
        return NcclModel(dataclasses.replace(self.topology, graph=g2))

    def model(self, fit: Fit = NO_FIT) -> NcclModel:
        dq = round(fit.dlat_us * 4) / 4                      # 0.25 µs
        bq = float(np.exp(round(math.log(fit.beta) * 100) / 100))   # 1 %
        return self._cached(dq, 1.0 if abs(bq - 1.0) < 1e-9 else bq)

    def table(self, func: str, nbytes: int, fit: Fit = NO_FIT) -> np.ndarray:
        """NCCL's float[7][3] cost table (µs, −1 = disabled) under ``fit``."""
        return self.model(fit).cost_table(func, np.array([int(nbytes)])).table[0].astype(np.float64)

    def cells(self, func: str, nbytes: int) -> list[Cell]:
        """(algo, proto) cells NCCL enables for this call (cost ≥ 0 in the unrefitted table)."""
        t = self.table(func, nbytes)
        return [(ALGOS[a], PROTOS[p]) for a in range(7) for p in range(3) if t[a, p] >= 0]

    def default_cell(self, func: str, nbytes: int) -> Cell:
        r = self._base.cost_table(func, np.array([int(nbytes)]))
        return ALGOS[int(r.algo[0])], PROTOS[int(r.proto[0])]

    def predict(self, func: str, nbytes: int, cell: Cell, fit: Fit = NO_FIT) -> float:
        t = self.table(func, nbytes, fit)[ALGOS.index(cell[0]), PROTOS.index(cell[1])]
        return float(t) if t >= 0 else math.inf

    def ranked(self, func: str, nbytes: int, fit: Fit = NO_FIT) -> list[tuple[Cell, float]]:
        """Enabled cells, cheapest first, with the refitted model's time (µs)."""
        t = self.table(func, nbytes, fit)
        base = self.table(func, nbytes)
        out = [((ALGOS[a], PROTOS[p]), float(t[a, p])) for a in range(7) for p in range(3)
               if base[a, p] >= 0 and t[a, p] >= 0]
        return sorted(out, key=lambda x: x[1])

    def window_floor_us(self, func: str, nbytes: int, cell: Cell, n_channels: int = 0, fit: Fit = NO_FIT, *,
                        safety: float = 0.75) -> float:
        """A lower bound (µs) on a multi-node Ring's time from its in-flight window under ``fit``'s latency.

        NCCL's model has no latency-bandwidth product: a channel keeps at most ``NCCL_STEPS`` steps of one chunk
        in flight per connection (Simple's ring collectives use half the steps per chunk), so it cannot move more
        than ``NCCL_STEPS x step / RTT`` (nccl-tests#241). With small LL steps and a few hundred µs of added
        latency that window, not the link, is the bottleneck (RING/LL at 25 MB under +150 µs: NCCL's model says
        1.4 ms, the window alone 7 ms). The RTT is taken as ``safety`` x twice the one-way latency (topology +
        the fitted extra), so the bound stays below the real time when the fit overshoots. 0 when it does not
        apply (single node, not Ring, not AllReduce/AllGather/ReduceScatter, no added latency).
        """
        if self.nnodes < 2 or cell[0] != "RING" or fit.dlat_us <= 0 or func not in (
                "AllReduce", "AllGather", "ReduceScatter"):
            return 0.0
        a, p = ALGOS.index(cell[0]), PROTOS.index(cell[1])
        nb = np.array([int(nbytes)])
        nc = int(n_channels) if n_channels > 0 else int(self._base.algo_info(a, p, nb)[0][0])
        nc = max(1, min(nc, self.channel_limit(cell)))
        ck = float(self._base.chunk_size(func, a, p, nb, np.array([nc]))[0])
        steps_per_chunk = NCCL_STEPS // 2 if (a == RING and p == SIMPLE) else 1
        rtt_us = safety * 2.0 * (max(0.0, self.topology.inter.latency_us) + fit.dlat_us)
        if rtt_us <= 0 or ck <= 0:
            return 0.0
        n = self.nranks
        w = busbw_factor(func, n)            # bytes each rank moves per byte of message
        win_bytes_per_us = nc * NCCL_STEPS * (ck / steps_per_chunk) / rtt_us
        return w * float(nbytes) / win_bytes_per_us

    # ---- channels ----------------------------------------------------------------------------------
    def default_channels(self, func: str, nbytes: int, cell: Cell) -> int:
        a, p = ALGOS.index(cell[0]), PROTOS.index(cell[1])
        nc, _ = self._base.algo_info(a, p, np.array([int(nbytes)]))
        return int(nc[0])

    def default_chunk(self, func: str, nbytes: int, cell: Cell, n_channels: int = 0) -> int:
        """NCCL's chunk size (bytes) for ``cell`` at ``n_channels`` (0 = NCCL's count), its ``calcCollChunking``."""
        a, p = ALGOS.index(cell[0]), PROTOS.index(cell[1])
        nc = n_channels if n_channels > 0 else self.default_channels(func, nbytes, cell)
        return int(self._base.chunk_size(func, a, p, np.array([int(nbytes)]), np.array([max(1, nc)]))[0])

    def channel_limit(self, cell: Cell) -> int:
        """The budget NCCL clamps a tuner's channel count to (``comm->nChannels``, NVLS: its channel count)."""
        a = ALGOS.index(cell[0])
        if a in (NVLS, NVLS_TREE):
            return max(1, min(self._graph.nvls_channels, self._base.comm_channels) if self.nnodes > 1
                       else self._graph.nvls_channels)
        return self._base.comm_channels

    # ---- refit ---------------------------------------------------------------------------------------
    def refit(self, kind: str, func: str, nbytes: int, cell: Cell, ratio: float) -> Fit:
        """The fit under which the model's time for ``cell`` is ``ratio`` x its unrefitted time.

        ``kind`` picks the parameter (``latency`` → ``dlat_us``; ``bandwidth`` → ``beta``); anything else, a
        single-node communicator, a ratio that is not finite, or a cell the model cannot price → no refit.
        """
        if self.nnodes < 2 or not (math.isfinite(ratio) and ratio > 0):
            return NO_FIT
        t0 = self.predict(func, nbytes, cell)
        if not math.isfinite(t0) or t0 <= 0:
            return NO_FIT
        target = t0 * ratio
        if kind == "latency":
            # the model is affine in latencyInter: two evaluations give the slope
            t1 = self.predict(func, nbytes, cell, Fit(dlat_us=10.0))
            slope = (t1 - t0) / 10.0
            if slope <= 0:
                return NO_FIT
            lo = -self._graph.latency_inter
            return Fit(dlat_us=max(lo, min(5000.0, (target - t0) / slope)))
        if kind == "bandwidth":
            lo, hi = math.log(1 / 64), math.log(4.0)
            f = lambda lb: self.predict(func, nbytes, cell, Fit(beta=math.exp(lb))) - target  # noqa: E731
            if f(lo) < 0:
                return Fit(beta=math.exp(lo))
            if f(hi) > 0:
                return Fit(beta=math.exp(hi))
            for _ in range(40):
                mid = 0.5 * (lo + hi)
                if f(mid) > 0:
                    lo = mid
                else:
                    hi = mid
            return Fit(beta=math.exp(0.5 * (lo + hi)))
        return NO_FIT
