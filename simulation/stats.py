"""Small-sample statistics for comparisons across seeds: Student's t distribution, the 95 %
interval of a mean, and the paired t-test (standard library only; no scipy here).

Student's t CDF is 1 - I_x(nu/2, 1/2)/2 for t > 0 with x = nu/(nu + t^2) (Abramowitz and
Stegun 26.7.1 with 26.5.27); the regularized incomplete beta I_x(a, b) is its continued
fraction (Abramowitz and Stegun 26.5.8, evaluated by the modified Lentz method).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95  # every interval on a results page
_EPS = 1e-15
_TINY = 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Abramowitz and Stegun 26.5.8), modified Lentz."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 400):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= c * d
        if abs(c * d - 1.0) < _EPS:
            break
    return result


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete_beta: x must be in [0, 1], got {x!r}")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t_cdf: degrees of freedom must be > 0, got {df!r}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on :func:`t_cdf`, to 1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class MeanInterval:
    """A mean over n values with its two-sided :data:`CONFIDENCE` t-interval (n >= 2; with
    one value the interval is that value and ``n`` says so)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> MeanInterval:
    """Mean ± t_{(1+c)/2, n-1} s / sqrt(n)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_interval: no values")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return MeanInterval(mean, mean, mean, 1)
    half = (t_quantile((1.0 + confidence) / 2.0, len(values) - 1)
            * statistics.stdev(values) / math.sqrt(len(values)))
    return MeanInterval(mean, mean - half, mean + half, len(values))


def paired_t_pvalue(differences: Sequence[float]) -> float | None:
    """Two-sided p of the paired t-test of H0: mean difference 0 (None below 2 pairs; 0 or 1
    when every difference is the same: no spread, the sign decides)."""
    values = [float(v) for v in differences]
    if len(values) < 2:
        return None
    mean, spread = statistics.fmean(values), statistics.stdev(values)
    if spread == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    t = mean / (spread / math.sqrt(len(values)))
    return 2.0 * (1.0 - t_cdf(abs(t), len(values) - 1))
