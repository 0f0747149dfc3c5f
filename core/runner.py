"""Running a pipeline on a registered problem (``gradpipe run``)."""

from __future__ import annotations

import math
import time
from typing import Any

import attrs

from .components import build_component
from .distribute import is_parameter_server
from .errors import ConfigError, GradpipeError
from .progress import Overall, Progress
from .spec import ComponentSpec, PipelineSpec

DEFAULT_STEPS = 500


def problem_spec_of(spec: PipelineSpec, name: str | None) -> ComponentSpec:
    """The problem to run: ``name`` with its defaults, or the file's ``[problem]``."""
    if name is None:
        if spec.problem is None:
            raise ConfigError("no problem to run: add a [problem] table with "
                              "kind = 'quadratic' (or another problem), or pass --problem")
        return spec.problem
    from .components import component_spec

    return component_spec("problem", {"kind": name})


def built_on(spec: PipelineSpec, problem_spec: ComponentSpec) -> tuple[Any, Any]:
    """A new pipeline, built for a new instance of the problem's variables (made in
    the pipeline's strategy scope: mirrored like its state); ``(pipeline, task)``."""
    from ._engine.pipeline import Pipeline

    pipe = Pipeline(spec)
    with pipe.strategy.scope():
        task = build_component(problem_spec)
    pipe.build(list(task.variables))
    return pipe, task


def check_builds(spec: PipelineSpec, problem_spec: ComponentSpec) -> int:
    """Build the pipeline for the problem's variables and throw both away: what only
    the variables can tell (a ``freeze`` or ``exclude`` pattern that matches none)
    fails now, not after the runs before it. The problem's own number of steps."""
    _, task = built_on(spec, problem_spec)
    return int(getattr(task, "default_steps", DEFAULT_STEPS))


def plan_problem(spec: PipelineSpec, *, problem: str | None = None,
                 shapes: dict[str, list[int]] | None = None) -> str:
    """The plan of the pipeline built for the problem's variables (or for float32
    variables of ``shapes``, by name), as ``pipe.plan`` prints it."""
    import tensorflow as tf

    from ._engine.pipeline import Pipeline

    if shapes is None:
        pipe, task = built_on(spec, problem_spec_of(spec, problem))
        variables = list(task.variables)
    else:
        pipe = Pipeline(spec)
        with pipe.strategy.scope():
            variables = [tf.Variable(tf.zeros(s), name=name)
                         for name, s in shapes.items()]
        pipe.build(variables)
    sizes = [v.shape.num_elements() for v in variables]
    count = f"{len(variables)} variable{'' if len(variables) == 1 else 's'}"
    return (f"plan for {count}, {sum(s or 0 for s in sizes):,} "
            f"parameters:\n{pipe.plan}")


@attrs.frozen(kw_only=True)
class RunResult:
    """One training run: the summary ``gradpipe run`` prints, and the per-step values."""

    summary: dict[str, Any]
    history: dict[str, list[float]]
    #: the problem's headline metric: the first it reports that is not a target
    #: (``test_accuracy`` for ``digits``); ``None`` if it reports none
    metric: str | None = None


def seeded_problem(problem_spec: ComponentSpec, seed: int) -> ComponentSpec:
    """The problem drawn with ``seed``: its own ``seed`` (data, start point) shifted by
    ``seed``, so that every pipeline of one seed sees the same data in the same order."""
    config = problem_spec.config
    if seed == 0 or "seed" not in attrs.fields_dict(type(config)):
        return problem_spec
    return attrs.evolve(problem_spec, config=attrs.evolve(config, seed=config.seed + seed))


