"""Tensor helpers for writing transforms, dense and sparse (``gradpipe.plugin``).

TensorFlow is imported inside each function: importing this module stays fast.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from .transform import dedupe, in_xla_function


def is_sparse(g: Any) -> bool:
    """Whether ``g`` is ``tf.IndexedSlices`` (an embedding's gradient), not a dense
    tensor."""
    import tensorflow as tf

    return isinstance(g, tf.IndexedSlices)


def dense(g: Any) -> Any:
    """The dense tensor of ``g`` (duplicate IndexedSlices rows are summed)."""
    import tensorflow as tf

    return tf.convert_to_tensor(g) if is_sparse(g) else g


def rowwise(fn: Any, g: Any, slots: Sequence[Any], *, lazy: bool,
            extra: Sequence[Any] = ()) -> tuple[Any, list[Any]]:
    """Run a rule's per-element maths ``fn(g, *slots, *extra) -> (update, new_slots)``.

    With ``lazy`` and an IndexedSlices ``g``, on the touched rows only (duplicate
    indices summed first): the old rows of each slot and of each ``extra`` tensor
    (the variable's value, say) are gathered, and the update and the new slots
    come back as IndexedSlices of those rows, which the engine scatters into the
    variable and its slots. The rows no gradient touches are not read, written
    or decayed (TF Addons' ``LazyAdam``). Otherwise ``g`` is made dense first.
    """
    import tensorflow as tf

    if not (lazy and is_sparse(g)):
        update, new = fn(dense(g), *slots, *extra)
        return update, list(new)
    g = dedupe(g)

    def rows(t: Any) -> Any:
        return tf.gather(t, g.indices)

    def sliced(t: Any) -> Any:
        return tf.IndexedSlices(t, g.indices, g.dense_shape)

    update, new = fn(g.values, *map(rows, slots), *map(rows, extra))
    return sliced(update), [sliced(t) for t in new]


def map_values(g: Any, fn: Any) -> Any:
    """Apply ``fn`` to a dense tensor, or to the values of IndexedSlices."""
    import tensorflow as tf

    if is_sparse(g):
        return tf.IndexedSlices(fn(g.values), g.indices, g.dense_shape)
    return fn(g)


def norm(x: Any) -> Any:
    """Float32 L2 norm of a whole tensor (IndexedSlices: of its dense sum)."""
    import tensorflow as tf

    values = dedupe(x).values if is_sparse(x) else x
    return tf.sqrt(tf.reduce_sum(tf.square(tf.cast(values, tf.float32))))


def slot_dtype(var: Any) -> Any:
    """The dtype of a state slot of ``var``: float32 for a float16 or bfloat16
    variable (a moment kept in half precision underflows and loses the small
    updates), else the variable's own dtype."""
    import tensorflow as tf

    return tf.float32 if var.dtype in (tf.float16, tf.bfloat16) else var.dtype


def zeros_like_vars(variables: list[Any], fill: float = 0.0) -> list[Any]:
    """One tensor per variable, of its shape and :func:`slot_dtype`, every element
    ``fill``: the ``init`` of per-variable slots (``adam``'s moments are two)."""
    import tensorflow as tf

    return [tf.fill(v.shape, tf.constant(fill, slot_dtype(v))) for v in variables]


def value_of(var: Any, dtype: Any) -> Any:
    """The current value of ``var`` (a variable or a tensor) as a tensor of
    ``dtype``: a float16 variable's value in its float32 slot's dtype, say, for
    decoupled weight decay (``update += decay * value_of(var, update.dtype)``)."""
    import tensorflow as tf

    return tf.cast(tf.convert_to_tensor(var), dtype)


def scatter_add(t: Any, indices: Any, values: Any) -> Any:
    """A new tensor: ``t`` with ``values[i]`` added to its row ``indices[i]`` (rows
    named twice get both); how the rows of an ``IndexedSlices`` gradient add
    into a dense tensor."""
    import tensorflow as tf

    return tf.tensor_scatter_nd_add(t, indices[:, None], values)


def slice_values(g: Any) -> Any:
    """The values of IndexedSlices, else ``g`` itself."""
    import tensorflow as tf

    return g.values if isinstance(g, tf.IndexedSlices) else g


def all_finite(tensors: Sequence[Any]) -> Any:
    """One scalar: every non-None tensor is finite (IndexedSlices: values; bool: true)."""
    import tensorflow as tf

    # sum(x * 0) is 0 for finite x and NaN for an Inf or a NaN: one pass to a scalar,
    # 4x cheaper than reduce_all(is_finite(x)) on an embedding step's rows (measured).
    # Not in XLA, which folds (y * c) * 0 into y * 0: 0 where y * c overflowed.
    xla = in_xla_function()
    checks = [t if t.dtype == tf.bool else tf.math.is_finite(t) if t.shape.rank == 0
              else tf.reduce_all(tf.math.is_finite(t)) if xla
              else tf.math.is_finite(tf.reduce_sum(t * 0))
              for t in (slice_values(t) for t in tensors if t is not None)]
    return all_true(checks)


def all_true(flags: Sequence[Any]) -> Any:
    """One bool scalar: every one of ``flags`` (bool tensors) is true everywhere."""
    import tensorflow as tf

    if len(flags) == 1 and flags[0].shape.rank == 0:  # no stack, no second reduce
        return flags[0]
    if not flags:
        return tf.constant(True)
    if in_xla_function():
        # A chain of ands, which XLA fuses into one loop: a stack of scalars made it
        # emit (and compile) a kernel for each, the bulk of a bounded guard's compile
        return functools.reduce(tf.logical_and, [f if f.shape.rank == 0 else
                                                 tf.reduce_all(f) for f in flags])
    return tf.reduce_all(tf.stack(flags))
