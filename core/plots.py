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
        raise GradpipeError("the plots (--plot, and the one --output DIR writes) need "
                            "matplotlib: pip install 'gradpipe[plot]'") from None
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
    """Loss, learning rate and loss scale over steps, stacked, as a PNG. The loss of
    each step is drawn faint, under its running mean (see ``_window``)."""
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), dpi=120, sharex=True)
    labels = {"loss": "loss", "learning_rate": "learning rate", "loss_scale": "loss scale"}
    for ax, (key, values) in zip(axes, history.items()):
        steps = range(1, len(values) + 1)  # step n: after the n-th update
        window = _window(len(values))
        if key == "loss" and window > 1:
            (raw,) = ax.plot(steps, values, linewidth=0.6, alpha=0.3, label="each step")
            ax.plot(steps, _windowed(values, window), linewidth=1.5, color=raw.get_color(),
                    label=f"mean of the last {window} steps")
            ax.legend(loc="upper right", framealpha=0.8, fontsize="small")
        else:
            ax.plot(steps, values, linewidth=1.5)
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
    (lowest to highest seed) as a band; a log axis when the losses span decades.

    The axis spans the mean lines, and each band is clipped to it: one seed whose
    loss falls to 1e-12 would otherwise stretch a log axis over decades no line
    reaches. The legend goes below the axes, where it cannot hide a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5 + 0.2 * len(curves)), dpi=120, layout="constrained")
    window = _window(max(len(r) for runs in curves.values() for r in runs))
    drawn = []
    for label, runs in curves.items():
        length = min(len(r) for r in runs)  # a run may stop early on convergence
        columns = [[r[i] for r in runs] for i in range(length)]
        mean = _windowed([sum(c) / len(c) for c in columns], window)
        (line,) = ax.plot(range(1, length + 1), mean, linewidth=1.5,
                          label=label + (f" ({len(runs)} seeds)" if len(runs) > 1 else ""))
        band = ((_windowed([min(c) for c in columns], window),
                 _windowed([max(c) for c in columns], window)) if len(runs) > 1 else None)
        drawn.append((line, band))
    means = [v for line, _ in drawn for v in line.get_ydata()]
    log = _spans_decades(means)
    if log:
        ax.set_yscale("log")
    low, high = _limits(means, log)
    ax.set_ylim(low, high)
    for line, band in drawn:
        if band is not None:
            clip = [[min(max(v, low), high) for v in edge] for edge in band]
            ax.fill_between(line.get_xdata(), *clip, color=line.get_color(), alpha=0.2,
                            linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel("loss" if window == 1 else f"loss (mean of the last {window} steps)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside lower center", ncols=1 if len(curves) > 3 else len(curves),
               fontsize="small", frameon=False)
    fig.savefig(path)
    plt.close(fig)


def _window(steps: int) -> int:
    """Mini-batch losses are noisy: curves are averaged over 1% of the steps."""
    return max(1, steps // 100)


def _limits(values: Sequence[float], log: bool) -> tuple[float, float]:
    """The value axis around ``values``, with a margin (5% of the span, in decades
    on a log axis)."""
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return (1e-3, 1.0) if log else (0.0, 1.0)
    low, high = min(finite), max(finite)
    if log:
        margin = (high / low) ** 0.05 if high > low else 2.0
        return low / margin, high * margin
    margin = 0.05 * (high - low) or max(abs(high), 1.0) * 0.05
    return low - margin, high + margin


def _windowed(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out
