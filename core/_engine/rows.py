"""Sparse gradients: kept as rows through the chain, or made dense up front.

Where every transform would make a sparse gradient dense anyway, densifying it
before the step lets the step take the fused paths (XLA, in-place kernels);
where some transform keeps rows (a lazy rule, sgd without momentum), the rows
stay rows. Which is found by tracing the chain once, per set of sparse
variables, in a function that never runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

Chain = Callable[[list[Any]], tuple[list[Any], dict[int, Any]]]


class SparseInputs:
    """Makes a step's IndexedSlices dense where the chain makes them dense anyway
    (not under a strategy, whose replicas take the plain path anyway, and where
    all-reducing rows beats the table)."""

    def __init__(self, chain: Chain, dtypes: list[Any], replicas: int) -> None:
        self._chain, self._dtypes, self._replicas = chain, dtypes, replicas
        # sparse gradients' variables -> whether the chain keeps them as rows
        self._keeps_rows: dict[tuple[int, ...], bool] = {}

    def __call__(self, grads: list[Any]) -> list[Any]:
        sparse = tuple(i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices))
        if not sparse or tf.distribute.has_strategy() or self._replicas > 1:
            return grads
        if sparse not in self._keeps_rows:
            self._keeps_rows[sparse] = chain_keeps_rows(self._chain, grads, self._dtypes)
        return grads if self._keeps_rows[sparse] else [
            tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


def chain_keeps_rows(chain: Callable[[list[Any]], tuple[list[Any], dict[int, Any]]],
                     grads: list[Any], dtypes: list[Any]) -> bool:
    """Whether the chain, given these sparse gradients, returns rows (an update or a
    new state as IndexedSlices), or makes them dense anyway: found by tracing it once
    in a function that is never run."""
    found: list[bool] = []

    def probe(*given: Any) -> None:
        updates, new_states = chain(list(given))
        found.append(any(isinstance(t, tf.IndexedSlices)
                         for t in tf.nest.flatten([updates, list(new_states.values())])))

    tf.function(probe, autograph=False).get_concrete_function(
        *[_spec(g, dtype) for g, dtype in zip(grads, dtypes)])
    return found[0]


def _spec(g: Any, dtype: Any) -> Any:
    """The spec of ``g`` as the chain sees it: unscaled into its compute dtype."""
    if g is None:
        return None
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlicesSpec(
            shape=g.shape, dtype=dtype, indices_dtype=g.indices.dtype,
            dense_shape_dtype=None if g.dense_shape is None else g.dense_shape.dtype)
    return tf.TensorSpec(g.shape, dtype)
