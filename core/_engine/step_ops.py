"""The tensor-level pieces of one step: unscaling, finiteness, in-place writes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ..tensors import all_finite
from ..transform import in_xla_function, record_squared_norm, sum_of_squares


def unscale(g: Any, scale: tf.Tensor, dtype: tf.DType, reciprocal: bool) -> Any:
    """``g / scale`` in ``dtype`` (division, as Keras does: exact for any scale).

    For a scale that is always a power of two in the normal range (``reciprocal``),
    ``g * (1/scale)`` is the same, bit for bit, and a multiplication is cheaper.
    """
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(unscale(g.values, scale, dtype, reciprocal), g.indices,
                                g.dense_shape)
    if reciprocal and dtype in (tf.float32, tf.float64):
        return tf.cast(g, dtype) * tf.cast(1.0 / scale, dtype)
    return tf.cast(g, dtype) / tf.cast(scale, dtype)


def finite_outputs(outputs: Sequence[Any], state: Sequence[Any]) -> tf.Tensor:
    """Whether a transform's updates and new state are all finite, from one sum over
    them; the sum of the updates' squares is recorded for the next transform (its
    global norm, a proof's bound). Compiled, each square carries ``+ x*0``, so the
    sum is NaN exactly where an element is not finite: no conditional, whose
    operands would be the size of the parameters. Elsewhere only a sum that
    overflows (or is NaN) has the elements checked one by one."""
    updates = [u for u in outputs if u is not None]
    seen = {id(u) for u in updates}  # a state that is its updates (an EMA) is summed once
    # Rows (IndexedSlices updates, and state leaves given as the rows they change) are
    # checked element by element: a few rows, where a sum "as if dense" would first
    # sum their duplicate indices; the norm recorded is then not theirs to give.
    rows = [t.values for t in [*updates, *state] if isinstance(t, tf.IndexedSlices)]
    updates = [u for u in updates if not isinstance(u, tf.IndexedSlices)]
    leaves = [t for t in state if isinstance(t, (tf.Tensor, tf.Variable))
              and t.dtype.is_floating and id(t) not in seen]
    if rows and not updates and not leaves:
        return all_finite(rows)
    compiled = in_xla_function()
    total = sum_of_squares(updates, nan_unless_finite=compiled)
    if not rows:
        record_squared_norm(list(outputs), total)
    if leaves:
        total = total + sum_of_squares(leaves, nan_unless_finite=compiled)
    if compiled:
        finite = tf.logical_not(tf.math.is_nan(total))
    else:
        finite = tf.cond(tf.math.is_finite(total), lambda: tf.constant(True),
                         lambda: all_finite(updates + leaves))
    return finite & all_finite(rows) if rows else finite


def finite_and_record_norm(grads: Sequence[Any], unscaled: Any, scaled: Any,
                            scale: tf.Tensor | None, of_sum: bool = False) -> tf.Tensor:
    """Whether every gradient is finite, from the pass that also yields their norm.

    Dense gradients: the float32 sum of squares is finite exactly when every
    element is, unless it overflows; only then are the elements checked one by
    one. The sum is recorded for ``squared_norm``, so global-norm clipping reuses
    it: one read of the gradients serves the finite check and the norm. With a
    power-of-two loss scale S the sum is taken over the scaled gradients
    (``scaled``, else ``None``) and divided by S**2, which is exact. The rare
    branches recompute the unscaled gradients (``unscaled()``) from the scaled
    ones, so the common path never holds them: XLA fuses the unscaling into the
    update. ``of_sum``: whether the sum is finite, no more; the caller checks the
    elements where it is not.
    """
    present = [g for g in grads if g is not None]
    if not present or any(isinstance(g, tf.IndexedSlices) for g in present):
        return all_finite(present)
    if scaled is None:
        total = sum_of_squares(grads)
    else:
        inverse = 1.0 / tf.cast(scale, tf.float32)
        scaled_total = sum_of_squares(scaled)
        # Only an overflow (or underflow) of the scaled sum needs the unscaled one.
        total = tf.cond(tf.math.is_finite(scaled_total) & (scaled_total < 2.0**100),
                        lambda: scaled_total * inverse * inverse,
                        lambda: sum_of_squares(unscaled()))
    record_squared_norm(grads, total)
    if of_sum:
        return tf.math.is_finite(total)
    return tf.cond(tf.math.is_finite(total), lambda: tf.constant(True),
                   lambda: all_finite(unscaled()))


def real_branch_marker(counter: tf.Variable) -> tf.Tensor:
    """``True``, computed by an op XLA does not count as elementwise (a cumsum).

    XLA turns a conditional whose branches hold only elementwise ops into
    selects: the update is then computed on every call, skipped or not, and
    every new slot value is computed from old values that the in-place writes
    overwrite, so XLA first copies every slot. One such op keeps the update a
    real conditional, measured 12-16% faster (benchmarks/HISTORY.md).
    """
    value = counter.read_value()
    return tf.math.cumsum(tf.stack([value, value + 1]))[1] > value


def subtract_update(var: tf.Variable, update: Any) -> Any:
    if isinstance(update, tf.IndexedSlices):
        return var.scatter_sub(tf.IndexedSlices(tf.cast(update.values, var.dtype),
                                                update.indices, update.dense_shape))
    return var.assign_sub(tf.cast(update, var.dtype))


def value_after(variable: Any, write: Any) -> tf.Tensor:
    """A scalar of ``variable``'s value once ``write`` has run: a data dependency on
    the write, which XLA orders by (it ignores control dependencies)."""
    with tf.control_dependencies([write]):
        return tf.reduce_sum(tf.reshape(variable.read_value(), [-1])[:1])


def exactly_one_after(value: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """1 in ``dtype``, computed from ``value``: multiplying by it changes nothing, bit
    for bit (no NaN can leak from ``value``), yet orders the product after ``value``.
    ``0 * c`` with ``c`` in {0, 1} is exact, and no simplification removes it."""
    used = tf.cast(tf.math.is_finite(tf.cast(value, tf.float32)), dtype)
    return 1 - 0 * used
