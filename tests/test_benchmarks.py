"""The benchmark scripts run in quick mode so they never rot (no timing is asserted)."""

from __future__ import annotations

import sys

import pytest

import forked
from conftest import ROOT


@pytest.mark.slow
def test_every_benchmark_runs_quick():
    """Every script at its quick sizes, in one process (``benchmarks/_smoke.py``), forked
    with TensorFlow imported (its own processes, servers and coordinators, start anew)."""
    result = forked.run([sys.executable, "_smoke.py"], cwd=ROOT / "benchmarks",
                        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    assert result.stdout.count(": ok (") == 13, result.stdout  # every run of RUNS


def test_the_median_interval_is_the_sign_test_one():
    """Ranks from the sign-test tables (n = 21: 6th and 16th; n = 6: the extremes),
    whatever order the values come in; below 6 values no 95% interval exists."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _common import median_interval
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    values = [v / 10 for v in range(21, 0, -1)]
    assert median_interval(values) == (0.6, 1.6)
    assert median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (1.0, 6.0)
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_interval(values, confidence=0.5)[0] > 0.6  # narrower at less confidence
