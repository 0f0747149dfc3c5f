"""Contrib distributions installed with pip and found through their entry points."""

from __future__ import annotations

import sys
import textwrap

import pytest

import forked


@pytest.mark.slow
def test_agc_pipeline_from_toml(tmp_path):
    """A TOML pipeline that requires and uses `agc` (installed by pip, as the README's
    test command does) runs in a fresh process. Each contrib plugin's own tests run
    in this suite too (``testpaths``)."""
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
    result = forked.run([sys.executable, "-m", "gradpipe.cli", "run", str(toml),
                         "--json", "--steps", "300"], capture_output=True, text=True,
                        timeout=300)
    assert result.returncode == 0, result.stderr
    assert '"target_reached": true' in result.stdout
    check = forked.run([sys.executable, "-m", "gradpipe.cli", "check", str(toml)],
                       capture_output=True, text=True)
    assert 'gradpipe-agc = "0.1.0"' in check.stdout  # recorded in [lock]
