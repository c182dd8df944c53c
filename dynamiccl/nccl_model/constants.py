"""NCCL's tuning constants, enum indices and the cost table's result record (v2.30.7 ``src/graph/tuning.cc``), as listed in
``/work/shared/reference/nccl-cost-model.md`` §1 (section numbers below refer to that file). The cost model
(:mod:`dynamiccl.nccl_model.cost_model`) computes from them; they are kept apart so the model stays small.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamiccl.contracts.collectives import ALGOS, COST_FUNCS, PROTOS

# Enum order = ncclFunc_t / NCCL_ALGO_* / NCCL_PROTO_* (nccl-plugin-abi.md §2.2): the contracts' tables.
FUNCS = COST_FUNCS
TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT = range(7)
LL, LL128, SIMPLE = range(3)
NVLINK, PCI, NET = range(3)
BCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLREDUCE = range(5)

# ---- §1.1 default constants (ncclTunerConstantsDefaults) ----------------------------------------------
BASE_LAT = np.array([
    [6.8, 14.0, 8.4],   # Tree
    [6.6, 14.0, 8.4],   # Ring
    [0.0, 0.0, 0.0],    # CollNetDirect
    [0.0, 0.0, 0.0],    # CollNetChain
    [0.0, 0.0, 0.0],    # NVLS
    [0.0, 0.0, 0.0],    # NVLSTree
    [8.0, 8.0, 8.0],    # PAT
])
HW_LAT = np.array([
    [[.6, 1.25, 4.0], [.6, 1.9, 3.4], [0, 0, 3.7], [0, 0, 2.8], [0, 0, 25], [0, 0, 25], [0, 0, 4.0]],   # NVLINK
    [[1.0, 1.9, 4.0], [1.0, 2.5, 5.7], [0, 0, 3.7], [0, 0, 2.8], [0, 0, 0], [0, 0, 0], [0, 0, 4.0]],   # PCI
    [[5.0, 8.5, 14], [2.7, 4.0, 14.0], [0, 0, 31], [0, 0, 30], [0, 0, 18], [0, 0, 20.9], [0, 0, 14]],  # NET
])
# [compcap: Volta, Ampere, Hopper, Blackwell][scale: 1 node, 2 nodes, >2 nodes]
LL_MAX_BWS = np.array([[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [282, 90, 70]])
PER_CH_MAX_RING_LL128_BWS = np.array([[20, 20, 20], [20, 20, 20], [36.7, 36.7, 36.7], [40, 40, 40]])
PER_CH_MAX_TREE_LL128_BWS = np.array([[20, 20, 20], [20, 20, 20], [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]])
PER_CH_MAX_TREE_BWS = np.array([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]])
PER_CH_MAX_NVLS_TREE_BWS = np.array([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]])
NVLS_EFFICIENCY = np.array([0.0, 0.0, 0.85, 0.74])
# §1.5 treeCorrectionFactor[proto][log2(nBytes/64)]
TREE_CORRECTION = np.array([
    [1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0],
    [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9],
])

PCI_BW = 12.0                 # §1.2
MAXCHANNELS = 64
NCCL_STEPS = 8                # §1.8
BUFFSIZE = (512 * 1024, 4915200, 4 * 1024 * 1024)   # LL, LL128, Simple (§1.8)
NCCL_MAX_NTHREADS = 640
NCCL_MIN_NWARPS = 3
NVLS_CHUNKSIZE = 128 * 1024
# 1024 B / sizeof(ncclDevWorkColl) (§1.5). sizeof is not in the reference; 64 B assumed (only matters for
# numPipeOps > 1 on non-Ring algorithms).
MAX_DEV_WORK_BATCH_COLLS = 1024 // 64


def func_index(func: str | int) -> int:
    if isinstance(func, (int, np.integer)):
        if not 0 <= func < len(FUNCS):
            raise ValueError(f"func index {func} out of range")
        return int(func)
    for i, f in enumerate(FUNCS):
        if f.lower() == str(func).lower():
            return i
    raise ValueError(f"unknown func {func!r}; known: {FUNCS}")


def algo_index(algo: str | int) -> int:
    if isinstance(algo, (int, np.integer)):
        return int(algo)
    key = str(algo).upper().replace("NVLSTREE", "NVLS_TREE").replace("COLLNETDIRECT", "COLLNET_DIRECT")
    key = key.replace("COLLNETCHAIN", "COLLNET_CHAIN")
    if key not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; known: {ALGOS}")
    return ALGOS.index(key)


def proto_index(proto: str | int) -> int:
    if isinstance(proto, (int, np.integer)):
        return int(proto)
    key = str(proto).upper()
    if key not in PROTOS:
        raise ValueError(f"unknown protocol {proto!r}; known: {PROTOS}")
    return PROTOS.index(key)


def _nsteps(func: int, n: int) -> int:
    if func == ALLREDUCE:
        return 2 * (n - 1)
    if func in (ALLGATHER, REDUCESCATTER):
        return n - 1
    return n


@dataclass(frozen=True)
class CostResult:
    """Per-size output of :meth:`NcclModel.cost_table` (arrays of length ``len(nbytes)``)."""

    func: str
    nbytes: np.ndarray
    table: np.ndarray        # (n, 7, 3) float32 µs, -1 = disabled
    algo: np.ndarray         # NCCL's choice (argmin, ties -> first in algo-major order); -1 if none
    proto: np.ndarray
    n_channels: np.ndarray   # topoGetAlgoInfo's channel count for the chosen cell
    n_warps: np.ndarray
    chunk: np.ndarray        # calcCollChunking's chunk size (bytes) for the chosen cell

    def choice_names(self) -> list[str]:
        return [f"{ALGOS[a]}/{PROTOS[p]}" if a >= 0 else "none" for a, p in zip(self.algo, self.proto)]
