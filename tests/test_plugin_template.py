"""`gradpipe new-plugin`: the generated package installs and passes its own tests."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_generated_plugin_installs_and_passes(tmp_path):
    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", "halve",
                           "--directory", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    root = tmp_path / "gradpipe-halve"
    assert {p.name for p in root.iterdir()} >= {"pyproject.toml", "README.md",
                                                "gradpipe_halve", "tests"}
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                              "--no-build-isolation", "--target", str(target), str(root)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    listed = subprocess.run([sys.executable, "-m", "gradpipe.cli", "plugins", "--json"],
                            capture_output=True, text=True, env=env)
    assert '"distribution": "gradpipe-halve"' in listed.stdout
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(root / "tests")], capture_output=True, text=True, env=env,
                           timeout=900)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    assert "3 passed" in tests.stdout


def test_existing_directory_is_refused(tmp_path):
    (tmp_path / "gradpipe-halve").mkdir()
    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", "halve",
                           "--directory", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 1 and "already exists" in made.stderr


@pytest.mark.parametrize("bad", ["9lives", "has space"])
def test_bad_names(tmp_path, bad):
    made = subprocess.run([sys.executable, "-m", "gradpipe.cli", "new-plugin", bad,
                           "--directory", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 1 and "must be letters" in made.stderr
