"""The action grid of the learned policy.

An action is (algorithm, protocol, channel choice, chunk choice). The design's fourth component, numThreads, is
not settable through NCCL's tuner ABI; its place is taken by chunk size, which the ABI (v6+) sets through
``getChunkSize`` and the tuner file's chunk field carries.
Channel choices are NCCL's own count, half of it and twice it (clamped to NCCL's channel budget).
Chunk choices (:data:`CK_FACTORS_ON`) are NCCL's own chunk for that cell and channel count, half of it and a
quarter of it, rounded down to the protocol's grain. Nothing above NCCL's chunk: NCCL clamps a tuner's chunk to its
per-step buffer, so a larger one would run as NCCL's and only duplicate that action. A choice below one grain is
masked like a disabled cell. The grid a policy uses follows from its weights file (63 or 189 actions); the shipped
file keeps NCCL's chunk (:data:`GRID`, one chunk choice).
The mask keeps only cells NCCL enabled for this communicator and size (a −1 cell is never an action).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamiccl.nccl_model.cost_model import ALGOS, PROTOS
from dynamiccl.retuner.types import CHUNK_GRAIN

__all__ = ["CELLS", "CH_FACTORS", "CK_FACTORS_ON", "N_ACTIONS", "Grid", "GRID", "GRID_CHUNK", "grid_for",
           "action_of", "cell_mask", "action_mask", "chunk_of"]

CELLS = tuple((a, p) for a in ALGOS for p in PROTOS)      # 7 x 3, NCCL's enum order
CH_FACTORS = (0.0, 0.5, 2.0)                              # 0 = NCCL's channel count
CK_FACTORS_ON = (1.0, 0.5, 0.25)                          # 1 = NCCL's chunk (written as 0)


@dataclass(frozen=True)
class Grid:
    """Actions = cells x channel choices x chunk choices, cell-major (index = (cell, ch, ck) row-major)."""

    ch_factors: tuple[float, ...] = CH_FACTORS
    ck_factors: tuple[float, ...] = (1.0,)

    @property
    def per_cell(self) -> int:
        return len(self.ch_factors) * len(self.ck_factors)

    @property
    def n(self) -> int:
        return len(CELLS) * self.per_cell

    def action_of(self, i: int) -> tuple[tuple[str, str], float, float]:
        """Action index -> ((algo, proto), channel factor, chunk factor)."""
        c, r = divmod(i, self.per_cell)
        return CELLS[c], self.ch_factors[r // len(self.ck_factors)], self.ck_factors[r % len(self.ck_factors)]

    def index(self, cell: tuple[str, str], ch: float = 0.0, ck: float = 1.0) -> int:
        return (CELLS.index(cell) * self.per_cell + self.ch_factors.index(ch) * len(self.ck_factors)
                + self.ck_factors.index(ck))

    def action_mask(self, enabled: set[tuple[str, str]]) -> np.ndarray:
        return np.repeat(cell_mask(enabled), self.per_cell)


GRID = Grid()
GRID_CHUNK = Grid(CH_FACTORS, CK_FACTORS_ON)
N_ACTIONS = GRID.n


def grid_for(n_actions: int) -> Grid:
    """The grid of a weights file with ``n_actions`` outputs (``ValueError`` if none has that many)."""
    for g in (GRID, GRID_CHUNK):
        if g.n == n_actions:
            return g
    raise ValueError(f"learned policy weights: {n_actions} actions, expected {GRID.n} or {GRID_CHUNK.n} "
                     f"(with chunk choices)")


def chunk_of(proto: str, nccl_chunk: float, factor: float) -> int | None:
    """Chunk bytes to write for ``factor`` x NCCL's chunk: 0 for NCCL's own, a whole number of grains for a smaller
    one, None (masked) when that is below one grain."""
    if factor == 1.0:
        return 0
    g = CHUNK_GRAIN[proto]
    c = int(nccl_chunk * factor) // g * g
    return c if c >= g else None


def action_of(i: int) -> tuple[tuple[str, str], float]:
    """Action index of the shipped grid -> ((algo, proto), channel factor)."""
    cell, ch, _ = GRID.action_of(i)
    return cell, ch


def cell_mask(enabled: set[tuple[str, str]]) -> np.ndarray:
    return np.array([c in enabled for c in CELLS], dtype=bool)


def action_mask(enabled: set[tuple[str, str]]) -> np.ndarray:
    return GRID.action_mask(enabled)
