"""Gradient accumulation: ``accumulation_steps = k`` applies the mean of k micro-steps.

Each finite micro-step adds its gradients to one float32 accumulator per
variable (a non-finite one is skipped and counted, and adds nothing); the k-th
applies the mean through the ordinary update, guard included, and clears the
accumulators only once that update has run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf


def accumulate_then_update(accumulators: dict[str, tf.Variable], micro_steps: tf.Variable,
                           grads: list[Any], finite: tf.Tensor, k: int,
                           update: Callable[[list[Any]], tf.Tensor],
                           reject: Callable[[], tf.Tensor]) -> tf.Tensor:
    """Add ``grads`` where ``finite`` (else ``reject()``); every k-th micro-step,
    ``update(mean)``. True where the weights were updated."""

    def add() -> tf.Tensor:
        micro = micro_steps.assign_add(1)
        _add(accumulators, grads)
        return tf.equal(micro % k, 0)

    complete = tf.cond(finite, add, reject)

    def apply() -> tf.Tensor:
        mean = [None if g is None else acc.read_value() / float(k)
                for acc, g in zip(accumulators.values(), grads)]
        applied = update(mean)
        with tf.control_dependencies([applied]):
            for acc in accumulators.values():
                acc.assign(tf.zeros_like(acc))
        return tf.identity(applied)

    return tf.cond(complete, apply, lambda: tf.constant(False))


def _add(accumulators: dict[str, tf.Variable], grads: list[Any]) -> None:
    for acc, g in zip(accumulators.values(), grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            acc.scatter_add(tf.IndexedSlices(tf.cast(g.values, acc.dtype), g.indices,
                                             g.dense_shape))
        else:
            acc.assign_add(tf.cast(g, acc.dtype))
