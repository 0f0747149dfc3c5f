"""TensorBoard scalars from inside the step (``[pipeline] summaries``).

Nothing is written, and no op is added, unless a default ``tf.summary`` writer
is set when the step is traced. Summary ops cannot be compiled by XLA: with a
writer set, ``jit_compile = "auto"`` keeps the step uncompiled.
"""

from __future__ import annotations

from typing import Any

import attrs
import tensorflow as tf

from ..fields import HYPER
from ..spec import PipelineSpec
from ..transform import hyper, squared_norm


def writer_may_record() -> bool:
    """Whether a default ``tf.summary`` writer is set that may record at this trace
    (``False`` only where TensorFlow knows statically that nothing is recorded)."""
    recording = tf.get_static_value(tf.summary.should_record_summaries())
    return recording is None or bool(recording)


def _may_record(step: Any) -> bool:
    """Some summary is wanted and a default writer may record it. Without a writer
    ``tf.summary`` adds no op, but the values handed to it would still be read, and
    TF never prunes a variable read: one per step for ``iterations`` alone."""
    return bool(step.spec.options.summaries) and writer_may_record()


def write_scalar(tag: str, value: Any, step: Any) -> None:
    """A TensorBoard scalar via core ``tf.summary.write``: ``tf.summary.scalar`` would
    need the tensorboard package; the ``scalars`` plugin metadata is all it adds."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    tf.summary.write(tag, tf.cast(value, tf.float32), step=tf.cast(step, tf.int64),
                     metadata=metadata.SerializeToString())


def scheduled_hyperparameters(spec: PipelineSpec) -> list[tuple[str, Any]]:
    """(tag, callable) for every scheduled hyperparameter; call in a build scope."""
    found = []
    for t in spec.transforms:
        for field in attrs.fields(type(t.config)):
            value = getattr(t.config, field.name)
            if field.metadata.get(HYPER) and value is not None and not isinstance(
                    value, (int, float)):
                found.append((f"hyperparameters/{t.path}.{field.name}", hyper(value)))
    return found


def rates_of_this_update(step: Any) -> list[tuple[str, Any]]:
    """(tag, value) of the learning rates and scheduled hyperparameters this update
    uses. Read them before the step counter moves (a schedule follows it): the
    summaries are written after, at the new count, as OpenSeq2Seq logs the rate
    a step used at that step."""
    if not _may_record(step):
        return []
    wanted = set(step.spec.options.summaries)
    pipe, found = step.pipeline, []
    if "learning_rate" in wanted:
        rates = pipe.learning_rates
        if len(rates) > 1:  # rules per variable group: each its own curve
            found += [(f"learning_rate/{path}", rate) for path, rate in rates.items()]
        else:
            found.append(("learning_rate", pipe.learning_rate))
    if "hyperparameters" in wanted:
        found += [(tag, value()) for tag, value in step.scheduled]
    return found


def write_update_summaries(step: Any, grads: list[Any], updates: list[Any],
                           rates: list[tuple[str, Any]]) -> None:
    """Summaries of an applied step (``step``: the engine's Step): ``rates`` (from
    :func:`rates_of_this_update`), norms, factors, update ratios."""
    if not _may_record(step):
        return
    wanted = set(step.spec.options.summaries)
    at = step.counters.iterations
    for tag, value in rates:
        write_scalar(tag, value, step=at)
    if "global_gradient_norm" in wanted:
        norm = step.context.shared.get("global_norm")  # computed once by clipping
        if norm is None:
            norm = tf.sqrt(squared_norm(grads))  # the engine's sum when it has one
        write_scalar("global_gradient_norm", norm, step=at)
    if "clipping_factors" in wanted:
        for slots in step.state.slots.values():
            for name, var in slots.items():
                if name.startswith("clipping_factor/"):
                    write_scalar(f"clipping_factors/{name.split('/', 1)[1]}", var, step=at)
    if "update_ratios" in wanted:
        from ..names import variable_path
        from ..tensors import slice_values

        for var, update in zip(*step.state.per_variable(updates)):
            if update is None:
                continue
            u = tf.norm(tf.cast(slice_values(update), tf.float32))
            w = tf.norm(tf.cast(tf.convert_to_tensor(var), tf.float32))
            write_scalar(f"update_ratios/{variable_path(var)}", tf.math.divide_no_nan(u, w),
                         step=at)


def write_step_summaries(step: Any) -> None:
    """Summaries of every call, applied or skipped."""
    if not _may_record(step):
        return
    wanted = set(step.spec.options.summaries)
    pipe = step.pipeline
    if "loss_scale" in wanted:
        write_scalar("loss_scale", pipe.loss_scale, step=step.counters.iterations)
    if "skipped_steps" in wanted:
        write_scalar("skipped_steps", pipe.skipped_steps, step=step.counters.iterations)
