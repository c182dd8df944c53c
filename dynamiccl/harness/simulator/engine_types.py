"""The simulator engine's record and hook types: the emulator's op layout, the tuner hook protocol, a decision,
a communicator init and one step's records (:mod:`dynamiccl.harness.simulator.engine` re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from dynamiccl.harness.simulator.workload import Comm

#: 2026-01-01T00:00:00Z: simulated GPU clocks start here unless told otherwise (fast mode, tests).
DEFAULT_EPOCH_NS = 1_767_225_600 * 10**9

# Mirrors emu_coll_t in dynamiccl/nccl_profiler_plugin/emulator/nccl_emu.h (64 bytes); the emulator's own ctypes
# module defines the same dtype, checked equal in tests/simulator/test_driver.py.
EMU_OP_DTYPE = np.dtype([
    ("func", "<i4"), ("datatype", "<i4"), ("algo", "<i4"), ("proto", "<i4"),
    ("n_channels", "<i4"), ("n_warps", "<i4"), ("root", "<i4"), ("flags", "<u4"),
    ("count", "<u8"), ("seq_number", "<u8"), ("gpu_start_ns", "<u8"), ("gpu_end_ns", "<u8"),
])
EMU_F_CROSS_NODE = 0x8


@runtime_checkable
class Tuner(Protocol):
    """The tuner hook, shaped like NCCL's ``getCollInfo``: receives the ``float[7][3]`` cost table (µs, −1 =
    disabled) for one call and returns the table it wants NCCL to argmin over (possibly modified) plus a
    channel count (0 = let NCCL choose). Called per (comm, func, nBytes) once per step.

    Optional methods the engine uses when present: ``get_chunk_size(comm, func, nbytes, algo, proto,
    n_channels, chunk) -> chunk`` (v6 ``getChunkSize``; the result is clamped to NCCL's chunk, as NCCL clamps
    to its buffer) and ``on_step(step)`` (called at every step boundary, before the step's decisions).
    :mod:`dynamiccl.harness.simulator.engine_tuners` implements this protocol with the real plugin ``.so``."""

    def get_coll_info(self, comm: Comm, func: str, nbytes: int, cost_table: np.ndarray) -> tuple[np.ndarray, int]:
        ...


@dataclass(frozen=True)
class Decision:
    algo: int
    proto: int
    n_channels: int
    n_warps: int
    chunk: int


@dataclass(frozen=True)
class CommInit:
    """One (communicator, local rank) a node's worker initialises in the emulator (``key`` = its index)."""

    key: int
    comm_hash: int
    name: str
    nnodes: int
    nranks: int
    rank: int           # rank inside the communicator
    global_rank: int


@dataclass
class StepRecords:
    """One step's records, ordered by node, then (comm, rank) key, then schedule order.

    ``ops[node_bounds[n]:node_bounds[n+1]]`` belong to node ``n``; ``key`` indexes that node's
    :meth:`Engine.node_comms` list; ``rank`` is the global rank, ``comm`` the index into ``Workload.comms``.
    """

    step: int
    t_start_s: float
    t_end_s: float
    ops: np.ndarray
    rank: np.ndarray
    comm: np.ndarray
    key: np.ndarray
    node_bounds: np.ndarray

    def node(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.node_bounds[n]), int(self.node_bounds[n + 1])
        return self.ops[a:b], self.key[a:b]
