"""ruff and mypy, as configured in pyproject.toml, are clean."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_ruff_clean():
    paths = ["core", "plugins", "tests", "contrib", "docs", "benchmarks"]
    result = subprocess.run([sys.executable, "-m", "ruff", "check", *paths], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_clean_on_core():
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
