"""The one decision rule of auto-selection: a sequential test on paired turns (docs/auto.md).

Two candidates A (the one serving) and B take adjacent turns, A B B A, each serving real calls (online) or
synthetic ones (at compile). Every adjacent pair of turns gives one observation: the log of the ratio of B's
median call time to A's in that pair. A drift of the machine moves both sides of a pair alike, and the order
A B then B A cancels a steady trend. After each round the test asks where the mean log-ratio lies, with a
Student-t interval at the policy's confidence:

- wholly below the tie band: B is faster (``FASTER``);
- wholly above it: B is slower (``SLOWER``);
- wholly inside it: they tie (``TIE``: the serving one keeps the bucket);
- otherwise it goes on (``OPEN``), until a bound in time, when the point estimate decides (:func:`settle`).

The same function judges the turns of online tuning and the blocks of the timing at compile.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence

__all__ = ["Outcome", "compare", "interval", "log_ratio", "settle", "t_quantile"]


class Outcome(enum.Enum):
    """What the test says of a challenger against the serving candidate."""

    FASTER = "faster"
    SLOWER = "slower"
    TIE = "tie"
    OPEN = "open"


def log_ratio(challenger: Sequence[float], incumbent: Sequence[float]) -> float | None:
    """The log of the ratio of medians of two adjacent turns' call times; None when one side timed no call."""
    if not challenger or not incumbent:
        return None
    a, b = statistics.median(incumbent), statistics.median(challenger)
    if a <= 0.0 or b <= 0.0:
        return None
    return math.log(b / a)


def interval(logs: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """The two-sided Student-t interval of the mean of ``logs`` (None with fewer than two)."""
    n = len(logs)
    if n < 2:
        return None
    mean = statistics.fmean(logs)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return mean - half, mean + half


def compare(logs: Sequence[float], confidence: float, tie_rel: float) -> Outcome:
    """Where the interval of the mean log-ratio lies against the tie band ``log(1 +/- tie_rel)``."""
    bounds = interval(logs, confidence)
    if bounds is None:
        return Outcome.OPEN
    lo, hi = bounds
    band_lo, band_hi = math.log(1.0 - tie_rel) if tie_rel < 1.0 else -math.inf, math.log(1.0 + tie_rel)
    if hi < band_lo:
        return Outcome.FASTER
    if lo > band_hi:
        return Outcome.SLOWER
    if band_lo <= lo and hi <= band_hi:
        return Outcome.TIE
    return Outcome.OPEN


def settle(logs: Sequence[float], tie_rel: float) -> Outcome:
    """The verdict at the bound in time: the point estimate against the tie band (no observation: a tie)."""
    if not logs:
        return Outcome.TIE
    mean = statistics.fmean(logs)
    if tie_rel < 1.0 and mean < math.log(1.0 - tie_rel):
        return Outcome.FASTER
    if mean > math.log(1.0 + tie_rel):
        return Outcome.SLOWER
    return Outcome.TIE


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on its CDF)."""
    if not 0.5 <= p < 1.0:
        raise ValueError(f"t_quantile: expected 0.5 <= p < 1, got {p}")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0: 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t^2)."""
    x = df / (df + t * t)
    return 1.0 - 0.5 * _incomplete_beta(x, df / 2.0, 0.5)


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Lentz's continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f / a
