"""Running duration statistics per (target, candidate) and the sequential test exploration uses.

Samples arrive in batches (a window or a training step: count, mean, variance), so :class:`Running` merges
batches exactly (Chan et al.'s parallel update). :func:`slower_p` is a one-sided Welch *t* test on the
means: the probability of seeing data this extreme if the candidate were **not** slower. The exploration
stops a candidate early when it is clearly worse, commits only when the winner is clearly better, and
rolls back when a committed config is clearly slower than the one before; each decision uses its own
error rate (``alpha``) from the config.

>>> a, b = Running(), Running()
>>> a.add_batch(32, 1.00e-3, (0.02e-3) ** 2); b.add_batch(32, 1.10e-3, (0.02e-3) ** 2)
>>> round(b.mean / a.mean, 3), slower_p(b, a, margin=0.0) < 1e-6, slower_p(a, b, margin=0.0) > 0.99
(1.1, True, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import t as student_t

__all__ = ["Running", "slower_p", "rel_halfwidth"]


@dataclass
class Running:
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0            # sum of squared deviations
    t_last: float = -math.inf  # event time of the newest batch

    def add_batch(self, n: int, mean: float, var: float, t: float = -math.inf) -> None:
        if n <= 0:
            return
        m2b = var * max(n - 1, 0)
        tot = self.n + n
        d = mean - self.mean
        self.mean += d * n / tot
        self.m2 += m2b + d * d * self.n * n / tot
        self.n = tot
        self.t_last = max(self.t_last, t)

    @property
    def var(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else math.inf

    @property
    def sem(self) -> float:
        return math.sqrt(self.var / self.n) if self.n > 1 else math.inf


def slower_p(x: Running, y: Running, *, margin: float) -> float:
    """One-sided Welch p-value for H0: mean(x) <= (1 + margin) * mean(y) against "x is slower".

    Small = confident that x is more than ``margin`` slower than y. 1.0 when either side has < 2 samples.
    """
    if x.n < 2 or y.n < 2:
        return 1.0
    ref = (1.0 + margin) * y.mean
    vx, vy = x.var / x.n, (1.0 + margin) ** 2 * y.var / y.n
    se = math.sqrt(vx + vy)
    diff = x.mean - ref
    if se <= 0.0:
        return 0.0 if diff > 0 else 1.0
    dof = (vx + vy) ** 2 / ((vx * vx / (x.n - 1) if x.n > 1 else 0.0) + (vy * vy / (y.n - 1) if y.n > 1 else 0.0)
                            or 1e-300)
    return float(student_t.sf(diff / se, max(dof, 1.0)))


def rel_halfwidth(x: Running, *, z: float = 2.0) -> float:
    """Half-width of a ~95 % interval of the mean relative to the mean (inf with < 2 samples)."""
    if x.n < 2 or x.mean <= 0:
        return math.inf
    return z * x.sem / x.mean
