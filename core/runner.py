"""Running a pipeline on a registered problem (``gradpipe run``)."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from .components import build_component
from .errors import ConfigError
from .spec import ComponentSpec, PipelineSpec

DEFAULT_STEPS = 500


def _problem_spec(spec: PipelineSpec, name: str | None) -> ComponentSpec:
    if name is None:
        if spec.problem is None:
            raise ConfigError("no problem to run: add a [problem] table with "
                              "kind = 'quadratic' (or another problem), or pass --problem")
        return spec.problem
    from .components import component_spec

    return component_spec("problem", {"kind": name})


def plan_problem(spec: PipelineSpec, *, problem: str | None = None,
                 shapes: list[list[int]] | None = None) -> str:
    """The plan of the pipeline built for the problem's variables (or for float32
    variables of ``shapes``), as ``pipe.plan`` prints it."""
    import tensorflow as tf

    from ._engine.pipeline import Pipeline

    pipe = Pipeline(spec)
    with pipe.strategy.scope():
        if shapes is None:
            variables = list(build_component(_problem_spec(spec, problem)).variables)
        else:
            variables = [tf.Variable(tf.zeros(s), name=f"variable_{i}")
                         for i, s in enumerate(shapes)]
    pipe.build(variables)
    sizes = [v.shape.num_elements() for v in variables]
    count = f"{len(variables)} variable{'' if len(variables) == 1 else 's'}"
    return (f"plan for {count}, {sum(s or 0 for s in sizes):,} "
            f"parameters:\n{pipe.plan}")


def run_problem(spec: PipelineSpec, *, problem: str | None = None,
                steps: int | None = None, seed: int = 0, progress: bool = True,
                plot: str | None = None, checkpoint_dir: str | None = None,
                checkpoint_every: int = 100) -> dict[str, Any]:
    """Train the problem with the pipeline until convergence or ``steps``; summarize."""
    problem_spec = _problem_spec(spec, problem)
    import tensorflow as tf

    from ._engine.pipeline import Pipeline
    from .convergence import AnyOf, gradient_step

    tf.random.set_seed(seed)
    pipe = Pipeline(spec)
    strategy = pipe.strategy
    with strategy.scope():  # the problem's variables are mirrored like the state
        task = build_component(problem_spec)
    variables = list(task.variables)
    pipe.build(variables)

    def replica_step(step: tf.Tensor) -> tuple[Any, ...]:
        # Data parallelism: replica r of n takes mini-batch step * n + r.
        ctx = tf.distribute.get_replica_context()
        batch = step * ctx.num_replicas_in_sync + tf.cast(ctx.replica_id_in_sync_group,
                                                          tf.int64)
        lr, scale = pipe.learning_rate, pipe.loss_scale  # before the update moves them
        loss, unscaled, params, _ = gradient_step(pipe, lambda: task.loss(batch), variables)
        # For the criteria and the progress bar only: the global mean gradient.
        unscaled = ctx.all_reduce(tf.distribute.ReduceOp.SUM, unscaled)
        loss = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, loss)
        return loss, unscaled, params, lr, scale

    @tf.function
    def train_step(step: tf.Tensor) -> tuple[Any, ...]:
        results = strategy.run(replica_step, (step,))
        return tf.nest.map_structure(lambda r: strategy.experimental_local_results(r)[0],
                                     results)

    position = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    manager = None
    resumed_from = 0
    if checkpoint_dir:
        ckpt = tf.train.Checkpoint(pipeline=pipe, problem=list(variables), step=position)
        manager = tf.train.CheckpointManager(ckpt, checkpoint_dir, max_to_keep=3)
        if manager.latest_checkpoint:  # the pipeline's state is matched by name
            ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
            resumed_from = int(position.numpy())

    criteria = AnyOf(pipe.criteria) if pipe.criteria else None
    check = tf.function(criteria.one_step) if criteria else None
    total = steps if steps is not None else getattr(task, "default_steps", DEFAULT_STEPS)
    bar = _Progress(total, enabled=progress)
    history: dict[str, list[float]] = {"loss": [], "learning_rate": [], "loss_scale": []}
    start = time.perf_counter()
    state: Any = None
    converged_by = None
    done = resumed_from
    for i in range(resumed_from, total):
        loss, grads, params, lr, scale = train_step(tf.constant(i, tf.int64))
        done = i + 1
        position.assign(done)
        if manager is not None and done % checkpoint_every == 0:
            manager.save(checkpoint_number=done)
        for key, value in zip(history, (loss, lr, scale)):
            history[key].append(float(value))
        if criteria is not None and check is not None:
            if state is None:
                state = criteria.bootstrap(loss, grads, params)
            else:
                flag, which, state = check(tf.constant(i), loss, grads, params, state)
                if bool(tf.reduce_all(flag)):
                    converged_by = pipe.criteria[int(which)].name
        bar.update(done, history["loss"][-1], history["learning_rate"][-1],
                   history["loss_scale"][-1])
        if converged_by:
            break
    bar.close()
    if manager is not None:
        manager.save(checkpoint_number=done)
    wall = time.perf_counter() - start
    final_loss = float(task.loss(tf.constant(done, tf.int64)))
    reached = (task.succeeded(final_loss) if hasattr(task, "succeeded")
               else final_loss <= task.target_loss)
    summary: dict[str, Any] = {
        "problem": problem_spec.name,
        "placement": pipe.placement.description if pipe.placement else "current",
        "replicas": int(pipe.strategy.num_replicas_in_sync),
        "steps": done,
        "resumed_from_step": resumed_from,
        "applied_updates": int(pipe.iterations.numpy()),
        "skipped_steps": int(pipe.skipped_steps.numpy()),
        "converged": converged_by is not None,
        "converged_by": converged_by,
        "final_loss": final_loss,
        "target_reached": bool(reached),
    }
    if hasattr(task, "target_loss"):
        summary["target_loss"] = float(task.target_loss)
        hits = [i + 1 for i, v in enumerate(history["loss"]) if v <= task.target_loss]
        summary["first_step_at_target"] = hits[0] if hits else None
    if hasattr(task, "metrics"):
        summary.update(task.metrics())
    summary.update({
        "learning_rate": history["learning_rate"][-1] if history["loss"] else math.nan,
        "loss_scale": float(pipe.loss_scale),
        "wall_seconds": round(wall, 3),
        "steps_per_second": round((done - resumed_from) / wall, 1) if wall > 0 else None,
    })
    if plot:
        plot_history(history, plot, title=f"{problem_spec.name}: {spec.source or 'pipeline'}")
    return summary


def plot_history(history: dict[str, list[float]], path: str, title: str) -> None:
    """Loss, learning rate and loss scale over steps, stacked, as a PNG."""
    from .errors import GradpipeError

    try:
        import matplotlib
    except ImportError:  # pragma: no cover - optional dependency
        raise GradpipeError("--plot needs matplotlib: pip install 'gradpipe[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 7), dpi=120, sharex=True)
    labels = {"loss": "loss", "learning_rate": "learning rate", "loss_scale": "loss scale"}
    for ax, (key, values) in zip(axes, history.items()):
        ax.plot(range(len(values)), values, linewidth=1.5)
        ax.set_ylabel(labels[key])
        ax.grid(True, alpha=0.3)
        positive = [v for v in values if v > 0 and math.isfinite(v)]
        if key != "learning_rate" and positive and max(positive) / min(positive) > 100:
            ax.set_yscale("log")
    axes[-1].set_xlabel("step")
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


class _Progress:
    """A small progress bar on stderr (no dependency)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = max(total, 1)
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last = -1

    def update(self, done: int, loss: float, lr: float, scale: float) -> None:
        if not self.enabled:
            return
        percent = int(100 * done / self.total)
        step = 1 if self.tty else 10
        if percent // step == self.last // step and done != self.total:
            return
        self.last = percent
        filled = int(30 * done / self.total)
        text = (f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} "
                f"loss {loss:.4g}  lr {lr:.3g}  scale {scale:.4g}")
        print(("\r" if self.tty else "") + text, end="" if self.tty else "\n",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)
