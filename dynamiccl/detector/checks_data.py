"""Seeded synthetic data for the conformance checks (`dynamiccl.detector.checks`), and feeding it to a
detector of each contract (drift, bank, anomaly). Nothing here touches the network or the clock."""

from __future__ import annotations

import numpy as np
from river import base

__all__ = ["kind"]


def kind(detector) -> str:
    """'drift', 'bank' or 'anomaly'."""
    if isinstance(detector, base.AnomalyDetector):
        return "anomaly"
    if hasattr(detector, "update_many"):
        return "bank"
    if isinstance(detector, base.DriftDetector):
        return "drift"
    raise TypeError(f"{detector!r} follows no known detector contract")


# ----------------------------------------------------------------------------- data
def _latency(rng: np.random.Generator, n: int, level: float = 2e-3, sd: float = 1e-4):
    return level + sd * rng.standard_normal(n)


def _windows(rng: np.random.Generator, n: int, tail: float = 1.5) -> list[dict[str, float]]:
    """Per-window features driven by a common load factor (a 1-D manifold plus noise)."""
    load = rng.uniform(0.5, 2.0, n)
    p50 = 1e-3 * load * (1 + 0.02 * rng.standard_normal(n))
    p99 = tail * p50 * (1 + 0.02 * rng.standard_normal(n))
    nbytes = 4e6 * load * (1 + 0.01 * rng.standard_normal(n))
    bw = 4e9 * (1 + 0.02 * rng.standard_normal(n))
    return [
        {"lat_p50_s": float(a), "lat_p99_s": float(b), "bytes_total": float(c), "busbw_Bps": float(d)}
        for a, b, c, d in zip(p50, p99, nbytes, bw)
    ]


def _feed(detector, values) -> list[int]:
    """Feed a drift detector (scalar) or bank (2-D array, one row per step); return alarm steps.

    For a bank the result lists the step of every alarm of every stream.
    """
    alarms: list[int] = []
    if kind(detector) == "bank":
        for t, row in enumerate(values):
            detector.update_many(row)
            alarms.extend([t] * int(np.count_nonzero(detector.drift_detected)))
    else:
        for t, x in enumerate(values):
            detector.update(x)
            if detector.drift_detected:
                alarms.append(t)
    return alarms


def _stream(detector, values: np.ndarray) -> np.ndarray:
    """Broadcast a 1-D stream to the bank's width (independent noise per stream)."""
    if kind(detector) != "bank":
        return values
    n = detector.n_streams
    rng = np.random.default_rng(123)
    noise = rng.permuted(np.tile(values, (n, 1)), axis=1).T  # same marginal, different order
    return noise


def _outputs(detector, kind_: str, rng: np.random.Generator, n: int) -> list:
    """Feed n samples and return everything observable, for comparing two detectors."""
    out: list = []
    if kind_ == "anomaly":
        for x in _windows(rng, n):
            out.append(detector.score_one(x))
            detector.learn_one(x)
    elif kind_ == "bank":
        X = _latency(rng, n * detector.n_streams).reshape(n, detector.n_streams)
        for row in X:
            detector.update_many(row)
            out.append(detector.drift_detected.tolist())
            out.append(detector.statistic_up.tolist())
    else:
        for x in _latency(rng, n):
            detector.update(x)
            out.append((detector.drift_detected, detector.statistic_up, detector.statistic_down))
    return out


def _warm_length(detector) -> int:
    return int(getattr(detector, "warmup", 0))
