"""NCCL's built-in cost model (v2.30.7 ``src/graph/tuning.cc`` / ``src/enqueue.cc``), as described in
``/work/shared/reference/nccl-cost-model.md`` §1 (section numbers below refer to that file).

:class:`NcclModel` does what ``ncclTopoTuneModel`` does once at communicator init (bandwidth and latency per
(func, algo, proto)); :meth:`NcclModel.cost_table` then does what ``updateCollCostTable`` /
``ncclTopoGetAlgoTime`` do per call, vectorised over an array of message sizes, and returns the
``float[7][3]`` table in µs a tuner plugin receives (−1 = ``NCCL_ALGO_PROTO_IGNORE``), NCCL's argmin choice,
its channel/warp count (§1.7) and its chunk size (§1.8).

>>> import numpy as np
>>> from dynamiccl.nccl_model.topology import preset
>>> m = NcclModel(preset("h100-1x8"), exclude_algos=("NVLS",))   # reference §2 (a): NVLS excluded
>>> r = m.cost_table("AllReduce", np.array([2**20, 2**22, 2**26]))
>>> [f"{ALGOS[a]}/{PROTOS[p]}" for a, p in zip(r.algo, r.proto)]
['RING/LL', 'RING/LL128', 'RING/SIMPLE']
>>> round(float(m.latency("AllReduce", "RING", "SIMPLE")), 1), round(float(m.bandwidth("AllReduce", "RING", "SIMPLE")), 1)
(56.0, 205.7)
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from dynamiccl.contracts.collectives import ALGOS, PROTOS
from dynamiccl.nccl_model.cost_terms import CostTerms
from dynamiccl.nccl_model.topology import Topology, log2i

__all__ = [
    "ALGOS", "PROTOS", "FUNCS", "BASE_LAT", "HW_LAT", "LL_MAX_BWS", "PER_CH_MAX_RING_LL128_BWS",
    "PER_CH_MAX_TREE_LL128_BWS", "PER_CH_MAX_TREE_BWS", "PER_CH_MAX_NVLS_TREE_BWS", "NVLS_EFFICIENCY",
    "TREE_CORRECTION", "NcclModel", "CostResult", "algo_index", "proto_index", "func_index",
]

from dynamiccl.nccl_model.constants import (
    ALLGATHER, ALLREDUCE, BASE_LAT, BCAST, BUFFSIZE, COLLNET_CHAIN, COLLNET_DIRECT, FUNCS, HW_LAT, LL, LL128,
    LL_MAX_BWS, MAX_DEV_WORK_BATCH_COLLS, MAXCHANNELS, NCCL_MAX_NTHREADS, NCCL_MIN_NWARPS, NCCL_STEPS, NVLS, NVLS_CHUNKSIZE, NVLS_EFFICIENCY, NVLS_TREE, PAT, PCI_BW, PER_CH_MAX_NVLS_TREE_BWS,
    PER_CH_MAX_RING_LL128_BWS, PER_CH_MAX_TREE_BWS, PER_CH_MAX_TREE_LL128_BWS, REDUCE, REDUCESCATTER, RING,
    SIMPLE, TREE, TREE_CORRECTION, CostResult, algo_index, func_index, proto_index,
)


class NcclModel(CostTerms):
    """NCCL's model for one communicator (built once, like ``ncclTopoTuneModel``).

    Parameters mirror NCCL_ALGO / NCCL_PROTO exclusion (excluded cells get bandwidth 0 -> cost −1, §1.6).
    ``exclude_algos``/``exclude_protos`` take names from :data:`ALGOS` / :data:`PROTOS`.
    """

    def __init__(self, topology: Topology, *, exclude_algos: Sequence[str] = (),
                 exclude_protos: Sequence[str] = ()) -> None:
        self.topology = topology
        self.exclude_algos = tuple(exclude_algos)
        self.exclude_protos = tuple(exclude_protos)
        t = topology.validate()
        g = t.graph_params()
        self._graph = g
        self._n = t.n_ranks
        self._nodes = t.n_nodes
        self._ppn = t.gpus_per_node
        self._cc = t.compcap_index
        self._idx2 = 0 if t.n_nodes == 1 else (1 if t.n_nodes == 2 else 2)
        self._comm_channels = self._connect_channels(t, g)
        self._nvls_support = bool(t.intra.nvls and t.sm >= 90 and t.gpus_per_node > 1
                                  and g.nvls_channels >= 2)
        self._bw = np.zeros((5, 7, 3))
        self._lat = np.zeros((5, 7, 3))
        for f in range(5):
            if self._n > 1:
                self._fill(f)
        ex_a = [algo_index(a) for a in self.exclude_algos]
        ex_p = [proto_index(p) for p in self.exclude_protos]
        self._bw[:, ex_a, :] = 0.0
        self._bw[:, :, ex_p] = 0.0
        self._max_threads, self._thresholds = self._threads()

    # ------------------------------------------------------------------------------------------------
    @staticmethod
    def _connect_channels(t: Topology, g) -> int:
        """``comm->nChannels``: 2 x search channels at connect time; SM90 multi-node ring with
        bwIntra > 45 and < 16 channels doubles again (§1.2). A graph may pin ``comm_channels``."""
        if g.comm_channels is not None:
            return g.comm_channels
        nc = min(MAXCHANNELS, 2 * g.n_channels)
        if t.sm >= 90 and t.n_nodes > 1 and g.bw_intra > 45 and g.n_channels < 16:
            nc = min(MAXCHANNELS, 2 * nc)
        return nc

    @property
    def comm_channels(self) -> int:
        return self._comm_channels

    def _llmax(self) -> float:
        t = self.topology
        if t.n_nodes == 1:
            return float(LL_MAX_BWS[self._cc][0])
        cpu = 1 if t.cpu_vendor == "amd" else 0   # §1.1: multi-node row = CPU vendor
        return float(LL_MAX_BWS[cpu][self._idx2])

    def _algo_enabled(self, f: int, a: int, p: int) -> bool:
        """Validity + default enable rules (§1.3 "Valid (coll, algo)", §1.6)."""
        t = self.topology
        if self._n == 1:
            return a == RING and p == SIMPLE
        if f in (BCAST, REDUCE) and a != RING:
            return False
        if f in (ALLGATHER, REDUCESCATTER) and a not in (RING, PAT, NVLS, COLLNET_DIRECT):
            return False
        if f == ALLREDUCE and a == PAT:
            return False
        if a in (NVLS, NVLS_TREE, PAT) and p != SIMPLE:
            return False
        if a in (COLLNET_DIRECT, COLLNET_CHAIN):
            if not t.collnet_enable or p != SIMPLE:
                return False
            if a == COLLNET_DIRECT and not t.intra.nvswitch:
                return False
        if a == NVLS:
            if not self._nvls_support:
                return False
            if t.n_nodes > 1 and not t.collnet_enable:
                return False
            if t.n_nodes > 1 and f != ALLREDUCE:
                return False   # multi-node NVLS AG/RS need collnet iallgather support (§1.3); not modelled
            if f != ALLREDUCE and t.gpus_per_node > 32:
                return False
        if a == NVLS_TREE and (not self._nvls_support or t.n_nodes == 1):
            return False
        if a == PAT and not (t.gpus_per_node == 1 and t.sm >= 60):
            return False
        if p == LL128 and not self._ll128_enabled():
            return False
        return True

    def _ll128_enabled(self) -> bool:
        t = self.topology
        if t.sm < 70:
            return False
        if t.intra.kind != "nvlink" and t.gpus_per_node > 1:   # typeIntra <= PATH_NVB
            return False
        if t.n_nodes > 1 and not t.inter.gpu_nic_local:       # typeInter <= PATH_PXN / PXB
            return False
        return True

    def _fill(self, f: int) -> None:
        """Bus bandwidth (§1.3) and latency (§1.4) of every enabled (algorithm, protocol) of ``f``."""
        for a in range(7):
            for p in range(3):
                if self._algo_enabled(f, a, p):
                    self._bw[f, a, p] = self._bus_bw(f, a, p)
                    self._lat[f, a, p] = self._latency(f, a, p)

    def _threads(self) -> tuple[np.ndarray, np.ndarray]:
        """``maxThreads`` and ``threadThresholds`` per (algo, proto) with no NCCL_*NTHREADS set (§1.7)."""
        g = self._graph
        mt = np.zeros((7, 3), dtype=np.int64)
        mt[:, LL] = 512
        mt[:, LL128] = 640
        mt[RING, SIMPLE] = 256 if g.bw_intra * g.n_channels <= PCI_BW else 512
        mt[TREE, SIMPLE] = 512
        mt[PAT, SIMPLE] = 512
        mt[[COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE], SIMPLE] = 640
        th = np.zeros((7, 3), dtype=np.int64)
        th[:, LL] = 8
        th[:, LL128] = 8
        th[:, SIMPLE] = 64
        th[RING, LL] *= self._n
        th[[COLLNET_DIRECT, COLLNET_CHAIN], SIMPLE] = 512
        return mt, th

    # ------------------------------------------------------------------------------------------------
    def bandwidth(self, func: str | int, algo: str | int, proto: str | int) -> float:
        """Model algorithm bandwidth in GB/s (0 = disabled), before the size-dependent tree correction."""
        return float(self._bw[func_index(func), algo_index(algo), proto_index(proto)])

    def latency(self, func: str | int, algo: str | int, proto: str | int) -> float:
        """Model latency in µs, before the ring plateau factor."""
        return float(self._lat[func_index(func), algo_index(algo), proto_index(proto)])

    def times(self, func: str | int, nbytes: Iterable[int] | np.ndarray, *, num_pipe_ops: int = 1) -> np.ndarray:
        """``ncclTopoGetAlgoTime`` for every cell: array (n, 7, 3) of µs, −1 where disabled (§1.5)."""
        f = func_index(func)
        nb = np.asarray(nbytes, dtype=np.int64).reshape(-1)
        t = self.topology
        out = np.full((nb.size, 7, 3), -1.0)
        if self._n == 1:
            out[:, RING, SIMPLE] = 0.0
            return out
        shifted = nb >> 6
        log_size = np.where(shifted > 0, np.floor(np.log2(np.maximum(shifted, 1))).astype(np.int64), -1)
        x86 = t.cpu_vendor in ("intel", "amd")
        for a in range(7):
            for p in range(3):
                bw = self._bw[f, a, p]
                if bw == 0:
                    continue
                bwv = np.full(nb.size, bw)
                lat = np.full(nb.size, self._lat[f, a, p])
                corr_ok = (a == TREE and f == ALLREDUCE) | (
                    a == NVLS_TREE and f == ALLREDUCE and t.sm >= 100 and x86)
                if corr_ok:
                    hi = 23 if a == TREE else 24
                    m = (log_size >= 0) & (log_size < hi)
                    bwv[m] *= TREE_CORRECTION[p][log_size[m]]
                if a == RING and p == SIMPLE and self._nodes > 1 and f == ALLREDUCE:
                    m = nb / (self._comm_channels * self._n) >= 64
                    lat[m] *= 1.9 if t.sm < 80 else 1.4
                lat_count = num_pipe_ops if a == RING else math.ceil(num_pipe_ops / MAX_DEV_WORK_BATCH_COLLS)
                out[:, a, p] = lat * lat_count + nb / (1000.0 * bwv)
        return out

    def algo_info(self, algo: int, proto: int, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Channels and warps NCCL uses for a cell (``topoGetAlgoInfo``, §1.7); vectorised over sizes."""
        nb = np.asarray(nbytes, dtype=np.int64).reshape(-1)
        nt0 = int(self._max_threads[algo, proto])
        thr = int(self._thresholds[algo, proto])
        if algo in (NVLS, NVLS_TREE):
            nc0 = self._graph.nvls_channels
            if self._nodes > 1:
                nc0 = min(nc0, self._comm_channels)
            nc = np.full(nb.size, nc0, dtype=np.int64)
        elif algo == COLLNET_DIRECT:
            nc = np.full(nb.size, self._comm_channels, dtype=np.int64)  # ncSwitch loop not modelled
        else:
            nc = np.clip(nb // (nt0 * thr), 1, self._comm_channels).astype(np.int64)
        nt = np.full(nb.size, nt0, dtype=np.int64)
        if algo not in (NVLS, NVLS_TREE, COLLNET_DIRECT):
            for _ in range(8):
                m = (nb < nc * nt * thr) & (nt % 128 == 0)
                if not m.any():
                    break
                nt[m] //= 2
        if proto == SIMPLE:
            if algo == RING:
                nt += 32
            elif algo == TREE:
                nt += 128
        nt = np.maximum(nt, NCCL_MIN_NWARPS * 32)
        if algo in (TREE, PAT):
            nt[:] = NCCL_MAX_NTHREADS
        return nc, nt // 32

    def chunk_size(self, func: str | int, algo: int, proto: int, nbytes: np.ndarray,
                   n_channels: np.ndarray) -> np.ndarray:
        """Default chunk size in bytes (§1.8 ``calcCollChunking``), vectorised over sizes.

        The NVLS / NVLSTree / Tree-LL128 shrink loops are reconstructed from the v2.30 code shape the
        reference summarises (thresholds 128K/64K/32K/16K); PAT's own shrink rule is not modelled.
        """
        f = func_index(func)
        nb = np.asarray(nbytes, dtype=np.float64).reshape(-1)
        nch = np.asarray(n_channels, dtype=np.float64).reshape(-1) * np.ones(nb.size)
        step = BUFFSIZE[proto] // NCCL_STEPS
        chunk_steps = NCCL_STEPS // 2 if (algo == RING and proto == SIMPLE and f in
                                          (ALLREDUCE, ALLGATHER, REDUCESCATTER)) else 1
        c = step * chunk_steps
        if proto == LL:
            c //= 2
        elif proto == LL128:
            c = c * 15 // 16
        chunk = np.full(nb.size, float(c))
        if algo == NVLS:
            mx = NVLS_CHUNKSIZE
            if self._nodes > 1 and self._bw[ALLREDUCE, NVLS, SIMPLE] < 150:
                mx = 32768
            chunk = np.minimum(chunk, mx)
            ops = nch * self._ppn
            for k, lim in ((64, 65536), (8, 32768), (2, 16384)):
                chunk = np.where((nb < k * ops * chunk) & (chunk > lim), lim, chunk)
        elif algo == NVLS_TREE:
            chunk[:] = NVLS_CHUNKSIZE
            if self._nodes >= 4:
                chunk = np.minimum(chunk, 65536)
            ops = nch * self._ppn
            for k, lim in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
                chunk = np.where((nb < k * ops * chunk) & (chunk > lim), lim, chunk)
        elif algo == TREE and proto == LL128:
            ppn = self._ppn
            steps = 1 + log2i(self._nodes) + 0.1 * ppn
            for k, lim in ((64, 131072), (16, 32768)):
                for _ in range(8):
                    m = (nb / (nch * chunk) < steps * k / ppn) & (chunk > lim)
                    if not m.any():
                        break
                    chunk[m] /= 2
        return chunk.astype(np.int64)

    def cost_table(self, func: str | int, nbytes: Iterable[int] | np.ndarray, *,
                   num_pipe_ops: int = 1) -> CostResult:
        """Cost table + NCCL's default choice, channels, warps and chunk for each size."""
        f = func_index(func)
        nb = np.asarray(nbytes, dtype=np.int64).reshape(-1)
        table = self.times(f, nb, num_pipe_ops=num_pipe_ops)
        flat = table.reshape(nb.size, 21)
        masked = np.where(flat >= 0, flat, np.inf)
        best = np.argmin(masked, axis=1)             # first minimum = algo-major tie break (§1.5)
        none = ~np.isfinite(masked[np.arange(nb.size), best])
        algo = np.where(none, -1, best // 3)
        proto = np.where(none, -1, best % 3)
        nch = np.zeros(nb.size, dtype=np.int64)
        nwarps = np.zeros(nb.size, dtype=np.int64)
        chunk = np.zeros(nb.size, dtype=np.int64)
        for a, p in set(zip(algo.tolist(), proto.tolist())):
            if a < 0:
                continue
            m = (algo == a) & (proto == p)
            c, w = self.algo_info(a, p, nb[m])
            nch[m], nwarps[m] = c, w
            chunk[m] = self.chunk_size(f, a, p, nb[m], c)
        return CostResult(FUNCS[f], nb, table.astype(np.float32), algo, proto, nch, nwarps, chunk)
