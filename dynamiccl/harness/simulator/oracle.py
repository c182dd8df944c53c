"""Best achievable configuration under the performance model, for a given network state.

Search space = what a tuner plugin can express (nccl-plugin-abi.md §2.3/§2.5): any cell NCCL left enabled
(cost ≥ 0 — never revive a −1), a channel budget from a small grid up to ``comm->nChannels`` (NVLS cells: up to
the NVLS channel count), and a chunk no larger than NCCL's default (``getChunkSize`` can only lower it). NCCL's
own default (cell, channels, chunk) is always one of the candidates, so the oracle is never worse than it.

>>> import numpy as np
>>> from dynamiccl.harness.simulator.topology import preset
>>> from dynamiccl.harness.simulator.perf_model import NetworkState
>>> best = best_configs(preset("h100-2x8"), "AllReduce", np.array([2**16, 2**30]))
>>> best.names()
['TREE/LL', 'NVLS_TREE/SIMPLE']
>>> bool(np.all(best.time_us <= best.default_time_us))
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamiccl.harness.simulator.cost_model import ALGOS, NVLS, NVLS_TREE, PROTOS, NcclModel, func_index
from dynamiccl.harness.simulator.perf_model import NetworkState, expected_time
from dynamiccl.harness.simulator.topology import Topology

__all__ = ["OracleResult", "best_configs", "SIZE_BUCKETS", "CHUNK_DIVISORS"]

#: Size buckets (bytes) the oracle reports on by default: powers of 4 from 1 KiB to 4 GiB.
SIZE_BUCKETS = np.array([4 ** k for k in range(5, 17)], dtype=np.int64)
#: Chunk candidates as divisors of NCCL's default chunk (a tuner may only shrink it).
CHUNK_DIVISORS = (1, 2, 4, 8)
MIN_CHUNK = 4096


@dataclass(frozen=True)
class OracleResult:
    func: str
    nbytes: np.ndarray
    algo: np.ndarray
    proto: np.ndarray
    n_channels: np.ndarray
    chunk: np.ndarray
    time_us: np.ndarray
    default_algo: np.ndarray
    default_proto: np.ndarray
    default_time_us: np.ndarray

    def names(self) -> list[str]:
        return [f"{ALGOS[a]}/{PROTOS[p]}" for a, p in zip(self.algo, self.proto)]

    def default_names(self) -> list[str]:
        return [f"{ALGOS[a]}/{PROTOS[p]}" for a, p in zip(self.default_algo, self.default_proto)]

    @property
    def speedup(self) -> np.ndarray:
        """NCCL default time / oracle time (≥ 1)."""
        return self.default_time_us / self.time_us


def _channel_grid(limit: int, default: np.ndarray) -> list[np.ndarray]:
    grid = [c for c in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64) if c <= limit]
    if limit not in grid:
        grid.append(limit)
    return [np.full(default.shape, c, dtype=np.int64) for c in grid] + [default]


def best_configs(topology: Topology, func: str | int, nbytes: np.ndarray | None = None,
                 state: NetworkState | None = None, *, model: NcclModel | None = None) -> OracleResult:
    """Best (algo, proto, channels, chunk) per size under ``state`` (noise-free expected times)."""
    f = func_index(func)
    nb = SIZE_BUCKETS if nbytes is None else np.asarray(nbytes, dtype=np.int64).reshape(-1)
    model = model or NcclModel(topology)
    res = model.cost_table(f, nb)
    d_time = np.full(nb.size, np.inf)
    for a, p in set(zip(res.algo.tolist(), res.proto.tolist())):
        m = (res.algo == a) & (res.proto == p)
        d_time[m] = expected_time(topology, f, nb[m], a, p, res.n_channels[m], res.chunk[m], state)
    best_t = d_time.copy()
    best = np.stack([res.algo, res.proto, res.n_channels, res.chunk], axis=1).astype(np.int64)
    for a in range(7):
        for p in range(3):
            enabled = res.table[:, a, p] >= 0
            if not enabled.any():
                continue
            d_ch, _ = model.algo_info(a, p, nb)
            limit = model.comm_channels
            if a in (NVLS, NVLS_TREE):
                limit = int(d_ch.max())
            for ch in _channel_grid(limit, d_ch):
                d_chunk = model.chunk_size(f, a, p, nb, ch)
                for div in CHUNK_DIVISORS:
                    ck = np.maximum(d_chunk // div, min(MIN_CHUNK, int(d_chunk.min())))
                    t = expected_time(topology, f, nb, a, p, ch, ck, state)
                    better = enabled & (t < best_t)
                    if better.any():
                        best_t[better] = t[better]
                        best[better] = np.stack([np.full(nb.size, a), np.full(nb.size, p), ch, ck],
                                                axis=1)[better]
    return OracleResult(res.func, nb, best[:, 0], best[:, 1], best[:, 2], best[:, 3], best_t,
                        res.algo, res.proto, d_time)
