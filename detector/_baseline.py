"""Robust baseline (median / MAD) shared by the scalar and vectorised CUSUM.

Both detectors call the same function so that, fed the same data, they learn bit-identical
baselines and therefore raise alarms at identical indices (a property the tests check).

"""

from __future__ import annotations

import numpy as np

# 1 / Phi^{-1}(3/4): MAD -> standard deviation for Gaussian data.
MAD_TO_SIGMA = 1.482602218505602
# sqrt(pi / 2): mean absolute deviation -> standard deviation for Gaussian data.
MEANAD_TO_SIGMA = 1.2533141373155003
# Relative floor used when the warm-up is constant (MAD and mean absolute deviation both 0).
CONSTANT_REL_SCALE = 1e-6
# Absolute floor for an all-zero warm-up; small enough that any non-zero value is extreme,
# large enough that 1/scale stays finite.
TINY_SCALE = 1e-300


def robust_baseline(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median and robust scale along the last axis of ``values``.

    The scale is ``1.4826 * MAD``. When more than half of the warm-up values are identical
    (quantised latencies) the MAD is 0; the scale then falls back to ``1.2533 *`` mean
    absolute deviation from the median, then to ``1e-6 * |median|``, then to ``1e-300``.

    Parameters
    ----------
    values
        Array of shape ``(..., n)`` of finite values.

    Returns
    -------
    (median, scale), each of shape ``values.shape[:-1]``; ``scale > 0`` everywhere.

    """
    med = np.median(values, axis=-1)
    absdev = np.abs(values - med[..., None])
    scale = MAD_TO_SIGMA * np.median(absdev, axis=-1)
    scale = np.where(scale > 0.0, scale, MEANAD_TO_SIGMA * absdev.mean(axis=-1))
    scale = np.where(scale > 0.0, scale, CONSTANT_REL_SCALE * np.abs(med))
    scale = np.where(scale > 0.0, scale, TINY_SCALE)
    return med, scale
