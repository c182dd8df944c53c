"""Shared noise for the CUSUM tests: a unit-variance AR(1) series (first sample, then innovations)."""
from __future__ import annotations

import numpy as np


def ar1(rng: np.random.Generator, n: int, rho: float) -> np.ndarray:
    z = np.empty(n)
    z[0] = rng.standard_normal()
    e = rng.standard_normal(n) * np.sqrt(1.0 - rho * rho)
    for t in range(1, n):
        z[t] = rho * z[t - 1] + e[t]
    return z
