"""`gradpipe run`: problems, examples, convergence, plots."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradpipe.cli", "run", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_reaches_its_target(example):
    result = run(str(example), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["target_reached"] is True, summary
    assert summary["skipped_steps"] <= summary["steps"] // 100


def test_at_least_five_examples():
    names = {p.stem for p in EXAMPLES}
    assert {"quickstart", "openseq2seq", "mixed_precision", "clippy_adagrad",
            "tfp_minimize"} <= names


def test_run_stops_on_convergence_and_plots(tmp_path):
    png = tmp_path / "run.png"
    result = run(str(ROOT / "examples" / "tfp_minimize.toml"), "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert "converged by          loss_not_decreasing" in result.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "loss" in result.stderr and "lr 0.02" in result.stderr  # progress bar


@pytest.mark.parametrize("problem", ["logistic_regression", "mlp_classifier",
                                     "noisy_quadratic"])
def test_problems_run(problem, write_toml):
    path = write_toml('[[transforms]]\nkind = "adam"\nlearning_rate = 0.01\n')
    result = run(str(path), "--problem", problem, "--steps", "50", "--json", "--seed", "3")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["problem"] == problem and summary["steps"] == 50
    if problem != "noisy_quadratic":
        assert 0.0 <= summary["accuracy"] <= 1.0


def test_bad_problem_table_is_config_error(write_toml):
    path = write_toml("""
        [problem]
        kind = "mlp_classifier"
        hiden = 3

        [[transforms]]
        kind = "sgd"
    """)
    result = run(str(path))
    assert result.returncode == 1
    assert "problem.hiden: unknown key (did you mean 'hidden'?)" in result.stderr
