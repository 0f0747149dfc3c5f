"""`gradpipe run`: problems, examples, convergence, plots."""

from __future__ import annotations

import itertools
import json
import subprocess

import pytest

from conftest import ROOT, gradpipe_command

EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


def run(*args: str) -> subprocess.CompletedProcess:
    return gradpipe_command("run", *args)


@pytest.mark.slow
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


@pytest.mark.slow
def test_run_stops_on_convergence_and_plots(tmp_path):
    png = tmp_path / "run.png"
    result = run(str(ROOT / "examples" / "tfp_minimize.toml"), "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert "converged by          loss_not_decreasing" in result.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "loss" in result.stderr and "lr 0.02" in result.stderr  # progress bar


@pytest.mark.slow
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


def plot_facts(monkeypatch, *args: str) -> list[dict]:
    """What each figure ``gradpipe run ARGS`` saves shows: per axes its value range and
    scale, its lines, its bands' extent and where its legend is, in display pixels."""
    from matplotlib.figure import Figure

    figures: list[dict] = []
    original = Figure.savefig

    def savefig(self: Figure, *a: object, **k: object) -> None:
        original(self, *a, **k)
        renderer = self.canvas.get_renderer()
        legends = [*self.legends, *(ax.get_legend() for ax in self.axes if ax.get_legend())]
        figures.append({
            "legends": [list(leg.get_window_extent(renderer).bounds) for leg in legends],
            "axes": [{
                "box": list(ax.get_window_extent(renderer).bounds),
                "ylim": list(ax.get_ylim()),
                "yscale": ax.get_yscale(),
                "lines": [{"y": [float(v) for v in line.get_ydata()],
                           "alpha": line.get_alpha()} for line in ax.get_lines()],
                "bands": [[float(p.vertices[:, 1].min()), float(p.vertices[:, 1].max())]
                          for band in ax.collections for p in band.get_paths()],
            } for ax in self.axes],
        })

    monkeypatch.setattr(Figure, "savefig", savefig)
    result = run(*args, "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    return figures


@pytest.mark.slow
def test_a_comparison_plot_keeps_its_legend_off_the_lines_and_its_bands_in_range(tmp_path,
                                                                                 monkeypatch):
    """The legend sits outside the axes, and the spread band of a seed whose loss
    falls far below the others' is clipped to the range of the mean lines: the axis
    is not stretched over decades no line reaches."""
    (figure,) = plot_facts(monkeypatch, str(ROOT / "examples" / "quickstart.toml"),
                           "--seeds", "3", "--steps", "300", "--plot", str(tmp_path / "p.png"),
                           "--set", "schedules.lr.learning_rate=0.05,0.1")
    (axes,) = figure["axes"]
    (legend,) = figure["legends"]
    x, y, width, height = axes["box"]
    lx, ly, lwidth, lheight = legend
    assert lx >= x + width or lx + lwidth <= x or ly >= y + height or ly + lheight <= y
    assert axes["yscale"] == "log" and len(axes["bands"]) == 2
    means = [v for line in axes["lines"] for v in line["y"]]
    low, high = axes["ylim"]
    assert min(means) / 3 <= low <= min(means) and max(means) <= high <= 3 * max(means)
    for bottom, top in axes["bands"]:
        assert low <= bottom and top <= high


@pytest.mark.slow
def test_a_single_run_plot_smooths_the_loss(tmp_path, monkeypatch):
    """The loss of each step is drawn faint under its running mean, which is smooth:
    a mini-batch loss alone draws a solid band."""
    (figure,) = plot_facts(monkeypatch, str(ROOT / "examples" / "quickstart.toml"),
                           "--problem", "digits", "--steps", "300",
                           "--plot", str(tmp_path / "p.png"))
    loss = figure["axes"][0]
    raw, mean = loss["lines"]
    assert raw["alpha"] < 0.5 and mean["alpha"] is None
    assert len(raw["y"]) == len(mean["y"]) == 300

    def variation(values):
        return sum(abs(b - a) for a, b in itertools.pairwise(values))

    assert variation(mean["y"]) < variation(raw["y"]) / 2
    assert len(figure["legends"]) == 1  # which line is which
