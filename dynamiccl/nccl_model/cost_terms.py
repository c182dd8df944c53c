"""The per-(func, algorithm, protocol) terms of NCCL's cost model that `NcclModel` fills once at
communicator init: bus bandwidth (``/work/shared/reference/nccl-cost-model.md`` §1.3) and latency
(§1.4), as ``ncclTopoTuneModel`` computes them."""
from __future__ import annotations

from typing import Any

from dynamiccl.nccl_model.constants import (
    ALLGATHER, ALLREDUCE, BASE_LAT, BCAST, COLLNET_CHAIN, COLLNET_DIRECT, HW_LAT, LL, LL128, NET, NVLINK, NVLS,
    NVLS_EFFICIENCY, NVLS_TREE, PAT, PCI, PER_CH_MAX_NVLS_TREE_BWS, PER_CH_MAX_RING_LL128_BWS, PER_CH_MAX_TREE_BWS,
    PER_CH_MAX_TREE_LL128_BWS, REDUCE, REDUCESCATTER, RING, SIMPLE, TREE, _nsteps,
)
from dynamiccl.nccl_model.topology import Topology, log2i

__all__ = ["CostTerms"]


class CostTerms:
    """Mixin of `dynamiccl.nccl_model.cost_model.NcclModel` (its topology, graph and counts)."""

    topology: Topology
    _graph: Any
    _n: int          # ranks
    _nodes: int
    _ppn: int        # ranks per node
    _cc: int         # compute-capability index of the per-channel tables
    _idx2: int       # 1 node, 2 nodes, more: the per-channel tables' column

    def _llmax(self) -> float:
        raise NotImplementedError

    def _bus_bw(self, f: int, a: int, p: int) -> float:
        """§1.3: the graph's channels x per-channel bandwidth, capped per (algorithm, protocol), times
        the algorithm's bus ratio."""
        t, g = self.topology, self._graph
        n, nodes, ppn, cc, i2 = self._n, self._nodes, self._ppn, self._cc, self._idx2
        llmax = self._llmax()
        if a in (NVLS, NVLS_TREE):
            nch, bw_intra, bw_inter = g.nvls_channels, g.nvls_bw_intra, g.nvls_bw_inter
        else:
            nch, bw_intra, bw_inter = g.n_channels, g.bw_intra, g.bw_inter
        collnet = a in (COLLNET_DIRECT, COLLNET_CHAIN)
        bw = bw_intra if (nodes <= 2 or collnet) else bw_inter
        bus = nch * bw
        if a == RING and p == LL:
            bus = min(llmax, 0.5 * bus)
        if a == RING and p == LL128:
            bus = min(0.92 * bus, nch * PER_CH_MAX_RING_LL128_BWS[cc][i2])
        if a == TREE and f == ALLREDUCE:
            bus = min(0.92 * bus, nch * PER_CH_MAX_TREE_BWS[cc][i2])
        if a == TREE and p == LL:
            bus = min(bus / 3.8, llmax)
        if a == TREE and p == LL128:
            bus = min(bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0),
                      nch * PER_CH_MAX_TREE_LL128_BWS[cc][i2])
        if a == TREE and not g.tree_pattern_balanced:
            bus *= 0.85
        if a == PAT:
            bus *= 0.75
        if a == COLLNET_DIRECT:
            if f in (ALLGATHER, REDUCESCATTER):
                bus = ppn * min(bw_intra, 0.9 * bw_inter)
            else:
                fac = ppn / nch
                fac -= (fac - 1) / 2
                bus /= fac
                if t.sm >= 90:
                    bus *= 0.85
        if a in (NVLS, NVLS_TREE):
            intra_bw = bw_intra * NVLS_EFFICIENCY[cc] * (nch - 1) / nch
            intra_bw *= 2 if f == ALLREDUCE else (ppn - 1) / ppn
            inter_bw = bw_inter * (2 if (a == NVLS_TREE and nodes <= 2) else 1)
            b = min(intra_bw, inter_bw)
            if a == NVLS_TREE:
                b = min(b, PER_CH_MAX_NVLS_TREE_BWS[cc][i2])
            bus = nch * b
        if not (a != RING and f in (ALLGATHER, REDUCESCATTER)):
            ratio = n / _nsteps(f, n) if a in (RING, NVLS, NVLS_TREE) else 0.5
            bus *= ratio
        return bus

    def _latency(self, f: int, a: int, p: int) -> float:
        """§1.4: the base latency plus the algorithm's intra- and inter-node hops."""
        t, g = self.topology, self._graph
        n, nodes, ppn = self._n, self._nodes, self._ppn
        intra_hw = NVLINK if t.intra.kind == "nvlink" else PCI
        lat = BASE_LAT[a][p]
        intra_lat = HW_LAT[intra_hw][a][p]
        inter_lat = (HW_LAT[NET][TREE][p] if ppn == 1 else HW_LAT[NET][a][p]) + g.latency_inter
        if p == SIMPLE:
            inter_lat += g.latency_inter
        if a == RING:
            return lat + self._ring_hops(f, p, intra_hw, intra_lat, inter_lat)
        if a == TREE:
            return lat + 2 * ((ppn - 1) * intra_lat + log2i(nodes) * inter_lat)
        if a == COLLNET_DIRECT:
            return lat + 2 * (min(1, ppn - 1) * intra_lat + (ppn - 1) * 0.4) + inter_lat
        if a == COLLNET_CHAIN:
            return lat + 2 * (ppn - 1) * intra_lat + inter_lat
        if a == NVLS:
            return intra_lat + (inter_lat if nodes > 1 else 0.0)
        if a == NVLS_TREE:
            return lat + intra_lat + 2 * log2i(nodes) * inter_lat
        if a == PAT:
            return lat + log2i(nodes) * (inter_lat / 3.5) + n * 2.8
        return lat

    def _ring_hops(self, f: int, p: int, intra_hw: int, intra_lat: float, inter_lat: float) -> float:
        """A ring's steps: Broadcast/Reduce one hop per step of the chain (one in all when every channel
        runs the same ring); the others' steps inside a node paced by the proxy's network overhead on
        multi-node rings, and their network crossings."""
        n, nodes = self._n, self._nodes
        nsteps = _nsteps(f, n)
        hw = intra_hw if nodes == 1 else NET
        if f in (BCAST, REDUCE):
            if self._graph.same_channels:
                return HW_LAT[hw][RING][p]
            L = HW_LAT[hw][TREE][p] if p == SIMPLE else HW_LAT[hw][RING][p]
            return nsteps * L
        net_ovh = 0.0 if nodes == 1 else (2.0 if self.topology.cpu_vendor == "amd" else 1.0)
        if p == SIMPLE:
            net_ovh *= 3
        il = max(intra_lat, net_ovh)
        n_inter = 0 if nodes == 1 else (2 * (nodes - 1) if f == ALLREDUCE else nodes - 1)
        return (nsteps - n_inter) * il + n_inter * inter_lat
