"""Inference of the learned policy in numpy (the service never imports torch): LSTM over the history, an MLP over
[static state, LSTM summary] -> per action the predicted log(time / incumbent's time now); action values are the
design's reward (:mod:`.reward`) of those predictions. Runs in the retuner service, never on NCCL's threads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynamiccl.retuner.learned.actions import CH_FACTORS, grid_for
from dynamiccl.retuner.learned.reward import RewardConfig
from dynamiccl.retuner.learned.state import N_SEQ_FEATS, N_STATIC, Decision, encode

__all__ = ["LearnedPolicy", "Ranked", "DEFAULT_WEIGHTS", "WEIGHT_KEYS"]

DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "policy.npz"
WEIGHT_KEYS = ("w_ih", "w_hh", "b", "w1", "b1", "w2", "b2", "w3", "b3")


@dataclass(frozen=True)
class Ranked:
    action: int
    cell: tuple[str, str]
    ch_factor: float            # 0 = NCCL's channel count
    rel_time: float             # predicted time / the incumbent's time now
    value: float                # the reward the policy expects
    ck_factor: float = 1.0      # 1 = NCCL's chunk size


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class LearnedPolicy:
    def __init__(self, weights: dict[str, np.ndarray], reward: RewardConfig = RewardConfig(), meta: dict | None = None):
        missing = [k for k in WEIGHT_KEYS if k not in weights]
        if missing:
            raise ValueError(f"learned policy weights: missing {missing}")
        self.w = {k: np.asarray(weights[k], np.float64) for k in WEIGHT_KEYS}
        h = self.w["w_hh"].shape[1]
        shapes = {"w_ih": (4 * h, N_SEQ_FEATS), "w_hh": (4 * h, h), "b": (4 * h,), "w1": (None, N_STATIC + h)}
        for k, s in shapes.items():
            if any(a is not None and a != b for a, b in zip(s, self.w[k].shape)) or len(s) != self.w[k].ndim:
                raise ValueError(f"learned policy weights: {k} has shape {self.w[k].shape}, expected {s}")
        self.grid = grid_for(self.w["w3"].shape[0])
        self.hidden = h
        self.reward = reward.validate()
        self.meta = dict(meta or {})

    @classmethod
    def load(cls, path: str | Path = DEFAULT_WEIGHTS, reward: RewardConfig = RewardConfig()) -> "LearnedPolicy":
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"learned policy: no weights file at {p} (train one with `dynamiccl retuner train`)")
        with np.load(p, allow_pickle=False) as z:
            w = {k: z[k] for k in z.files}
        meta = {k[5:]: str(w.pop(k)) for k in list(w) if k.startswith("meta_")}
        return cls(w, reward, meta)

    def predict(self, static: np.ndarray, seq: np.ndarray) -> np.ndarray:
        """Predicted log(time / incumbent's time) of every action."""
        w, h = self.w, self.hidden
        hs = np.zeros(h)
        c = np.zeros(h)
        for x in seq:
            if not x.any():              # left padding
                continue
            g = w["w_ih"] @ x + w["w_hh"] @ hs + w["b"]
            i, f, gg, o = _sigmoid(g[:h]), _sigmoid(g[h:2 * h]), np.tanh(g[2 * h:3 * h]), _sigmoid(g[3 * h:])
            c = f * c + i * gg
            hs = o * np.tanh(c)
        z = np.concatenate([static, hs])
        z = np.maximum(w["w1"] @ z + w["b1"], 0.0)
        z = np.maximum(w["w2"] @ z + w["b2"], 0.0)
        return w["w3"] @ z + w["b3"]

    def rank(self, d: Decision, measured: frozenset = frozenset()) -> list[Ranked]:
        """Enabled actions, best expected reward first. ``measured``: actions already measured (no probe cost)."""
        static, seq = encode(d)
        pred = self.predict(static, seq)
        mask = self.grid.action_mask(set(d.enabled))
        out = []
        cong = max(0.0, 1.0 - 1.0 / d.ratio) if d.kind == "bandwidth" and d.ratio > 1 else 0.0
        for i in np.flatnonzero(mask):
            cell, f, k = self.grid.action_of(int(i))
            rel = math.exp(float(np.clip(pred[i], -5, 5)))
            same = cell == d.inc_cell and f == CH_FACTORS[0] and k == 1.0
            value = (-rel * d.ratio - self.reward.switch * (not same)
                     - self.reward.probe * (not same and int(i) not in measured) - self.reward.congestion * cong)
            out.append(Ranked(int(i), cell, f, rel, value, k))
        return sorted(out, key=lambda r: -r.value)
