"""The benchmark scripts run in quick mode so they never rot (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("args", [["step.py"], ["step.py", "--small"],
                                  ["step.py", "--rule", "sgd", "--no-xla"], ["fit.py"],
                                  ["startup.py"], ["memory.py"]],
                         ids=lambda a: " ".join(a))
def test_benchmark_runs_quick(args):
    result = subprocess.run([sys.executable, *args, "--quick"], cwd=ROOT / "benchmarks",
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "----" in result.stdout  # printed its table
