"""The pictures of ``gradpipe run``: one run's curves, and several runs overlaid."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .errors import GradpipeError


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise GradpipeError("--plot needs matplotlib: pip install 'gradpipe[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def supported_formats() -> set[str]:
    """The image formats ``--plot`` may name (a GradpipeError without matplotlib)."""
    plt = _pyplot()
    figure = plt.figure()
    try:
        return set(figure.canvas.get_supported_filetypes())
    finally:
        plt.close(figure)


def _spans_decades(values: Sequence[float]) -> bool:
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return bool(positive) and max(positive) / min(positive) > 100


def plot_history(history: dict[str, list[float]], path: str, title: str) -> None:
    """Loss, learning rate and loss scale over steps, stacked, as a PNG."""
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), dpi=120, sharex=True)
    labels = {"loss": "loss", "learning_rate": "learning rate", "loss_scale": "loss scale"}
    for ax, (key, values) in zip(axes, history.items()):
        ax.plot(range(len(values)), values, linewidth=1.5)
        ax.set_ylabel(labels[key])
        ax.grid(True, alpha=0.3)
        if key != "learning_rate" and _spans_decades(values):
            ax.set_yscale("log")
    axes[-1].set_xlabel("step")
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_comparison(curves: dict[str, list[list[float]]], path: str, title: str) -> None:
    """Each pipeline's loss over steps: the mean over seeds as a line, the spread
    (lowest to highest seed) as a band; a log axis when the losses span decades."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    everything: list[float] = []
    # Mini-batch losses are noisy: average over windows of 1% of the steps.
    window = max(1, max(len(r) for runs in curves.values() for r in runs) // 100)
    for label, runs in curves.items():
        length = min(len(r) for r in runs)  # a run may stop early on convergence
        columns = [[r[i] for r in runs] for i in range(length)]
        mean = _windowed([sum(c) / len(c) for c in columns], window)
        (line,) = ax.plot(range(1, length + 1), mean, linewidth=1.5,
                          label=label + (f" ({len(runs)} seeds)" if len(runs) > 1 else ""))
        if len(runs) > 1:
            ax.fill_between(range(1, length + 1), _windowed([min(c) for c in columns], window),
                            _windowed([max(c) for c in columns], window),
                            color=line.get_color(), alpha=0.2)
        everything += mean
    if _spans_decades(everything):
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss" if window == 1 else f"loss (mean of the last {window} steps)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _windowed(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out
