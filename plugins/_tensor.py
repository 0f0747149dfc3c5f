"""Small tensor helpers shared by the built-in transforms (dense and sparse).

Not a plugin: it registers nothing and is imported lazily by plugin code.
"""

from __future__ import annotations

from typing import Any

from gradpipe.transform import dedupe


def is_sparse(g: Any) -> bool:
    import tensorflow as tf

    return isinstance(g, tf.IndexedSlices)


def dense(g: Any) -> Any:
    """The dense tensor of ``g`` (duplicate IndexedSlices rows are summed)."""
    import tensorflow as tf

    return tf.convert_to_tensor(g) if is_sparse(g) else g


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
    import tensorflow as tf

    return tf.float32 if var.dtype in (tf.float16, tf.bfloat16) else var.dtype


def zeros_like_vars(variables: list[Any], fill: float = 0.0) -> list[Any]:
    import tensorflow as tf

    return [tf.fill(v.shape, tf.constant(fill, slot_dtype(v))) for v in variables]


def value_of(var: Any, dtype: Any) -> Any:
    import tensorflow as tf

    return tf.cast(tf.convert_to_tensor(var), dtype)


def scatter_add(t: Any, indices: Any, values: Any) -> Any:
    import tensorflow as tf

    return tf.tensor_scatter_nd_add(t, indices[:, None], values)
