"""The statistics the monitors compare batches with, in plain Python (scipy is not a dependency).

Every function takes sequences of floats and is O(n log n) at worst: a batch of 6400 rows and its
history are compared in milliseconds.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

# Pseudo-count added to every bin before PSI's proportions: an empty bin on one side would
# otherwise make log(p/q) infinite, and a small batch leaves many bins empty.
PSI_SMOOTHING = 0.5


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def ks_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sample Kolmogorov–Smirnov statistic: the largest gap between the empirical CDFs.
    0 for identical samples, 1 for samples whose ranges do not overlap."""
    if not a or not b:
        raise ValueError("ks_statistic needs two non-empty samples")
    xs, ys = sorted(a), sorted(b)
    gap = 0.0
    # the CDFs only step at observed values: compare them just after each one
    for point in set(xs) | set(ys):
        gap = max(gap, abs(bisect_right(xs, point) / len(xs) - bisect_right(ys, point) / len(ys)))
    return gap


def psi_from_counts(expected: Sequence[float], actual: Sequence[float], smoothing: float = PSI_SMOOTHING) -> float:
    """Population stability index of two histograms over the same bins:
    sum over bins of (a - e) * ln(a / e), with a and e the (smoothed) proportions."""
    if len(expected) != len(actual) or not expected:
        raise ValueError(f"psi needs two histograms over the same bins (got {len(expected)} and {len(actual)})")
    e_total = sum(expected) + smoothing * len(expected)
    a_total = sum(actual) + smoothing * len(actual)
    if e_total <= 0 or a_total <= 0:
        raise ValueError("psi needs non-empty histograms")
    index = 0.0
    for e_count, a_count in zip(expected, actual):
        e = (e_count + smoothing) / e_total
        a = (a_count + smoothing) / a_total
        if e == 0 or a == 0:
            raise ValueError("psi: a bin is empty on one side; use smoothing > 0")
        index += (a - e) * math.log(a / e)
    return index


def psi(expected: Sequence[float], actual: Sequence[float], bins: int | None = None) -> float:
    """PSI of ``actual`` against ``expected`` over equal-width bins of their pooled range.

    Bins default to a quarter of the smaller sample, between 2 and 10, so that a batch of 20 rows
    is not spread over mostly empty bins."""
    if not expected or not actual:
        raise ValueError("psi needs two non-empty samples")
    if bins is None:
        bins = max(2, min(10, min(len(expected), len(actual)) // 4))
    low = min(min(expected), min(actual))
    high = max(max(expected), max(actual))
    if high <= low:
        return 0.0  # one value on both sides: nothing moved
    width = (high - low) / bins

    def histogram(values: Sequence[float]) -> list[int]:
        counts = [0] * bins
        for value in values:
            counts[min(int((value - low) / width), bins - 1)] += 1
        return counts

    return psi_from_counts(histogram(expected), histogram(actual))


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's r; None when either side is constant (no correlation is defined)."""
    if len(xs) != len(ys):
        raise ValueError(f"pearson needs paired samples (got {len(xs)} and {len(ys)})")
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given their average rank (as Spearman's rho needs)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            out[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rho (Pearson's r of the ranks): robust to a few very long completions."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman needs paired samples (got {len(xs)} and {len(ys)})")
    return pearson(ranks(xs), ranks(ys))


# A change counts only when it is also beyond noise: this many standard errors (one-sided p ~0.005),
# so a tiny batch of 20 samples does not warn on the luck of its draw while a default batch of
# thousands still shows a real shift of a few points.
SIGNIFICANCE_Z = 2.58
KS_C_ALPHA = 1.63  # the two-sample KS critical value's coefficient at alpha = 0.01


def ks_critical(n: int, m: int) -> float:
    """The KS statistic two samples of sizes n and m exceed by chance with probability ~0.01."""
    return KS_C_ALPHA * math.sqrt((n + m) / (n * m))


def _variance(values: Sequence[float]) -> float:
    mu = sum(values) / len(values)
    return sum((v - mu) ** 2 for v in values) / max(len(values) - 1, 1)


def mean_rise_z(new: Sequence[float], old: Sequence[float]) -> float:
    """(mean(new) - mean(old)) in standard errors of the difference (Welch). A difference between
    two constant samples is infinitely significant; no difference is 0."""
    if not new or not old:
        raise ValueError("mean_rise_z needs two non-empty samples")
    diff = sum(new) / len(new) - sum(old) / len(old)
    se = math.sqrt(_variance(new) / len(new) + _variance(old) / len(old))
    if se == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / se


def proportion_rise_z(hits: int, n: int, hits_before: int, n_before: int) -> float:
    """The rise of a rate (hits/n against hits_before/n_before) in standard errors (pooled two-proportion test)."""
    if n <= 0 or n_before <= 0:
        raise ValueError("proportion_rise_z needs two non-empty samples")
    diff = hits / n - hits_before / n_before
    pooled = (hits + hits_before) / (n + n_before)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / n_before))
    if se == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / se


def correlation_rise_z(r: float, n: int, r_before: float, n_before: int) -> float:
    """The rise of a correlation in standard errors (Fisher's z; needs more than 3 pairs a side)."""
    if n <= 3 or n_before <= 3:
        raise ValueError("correlation_rise_z needs more than 3 pairs a side")
    clip = 1 - 1e-9  # atanh(±1) is infinite
    z, z_before = math.atanh(max(-clip, min(clip, r))), math.atanh(max(-clip, min(clip, r_before)))
    return (z - z_before) / math.sqrt(1 / (n - 3) + 1 / (n_before - 3))
