"""Evaluating and plotting the schedules of a pipeline file (``gradpipe schedule``)."""

from __future__ import annotations

import os
from typing import Any

import attrs

from .components import build_component
from .errors import ConfigError, GradpipeError
from .fields import HYPER, ScheduleRef
from .hints import did_you_mean
from .spec import ComponentSpec, PipelineSpec


def schedule_specs(spec: PipelineSpec) -> dict[str, ComponentSpec]:
    """Every schedule of the file: named ones, then inline ones by key path."""
    found: dict[str, ComponentSpec] = dict(spec.schedules)
    for comp in spec.components():
        if comp.kind == "schedule":
            continue
        for field in attrs.fields(type(comp.config)):
            value = getattr(comp.config, field.name)
            if field.metadata.get(HYPER) and isinstance(value, ComponentSpec):
                found[f"{comp.path}.{field.name}"] = value
    return found


def evaluate(spec: PipelineSpec, steps: int, name: str | None = None) -> dict[str, list[float]]:
    """Values of each schedule (or of the one named) at steps ``0 .. steps-1``."""
    specs = schedule_specs(spec)
    if name is not None:
        if name not in specs:
            raise ConfigError(f"no schedule named {name!r}{did_you_mean(name, specs)}; "
                              f"the file has: {', '.join(specs) or 'none'}")
        specs = {name: specs[name]}
    if not specs:
        raise ConfigError("the file defines no schedule: add [schedules.NAME] or use an "
                          "inline schedule table for a hyperparameter")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from .transform import BuildContext, build_scope

    built: dict[str, Any] = {}

    def resolve(value: Any) -> Any:
        if isinstance(value, ScheduleRef):
            if value.name not in built:
                built[value.name] = build_component(spec.schedules[value.name])
            return built[value.name]
        return build_component(value)

    context = BuildContext(step=lambda: tf.constant(0, tf.int64), resolve_schedule=resolve)
    grid = tf.range(steps, dtype=tf.int64)
    out: dict[str, list[float]] = {}
    with build_scope(context):
        for label, comp in specs.items():
            schedule = resolve(ScheduleRef(label)) if label in spec.schedules else resolve(comp)
            out[label] = [float(v) for v in tf.reshape(schedule(grid), [-1]).numpy()]
    return out


def plot(series: dict[str, list[float]], path: str, title: str, log: bool = False) -> None:
    """One line per schedule, labelled axes, legend; written as PNG."""
    try:
        import matplotlib
    except ImportError:  # pragma: no cover - matplotlib is an optional dependency
        raise GradpipeError("--plot needs matplotlib: pip install 'gradpipe[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for label, values in series.items():
        ax.plot(range(len(values)), values, label=label, linewidth=1.8)
    ax.set_xlabel("step")
    ax.set_ylabel("value")
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.margins(x=0)
    ax.legend(loc="best", frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
