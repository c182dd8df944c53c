from __future__ import annotations

import math
import random
import typing

import numpy as np
from river import base

__all__ = ["Autoencoder"]

# Standardised inputs are clamped to +/- this many standard deviations before entering the
# network, so one absurd feature value gives a large but finite score.
_Z_CLAMP = 10.0


def _import_torch():
    """Import torch on first use, with an actionable message when it is not installed."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised through a monkeypatched import
        raise ImportError(
            "detector.Autoencoder needs PyTorch, an optional dependency of dynamiccl. "
            "Install it with: pip install 'dynamiccl[autoencoder]'"
        ) from exc
    return torch


class Autoencoder(base.AnomalyDetector):
    r"""Online autoencoder over per-window feature vectors; score = reconstruction error.

    Each input is a dict of floats (e.g. one row of the collector's per-window ``keys`` table:
    ``lat_p50_s``, ``lat_p99_s``, ``busbw_Bps``, ...). Features are standardised online
    (running mean and variance, Welford), clamped to $\pm 10$ standard deviations, and passed
    through a small MLP autoencoder
    ``d -> hidden_dim -> latent -> hidden_dim -> d`` (tanh activations, latent size
    ``min(latent_dim, d - 1)`` so there is always a bottleneck), trained with Adam. The anomaly
    score is the mean squared reconstruction error in standardised units: about 1 or less for
    windows like the training data, larger for windows off the learned manifold.

    **Protection.** `learn_one` does *not* train on a window whose score exceeds `threshold`,
    the ``q``-quantile of the scores of the last ``window_size`` training candidates (so a
    congestion episode is not learned as normal). The first ``grace_period`` windows are learned
    unconditionally and their scores (from a network still converging) are not recorded; the
    threshold is set, and protection starts, once ``min(window_size, grace_period)`` further
    scores are recorded.
    Protected windows enter that score window censored at the current threshold: the quantile
    then neither drifts down (as it would if only accepted scores were kept) nor is dragged up by
    a burst of anomalies. The scaler is also updated only with learned windows. After a
    persistent regime change the model therefore keeps flagging; build a fresh detector (or
    ``clone()``) to re-learn the baseline.

    The feature set is fixed by the first learned input (sorted names, see `feature_names`).
    Missing, non-numeric or non-finite values are replaced by the running mean (0 in
    standardised units) and counted in `n_invalid_values`; features not seen at that point are
    ignored. Memory is bounded: the network, the scaler and a ``window_size`` score buffer.

    torch is imported when the detector is built, not when `detector` is imported. Only the CPU
    is used.

    Parameters
    ----------
    hidden_dim
        Width of the hidden layers.
    latent_dim
        Size of the bottleneck (capped at ``n_features - 1``).
    lr
        Adam learning rate.
    q
        Quantile of recent training scores used as the protection threshold.
    window_size
        Number of recent training scores kept for the quantile.
    grace_period
        Number of windows learned unconditionally (and not used for the threshold) before the
        threshold starts being calibrated.
    protect
        If False, learn every window (the threshold is still tracked).
    seed
        Seed for weight initialisation (torch's global RNG is left untouched).

    Attributes
    ----------
    threshold
        Current protection threshold (inf until calibrated).
    n_learned, n_protected
        Windows trained on / refused by protection.

    Examples
    --------
    Windows whose latency percentiles and bandwidth all follow the offered load, then a window
    with a congested tail (p99 four times p50) at a normal median:

    >>> import numpy as np
    >>> from dynamiccl.detector import Autoencoder
    >>> rng = np.random.default_rng(0)
    >>> def window(tail=1.5):
    ...     load = rng.uniform(0.5, 2.0)
    ...     p50 = 1e-3 * load * (1 + 0.02 * rng.standard_normal())
    ...     return {"lat_p50_s": p50,
    ...             "lat_p99_s": tail * p50 * (1 + 0.02 * rng.standard_normal()),
    ...             "bytes_total": 4e6 * load * (1 + 0.01 * rng.standard_normal()),
    ...             "busbw_Bps": 4e9 * (1 + 0.02 * rng.standard_normal())}
    >>> ae = Autoencoder(seed=42)
    >>> for _ in range(2000):
    ...     ae.learn_one(window())
    >>> normal = [ae.score_one(window()) for _ in range(200)]
    >>> congested = ae.score_one(window(tail=4.0))
    >>> congested > 5 * max(normal)
    True
    >>> ae.n_learned + ae.n_protected
    2000

    The batch methods take numpy arrays (columns in `feature_names` order) or polars frames:

    >>> import polars as pl
    >>> frame = pl.DataFrame([window() for _ in range(3)] + [window(tail=4.0)])
    >>> scores = ae.score_many(frame)
    >>> int(np.argmax(scores))
    3

    """

    def __init__(
        self,
        hidden_dim: int = 16,
        latent_dim: int = 2,
        lr: float = 5e-3,
        q: float = 0.995,
        window_size: int = 1000,
        grace_period: int = 200,
        protect: bool = True,
        seed: int | None = None,
    ):
        self.hidden_dim = hidden_dim
        self.latent_dim = latent_dim
        self.lr = lr
        self.q = q
        self.window_size = window_size
        self.grace_period = grace_period
        self.protect = protect
        self.seed = seed

        for name, value, low in (("hidden_dim", hidden_dim, 1), ("latent_dim", latent_dim, 1),
                                 ("window_size", window_size, 2), ("grace_period", grace_period, 0)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
        if not (isinstance(q, (int, float)) and 0.0 < q < 1.0):
            raise ValueError(f"q must be in (0, 1), got {q!r}")

        self._torch = _import_torch()  # fail fast with the install hint
        self._seed = seed if seed is not None else random.SystemRandom().getrandbits(62)

        self._features: tuple[typing.Hashable, ...] | None = None
        self._module = None
        self._optimizer = None
        # Welford state of the learned windows.
        self._n = 0
        self._mean: np.ndarray | None = None
        self._m2: np.ndarray | None = None
        # Ring buffer of recent training scores (protected ones censored at the threshold).
        self._scores = np.zeros(window_size, dtype=np.float64)
        self._n_scores = 0
        self._threshold = math.inf
        self._min_scores = min(window_size, max(grace_period, 1))
        self._n_learned = 0
        self._n_protected = 0
        self._n_invalid_values = 0

    # ------------------------------------------------------------------ pickling
    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_torch"]  # modules are not picklable
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._torch = _import_torch()

    # ------------------------------------------------------------------ read-only state
    @property
    def feature_names(self) -> tuple | None:
        """Feature order fixed by the first learned input (None before)."""
        return self._features

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def n_learned(self) -> int:
        return self._n_learned

    @property
    def n_protected(self) -> int:
        return self._n_protected

    @property
    def n_invalid_values(self) -> int:
        return self._n_invalid_values

    # ------------------------------------------------------------------ internals
    def _init_model(self, features: typing.Sequence) -> None:
        torch = self._torch
        self._features = tuple(features)
        d = len(self._features)
        latent = max(1, min(self.latent_dim, d - 1))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._seed)
            nn = torch.nn
            self._module = nn.Sequential(
                nn.Linear(d, self.hidden_dim), nn.Tanh(),
                nn.Linear(self.hidden_dim, latent), nn.Tanh(),
                nn.Linear(latent, self.hidden_dim), nn.Tanh(),
                nn.Linear(self.hidden_dim, d),
            )
        self._optimizer = torch.optim.Adam(self._module.parameters(), lr=self.lr)
        self._mean = np.zeros(d, dtype=np.float64)
        self._m2 = np.zeros(d, dtype=np.float64)

    def _dict_to_row(self, x: dict) -> np.ndarray:
        row = np.empty(len(self._features), dtype=np.float64)  # type: ignore[arg-type]
        for j, name in enumerate(self._features):  # type: ignore[arg-type]
            v = x.get(name)
            try:
                v = float(v)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                v = math.nan
            row[j] = v
        return row

    def _to_matrix(self, X) -> np.ndarray:
        """numpy 2-D array or polars DataFrame -> float64 matrix in feature order."""
        if hasattr(X, "columns") and hasattr(X, "select"):  # polars.DataFrame
            if self._features is None:
                self._init_model(sorted(X.columns))
            cols = [c for c in self._features if c in X.columns]  # type: ignore[union-attr]
            M = np.full((X.height, len(self._features)), np.nan)  # type: ignore[arg-type]
            if cols:
                sub = X.select(cols).cast({c: float for c in cols}, strict=False).to_numpy()
                idx = [self._features.index(c) for c in cols]  # type: ignore[union-attr]
                M[:, idx] = sub
            return M
        M = np.asarray(X, dtype=np.float64)
        if M.ndim != 2:
            raise ValueError(f"expected a 2-D array, got shape {M.shape}")
        if self._features is None:
            self._init_model(range(M.shape[1]))
        if M.shape[1] != len(self._features):  # type: ignore[arg-type]
            raise ValueError(
                f"expected {len(self._features)} columns ({self._features}), got {M.shape[1]}"  # type: ignore[arg-type]
            )
        return M

    def _standardise(self, M: np.ndarray, count: bool = False) -> np.ndarray:
        """Standardise rows with the current scaler; invalid values -> 0 (the mean)."""
        bad = ~np.isfinite(M)
        if count:
            self._n_invalid_values += int(bad.sum())
        if self._n >= 2:
            std = np.sqrt(self._m2 / (self._n - 1))  # type: ignore[operator]
            std = np.where(std > 0.0, std, 1.0)
            with np.errstate(invalid="ignore", over="ignore"):
                Z = (M - self._mean) / std
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                Z = M - self._mean if self._n == 1 else np.zeros_like(M)
        Z[bad] = 0.0
        np.clip(Z, -_Z_CLAMP, _Z_CLAMP, out=Z)
        return Z

    def _update_scaler(self, M: np.ndarray) -> None:
        """Merge the rows of M (invalid values replaced by the mean) into the Welford state."""
        M = np.where(np.isfinite(M), M, self._mean)
        nb = M.shape[0]
        if nb == 0:
            return
        mean_b = M.mean(axis=0)
        m2_b = ((M - mean_b) ** 2).sum(axis=0)
        n = self._n
        tot = n + nb
        delta = mean_b - self._mean
        self._mean = self._mean + delta * (nb / tot)
        self._m2 = self._m2 + m2_b + delta**2 * (n * nb / tot)
        self._n = tot

    def _errors(self, Z: np.ndarray, grad: bool):
        """Per-row mean squared reconstruction error (a tensor)."""
        torch = self._torch
        t = torch.from_numpy(Z.astype(np.float32))
        if grad:
            out = self._module(t)
        else:
            with torch.inference_mode():
                out = self._module(t)
        return ((out - t) ** 2).mean(dim=1)

    def _push_scores(self, scores: np.ndarray) -> None:
        # Scores from the first grace_period windows (while the network is still far from
        # converged) would inflate the quantile for a long time: they are not recorded.
        if self._n_learned < self.grace_period:
            return
        w = self.window_size
        scores = scores[-w:]
        self._scores[(self._n_scores + np.arange(scores.shape[0])) % w] = scores
        self._n_scores += scores.shape[0]
        if self._n_scores >= self._min_scores:
            filled = min(self._n_scores, w)
            self._threshold = float(np.quantile(self._scores[:filled], self.q))

    def _learn_matrix(self, M: np.ndarray) -> None:
        Z = self._standardise(M, count=True)
        errors = self._errors(Z, grad=True)
        scores = errors.detach().numpy().astype(np.float64)
        if self.protect:
            keep = scores <= self._threshold  # the threshold is inf until calibrated
        else:
            keep = np.ones(scores.shape[0], dtype=bool)
        n_keep = int(keep.sum())
        if n_keep:
            loss = errors[self._torch.from_numpy(keep)].mean()
            self._optimizer.zero_grad()  # type: ignore[union-attr]
            loss.backward()
            self._optimizer.step()  # type: ignore[union-attr]
            self._update_scaler(M[keep])
        self._push_scores(np.where(keep, scores, self._threshold))
        self._n_learned += n_keep
        self._n_protected += scores.shape[0] - n_keep

    # ------------------------------------------------------------------ river API
    def learn_one(self, x: dict) -> None:
        """Score ``x``, then train on it unless protection refuses it."""
        if self._features is None:
            self._init_model(sorted(x))
        self._learn_matrix(self._dict_to_row(x)[None, :])

    def score_one(self, x: dict) -> float:
        """Reconstruction error of ``x`` (0.0 before anything was learned)."""
        if self._features is None or self._n_learned == 0:
            return 0.0
        Z = self._standardise(self._dict_to_row(x)[None, :])
        return float(self._errors(Z, grad=False)[0])

    def learn_many(self, X) -> None:
        """Train on a batch: one Adam step on the mean error of the rows protection accepts.

        Parameters
        ----------
        X
            polars DataFrame (columns matched by name) or 2-D numpy array (columns in
            `feature_names` order; they are named 0..d-1 if this is the first input).

        """
        M = self._to_matrix(X)
        if M.shape[0]:
            self._learn_matrix(M)

    def score_many(self, X) -> np.ndarray:
        """Scores of every row of ``X`` (see `learn_many` for accepted inputs)."""
        if self._features is None:
            return np.zeros(len(X), dtype=np.float64)
        M = self._to_matrix(X)
        if self._n_learned == 0 or M.shape[0] == 0:
            return np.zeros(M.shape[0], dtype=np.float64)
        Z = self._standardise(M)
        return self._errors(Z, grad=False).numpy().astype(np.float64)

    @classmethod
    def _unit_test_params(cls):
        yield {"seed": 42}
        yield {"hidden_dim": 8, "latent_dim": 1, "window_size": 200, "grace_period": 50,
               "seed": 1}
