"""Contrib distributions installed with pip and found through their entry points."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

CONTRIB = sorted(p for p in (ROOT / "contrib").iterdir() if (p / "pyproject.toml").exists())


@pytest.fixture(scope="module", params=CONTRIB, ids=[p.name for p in CONTRIB])
def installed(request):
    """pip-install the contrib distribution from its folder (idempotent)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", str(request.param)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return request.param


@pytest.mark.slow
def test_contrib_tests_pass(installed):
    """Each contrib package's own test suite passes against this core."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(installed / "tests")], capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
def test_agc_pipeline_from_toml(tmp_path):
    """A TOML pipeline that requires and uses `agc` runs in a fresh process."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", str(ROOT / "contrib" / "gradpipe-agc")],
                   check=True, capture_output=True, timeout=600)
    toml = tmp_path / "agc.toml"
    toml.write_text(textwrap.dedent("""
        [gradpipe]
        require = ["gradpipe-agc>=0.1"]

        [problem]
        kind = "quadratic"

        [[transforms]]
        kind = "agc"
        clipping = 0.5

        [[transforms]]
        kind = "adam"
        learning_rate = 0.05
    """))
    result = subprocess.run([sys.executable, "-m", "gradpipe.cli", "run", str(toml),
                             "--json", "--steps", "300"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert '"target_reached": true' in result.stdout
    check = subprocess.run([sys.executable, "-m", "gradpipe.cli", "check", str(toml)],
                           capture_output=True, text=True)
    assert 'gradpipe-agc = "0.1.0"' in check.stdout  # recorded in [lock]
