"""The action grid of the learned policy.

An action is (algorithm, protocol, channel choice). The design's fourth component, numThreads, is not
settable through NCCL's tuner ABI; its place is taken by chunk size, which the ABI (v6+) sets but the
retuner's candidates do not carry yet, so every action keeps NCCL's chunk size (chunk 0) in this version.
Channel choices are NCCL's own count, half of it and twice it (clamped to NCCL's channel budget).
The mask keeps only cells NCCL enabled for this communicator and size (a −1 cell is never an action).
"""
from __future__ import annotations

import numpy as np

from dynamiccl.nccl_model.cost_model import ALGOS, PROTOS

__all__ = ["CELLS", "CH_FACTORS", "N_ACTIONS", "action_of", "cell_mask", "action_mask"]

CELLS = tuple((a, p) for a in ALGOS for p in PROTOS)      # 7 x 3, NCCL's enum order
CH_FACTORS = (0.0, 0.5, 2.0)                              # 0 = NCCL's channel count
N_ACTIONS = len(CELLS) * len(CH_FACTORS)


def action_of(i: int) -> tuple[tuple[str, str], float]:
    """Action index -> ((algo, proto), channel factor)."""
    return CELLS[i // len(CH_FACTORS)], CH_FACTORS[i % len(CH_FACTORS)]


def cell_mask(enabled: set[tuple[str, str]]) -> np.ndarray:
    return np.array([c in enabled for c in CELLS], dtype=bool)


def action_mask(enabled: set[tuple[str, str]]) -> np.ndarray:
    return np.repeat(cell_mask(enabled), len(CH_FACTORS))
