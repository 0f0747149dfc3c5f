"""Shared helpers: interleaved timing with medians, and a table printer."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def interleaved_samples(cases: dict[str, Callable[[], object]], repeats: int,
                        warmup: int = 2, sync: Callable[[object], object] = lambda r: r,
                        ) -> dict[str, list[float]]:
    """Seconds of every call of each case, round ``i`` at index ``i`` of each list."""
    for fn in cases.values():
        for _ in range(warmup):
            sync(fn())
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            start = time.perf_counter()
            sync(fn())
            samples[name].append(time.perf_counter() - start)
    return samples


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over rounds of one case's time over another's in the same round: the
    machine's drift between rounds cancels, which a ratio of medians keeps."""
    return statistics.median(n / d for n, d in zip(numerator, denominator))


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the median of ``values``: the order
    statistics ``k`` and ``n + 1 - k`` (1-based), ``k`` the largest rank for which
    ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``. Whether a ratio of about 1
    is a lead or noise is then visible from one run. ``None`` below 6 values at 95%."""
    n = len(values)
    tail, k = 0.0, 0
    while True:
        tail += math.comb(n, k) / 2**n  # P(Binomial(n, 1/2) <= k)
        if tail > (1 - confidence) / 2:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def paired_ratio_interval(numerator: list[float], denominator: list[float]) -> str:
    """``paired_ratio``'s 95% interval, as text for a table."""
    interval = median_interval([n / d for n, d in zip(numerator, denominator)])
    return "n/a" if interval is None else f"{interval[0]:.3f} to {interval[1]:.3f}"


def table(title: str, rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    out = [title, line, "  ".join(h.ljust(w) for h, w in zip(header, widths)), line]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([*out, line])