def train(spec: PipelineSpec, problem_spec: ComponentSpec, *, steps: int | None = None,
          seed: int = 0, progress: str | None = None, checkpoint_dir: str | None = None,
          checkpoint_every: int = 100, logdir: str | None = None,
          overall: Overall | None = None) -> RunResult:
    """One run: fresh variables and pipeline state, the problem drawn with ``seed``;
    ``progress`` labels the progress line (``None``: none), ``overall`` is the
    comparison's progress it adds to; ``logdir`` receives the TensorBoard summaries
    of the pipeline and the loss."""
    import contextlib

    import tensorflow as tf

    begun = time.perf_counter()
    problem_spec = seeded_problem(problem_spec, seed)
    tf.random.set_seed(seed)
    pipe, task = built_on(spec, problem_spec)
    variables = list(task.variables)
    writer = tf.summary.create_file_writer(logdir) if logdir else None
    with writer.as_default() if writer else contextlib.nullcontext():
        loop = _Loop(pipe, task, variables, checkpoint_dir, checkpoint_every)
        total = steps if steps is not None else getattr(task, "default_steps", DEFAULT_STEPS)
        history, wall, step_seconds = loop.run(total, progress, writer is not None, overall)
    if writer is not None:
        writer.close()
    summary, metrics = _summarize(pipe, task, problem_spec, loop, history, wall)
    # The command's own cost: everything but the steps, counted at their median time
    # (the first step's tracing and compiling is overhead too).
    median = sorted(step_seconds)[len(step_seconds) // 2] if step_seconds else 0.0
    summary["overhead_seconds"] = round(
        time.perf_counter() - begun - median * len(step_seconds), 3)
    headline = next((k for k in metrics if not k.startswith("target")), None)
    return RunResult(summary=summary, history=history, metric=headline)


class _Loop:
    """The training loop of one run, resumable from a checkpoint."""

    def __init__(self, pipe: Any, task: Any, variables: list[Any],
                 checkpoint_dir: str | None, checkpoint_every: int) -> None:
        import tensorflow as tf

        from .convergence import AnyOf, gradient_step

        self.pipe, self.task = pipe, task
        strategy = pipe.strategy
        if is_parameter_server(strategy):
            raise GradpipeError(
                "gradpipe run trains a problem in this process; under parameter servers "
                "your own program is the coordinator that schedules the workers' steps "
                "(docs/distribution.md, \"Parameter servers\", and "
                "examples/parameter_server/train.py)")

        def replica_step(step: tf.Tensor) -> tuple[Any, ...]:
            # Data parallelism: replica r of n takes mini-batch step * n + r.
            ctx = tf.distribute.get_replica_context()
            batch = step * ctx.num_replicas_in_sync + tf.cast(
                ctx.replica_id_in_sync_group, tf.int64)
            lr, scale = pipe.learning_rate, pipe.loss_scale  # before the update moves them
            loss, unscaled, params, _ = gradient_step(pipe, lambda: task.loss(batch),
                                                      variables)
            # For the criteria and the progress line only: the global mean gradient.
            unscaled = ctx.all_reduce(tf.distribute.ReduceOp.SUM, unscaled)
            loss = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, loss)
            return loss, unscaled, params, lr, scale

        @tf.function
        def train_step(step: tf.Tensor) -> tuple[Any, ...]:
            results = strategy.run(replica_step, (step,))
            return tf.nest.map_structure(
                lambda r: strategy.experimental_local_results(r)[0], results)

        self.train_step = train_step
        self.position = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.manager = None
        self.resumed_from = 0
        self.checkpoint_every = checkpoint_every
        if checkpoint_dir:
            ckpt = tf.train.Checkpoint(pipeline=pipe, problem=list(variables),
                                       step=self.position)
            self.manager = tf.train.CheckpointManager(ckpt, checkpoint_dir, max_to_keep=3)
            if self.manager.latest_checkpoint:  # the pipeline's state is matched by name
                ckpt.restore(self.manager.latest_checkpoint).assert_existing_objects_matched()
                self.resumed_from = int(self.position.numpy())
        self.criteria = AnyOf(pipe.criteria) if pipe.criteria else None
        self.converged_by: str | None = None
        self.done = self.resumed_from

    def run(self, total: int, label: str | None, record: bool, overall: Overall | None
            ) -> tuple[dict[str, list[float]], float, list[float]]:
        import tensorflow as tf

        from ._engine.summaries import write_scalar

        check = tf.function(self.criteria.one_step) if self.criteria else None
        bar = Progress(total, label or "", enabled=label is not None,
                       initial=self.resumed_from, overall=overall)
        history: dict[str, list[float]] = {"loss": [], "learning_rate": [], "loss_scale": []}
        step_seconds = []
        start = time.perf_counter()
        state: Any = None
        for i in range(self.resumed_from, total):
            began = time.perf_counter()
            loss, grads, params, lr, scale = self.train_step(tf.constant(i, tf.int64))
            values = (float(loss), float(lr), float(scale))
            step_seconds.append(time.perf_counter() - began)
            self.done = i + 1
            self.position.assign(self.done)
            if self.manager is not None and self.done % self.checkpoint_every == 0:
                self.manager.save(checkpoint_number=self.done)
            for key, value in zip(history, values):
                history[key].append(value)
                if record:
                    # step n: after the n-th update, as history.csv and the pipeline's
                    # own summaries count
                    write_scalar(f"run/{key}", value, step=i + 1)
            if self.criteria is not None and check is not None:
                if state is None:
                    state = self.criteria.bootstrap(loss, grads, params)
                else:
                    flag, which, state = check(tf.constant(i), loss, grads, params, state)
                    if bool(tf.reduce_all(flag)):
                        self.converged_by = self.pipe.criteria[int(which)].name
            bar.update(self.done, *values)
            if self.converged_by:
                break
        bar.close()
        if self.manager is not None:
            self.manager.save(checkpoint_number=self.done)
        return history, time.perf_counter() - start, step_seconds


def _summarize(pipe: Any, task: Any, problem_spec: ComponentSpec, loop: _Loop,
               history: dict[str, list[float]], wall: float) -> tuple[dict[str, Any], list[str]]:
    import tensorflow as tf

    done, resumed_from = loop.done, loop.resumed_from
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
        "converged": loop.converged_by is not None,
        "converged_by": loop.converged_by,
        "final_loss": final_loss,
        "target_reached": bool(reached),
    }
    if hasattr(task, "target_loss"):
        summary["target_loss"] = float(task.target_loss)
        hits = [i + 1 for i, v in enumerate(history["loss"]) if v <= task.target_loss]
        summary["first_step_at_target"] = hits[0] if hits else None
    metrics = task.metrics() if hasattr(task, "metrics") else {}
    summary.update(metrics)
    summary.update({
        "learning_rate": history["learning_rate"][-1] if history["loss"] else math.nan,
        "loss_scale": float(pipe.loss_scale),
        "wall_seconds": round(wall, 3),
        "steps_per_second": round((done - resumed_from) / wall, 1) if wall > 0 else None,
    })
    return summary, list(metrics)


