"""Running a pipeline on a registered problem (``gradpipe run``)."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from .build import build_component
from .errors import ConfigError
from .spec import ComponentSpec, PipelineSpec

DEFAULT_STEPS = 500


def _problem_spec(spec: PipelineSpec, name: str | None) -> ComponentSpec:
    if name is None:
        if spec.problem is None:
            raise ConfigError("no problem to run: add a [problem] table with "
                              "kind = 'quadratic' (or another problem), or pass --problem")
        return spec.problem
    from .build import component_spec

    return component_spec("problem", {"kind": name})


def run_problem(spec: PipelineSpec, *, problem: str | None = None,
                steps: int | None = None, seed: int = 0,
                progress: bool = True) -> dict[str, Any]:
    """Train the problem with the pipeline; return a summary dict."""
    problem_spec = _problem_spec(spec, problem)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's start-up noise out
    import tensorflow as tf

    from .pipeline import Pipeline

    tf.random.set_seed(seed)
    task = build_component(problem_spec)
    pipe = Pipeline(spec)
    variables = list(task.variables)
    pipe.build(variables)

    @tf.function
    def train_step(step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = task.loss(step)
            scaled = pipe.scale_loss(loss)
        grads = tape.gradient(scaled, variables)
        applied = pipe.apply_gradients(zip(grads, variables))
        return loss, applied

    total = steps if steps is not None else DEFAULT_STEPS
    bar = _Progress(total, enabled=progress)
    start = time.perf_counter()
    loss_value = math.nan
    done = 0
    reached_at = None
    for i in range(total):
        loss, _ = train_step(tf.constant(i, tf.int64))
        loss_value = float(loss)
        done = i + 1
        if reached_at is None and loss_value <= task.target_loss:
            reached_at = done
        bar.update(done, loss_value, float(pipe.loss_scale))
    bar.close()
    wall = time.perf_counter() - start
    final_loss = float(task.loss(tf.constant(done, tf.int64)))
    summary: dict[str, Any] = {
        "problem": problem_spec.name,
        "steps": done,
        "applied_updates": int(pipe.iterations),
        "skipped_steps": int(pipe.skipped_steps),
        "final_loss": final_loss,
        "target_loss": float(task.target_loss),
        "target_reached": final_loss <= task.target_loss,
        "first_step_at_target": reached_at,
    }
    if hasattr(task, "metrics"):
        summary.update(task.metrics())
    summary.update({
        "loss_scale": float(pipe.loss_scale),
        "wall_seconds": round(wall, 3),
        "steps_per_second": round(done / wall, 1) if wall > 0 else None,
    })
    return summary


class _Progress:
    """A small progress bar on stderr (no dependency)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = max(total, 1)
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last = -1

    def update(self, done: int, loss: float, scale: float) -> None:
        if not self.enabled:
            return
        percent = int(100 * done / self.total)
        if not self.tty and percent // 10 == self.last // 10 and done != self.total:
            return
        if self.tty and percent == self.last and done != self.total:
            return
        self.last = percent
        filled = int(30 * done / self.total)
        text = (f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} "
                f"loss {loss:.4g} scale {scale:.4g}")
        print(("\r" if self.tty else "") + text, end="" if self.tty else "\n",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)
