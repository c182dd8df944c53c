"""State of the learned policy: static features of the decision plus a history sequence for the LSTM.

Static part (``N_STATIC``): collective kind (one-hot), log2 size bucket, communicator size (log2 ranks, log2
nodes), topology tier (intra-node / one rack / multi-rack; a rack = at most ``RACK_NODES`` nodes), parallelism
role from the communicator's name (TP/DP/PP/FSDP/unknown), the regime kind, the trigger's anomaly signals (CUSUM
score = |log measured change| of the incumbent — the statistic the detector's CUSUM accumulates; autoencoder
reconstruction error when the detector reports one in ``evidence``, else 0; congestion = 1 − measured
bandwidth share for bandwidth regimes), the last action (the incumbent's cell one-hot and log2 channels), and
NCCL's refitted model's prediction of every cell relative to the incumbent's cell (0 where masked), with the
cell mask. Sequence part: the last ``SEQ`` measurements of this target, each (log(mean / baseline mean),
noise, 1[config differs from the incumbent]): the rhythm the LSTM summarises (a one-off, a step, a flapping link).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dynamiccl.retuner.learned.actions import CELLS

__all__ = ["Decision", "encode", "N_STATIC", "N_SEQ_FEATS", "SEQ", "FUNCS", "KINDS", "ROLES", "RACK_NODES"]

FUNCS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce")
KINDS = ("start", "bandwidth", "latency", "other")
ROLES = ("tp", "dp", "pp", "fsdp", "unknown")
RACK_NODES = 8
SEQ = 12
N_SEQ_FEATS = 3
N_STATIC = len(FUNCS) + 3 + 3 + len(ROLES) + len(KINDS) + 3 + len(CELLS) + 1 + 2 * len(CELLS)


@dataclass(frozen=True)
class Decision:
    """What the policy is asked about: one target at one trigger."""
    func: str
    size_bucket: int
    nranks: int
    nnodes: int
    kind: str                          # start | bandwidth | latency | other
    inc_cell: tuple[str, str]
    inc_channels: int
    ratio: float                       # measured incumbent time now / before (1 at start-up)
    enabled: frozenset                 # cells NCCL enabled
    model_rel: dict                    # cell -> refitted model time / model time of the incumbent's cell
    history: tuple = ()                # ((log ratio to baseline, noise, config differs), ...) oldest first
    comm_name: str = ""
    ae_error: float = 0.0


def _onehot(v, table) -> list[float]:
    return [1.0 if v == x else 0.0 for x in table]


def _role(name: str) -> str:
    toks = name.lower().replace("-", "_").split("_")
    return next((r for r in ROLES[:-1] if r in toks), "unknown")


def encode(d: Decision) -> tuple[np.ndarray, np.ndarray]:
    """(static features [N_STATIC], sequence [SEQ, N_SEQ_FEATS]) as float32; the sequence is left-padded."""
    tier = (1.0, 0.0, 0.0) if d.nnodes <= 1 else ((0.0, 1.0, 0.0) if d.nnodes <= RACK_NODES else (0.0, 0.0, 1.0))
    lr = math.log(max(d.ratio, 1e-6))
    cong = max(0.0, 1.0 - 1.0 / d.ratio) if d.kind == "bandwidth" and d.ratio > 1 else 0.0
    rel = [math.log(max(d.model_rel.get(c, 1.0), 1e-6)) if c in d.enabled else 0.0 for c in CELLS]
    x = (_onehot(d.func, FUNCS) + [d.size_bucket / 32.0, math.log2(max(d.nranks, 1)) / 8.0,
                                   math.log2(max(d.nnodes, 1)) / 6.0]
         + list(tier) + _onehot(_role(d.comm_name), ROLES) + _onehot(d.kind if d.kind in KINDS else "other", KINDS)
         + [abs(lr), min(d.ae_error, 10.0), cong] + _onehot(d.inc_cell, CELLS)
         + [math.log2(max(d.inc_channels, 1)) / 6.0] + [float(np.clip(r, -3, 3)) for r in rel]
         + [1.0 if c in d.enabled else 0.0 for c in CELLS])
    seq = np.zeros((SEQ, N_SEQ_FEATS), np.float32)
    h = list(d.history)[-SEQ:]
    if h:
        seq[SEQ - len(h):] = np.clip(np.asarray(h, np.float32), -5, 5)
    return np.asarray(x, np.float32), seq
