"""The reward of the design: r = −(time / baseline) − λ_switch·1[config changed] − λ_probe·1[exploratory action]
− λ_cong·congestion. Collective time is the proxy (the evaluation's jobs report no step time)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RewardConfig", "reward"]


@dataclass(frozen=True)
class RewardConfig:
    switch: float = 0.01      # a config change costs a step boundary and a risk: 1 % of the baseline time
    probe: float = 0.02       # an unmeasured action may be far off (NCCL's model misjudges up to 2x)
    congestion: float = 0.05  # charges the state (same for every action): a congested regime is worth less

    def validate(self) -> "RewardConfig":
        for n in ("switch", "probe", "congestion"):
            v = getattr(self, n)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ValueError(f"reward.{n} must be in [0, 1], got {v!r}")
        return self


def reward(time_ratio: np.ndarray, changed: np.ndarray, probe: np.ndarray, congestion: float,
           cfg: RewardConfig = RewardConfig()) -> np.ndarray:
    """Per action: ``time_ratio`` = its collective time / the job's baseline time (the incumbent before the regime)."""
    return (-np.asarray(time_ratio, float) - cfg.switch * np.asarray(changed, float)
            - cfg.probe * np.asarray(probe, float) - cfg.congestion * float(congestion))
