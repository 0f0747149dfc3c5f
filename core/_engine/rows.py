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

from ..names import variable_path
from ..transform import build_scope
from .plan import replicated

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
        if not sparse or replicated(self._replicas):
            return grads
        if sparse not in self._keeps_rows:
            self._keeps_rows[sparse] = chain_keeps_rows(self._chain, grads, self._dtypes)
        return grads if self._keeps_rows[sparse] else [
            tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


def chain_keeps_rows(chain: Chain, grads: list[Any], dtypes: list[Any]) -> bool:
    """Whether the chain, given these sparse gradients, returns rows (an update or a
    new state as IndexedSlices), or makes them dense anyway: found by tracing it once
    in a function that is never run, for the sparse gradients alone (the dense ones
    as absent: a transformer's one embedding then traces one variable's maths, not
    67, 0.3 to 1 s of its first step), and for all of them where a transform cannot
    take that."""
    sparse_only = [g if isinstance(g, tf.IndexedSlices) else None for g in grads]
    some_dense = any(g is not None and not isinstance(g, tf.IndexedSlices) for g in grads)
    for given in (sparse_only, grads)[:1 + some_dense]:  # no dense one: one list, once
        try:
            return _returns_rows(chain, given, dtypes)
        except Exception:  # a chain that needs every gradient: given them all
            continue
    return False  # a transform written for dense gradients only: give it them


def _returns_rows(chain: Chain, grads: list[Any], dtypes: list[Any]) -> bool:
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


def describe_rows(step: Any, packed: bool) -> tuple[bool, str]:
    """For the plan: which variables a sparse gradient (an embedding lookup's) updates
    by rows, and why the others are made dense. ``step``: a built ``Step``.

    Found by tracing each transform in turn, in a function that is never run, with a
    sparse gradient for one variable of each distinct shape, dtype and selection."""
    variables, masks = step.state.variables, step.state.masks
    if packed:
        return False, "the state is packed into one vector, where rows are made dense"
    groups: dict[Any, list[int]] = {}
    for j, v in enumerate(variables):
        if v.shape.rank and not step.state.frozen[j]:
            key = (tuple(v.shape), v.dtype, tuple(m[j] for m in masks))
            groups.setdefault(key, []).append(j)
    if not groups:
        return False, "no variable has rows (every one is a scalar or frozen)"
    lookup = "a sparse gradient (an embedding lookup's)"
    firsts = {members[0] for members in groups.values()}
    try:
        dense_by = _first_to_densify(step, firsts)
    except _Refused as refused:
        t = step.spec.transforms[refused.index]
        return False, (f"{lookup} is made dense before the step: {t.name} at {t.path} "
                       f"fails on one ({type(refused.cause).__name__}), so it gets dense "
                       "gradients")
    by_rows = [j for members in groups.values() for j in members
               if dense_by[members[0]] is None]
    candidates = sum(len(members) for members in groups.values())

    def named(indices: set[int]) -> str:
        return ", ".join(f"{t.name} at {t.path}" + (
            f" with lazy = {str(t.config.lazy).lower()}" if hasattr(t.config, "lazy") else "")
            for t in (step.spec.transforms[i] for i in sorted(indices)))

    densifying = named({i for i in dense_by.values() if i is not None})
    if not by_rows:
        return False, f"{lookup} is made dense by {densifying}"
    keeping = named({max(i for i, m in enumerate(masks) if m[j]) for j in by_rows})
    which = ("for every variable" if len(by_rows) == candidates else
             f"for {len(by_rows)} of {candidates} variables (" + ", ".join(
                 variable_path(variables[j]) for j in by_rows[:4])
             + (f" and {len(by_rows) - 4} more" if len(by_rows) > 4 else "") + ")")
    text = (f"{which}, {lookup} updates only the rows it touches, on the plain step "
            f"(by {keeping})")
    return True, text + (f"; the others would get a sparse gradient made dense, by "
                         f"{densifying}" if densifying else "")


def _first_to_densify(step: Any, sparse: set[int]) -> dict[int, int | None]:
    """For each variable in ``sparse``, the first transform that turns its sparse
    gradient into a dense update, ``None`` where it stays rows to the end."""
    found: dict[int, int | None] = {j: None for j in sparse}
    skip = set(step.plan.clip_before_reduce)

    def probe(*given: Any) -> None:
        updates = list(given)
        for i in range(len(step.spec.transforms)):
            if i in skip:
                continue
            try:
                updates = step.run_chain(updates, only={i})[0]
            except Exception as exc:
                raise _Refused(i, exc) from exc
            for j in sparse:
                if found[j] is None and not isinstance(updates[j], tf.IndexedSlices):
                    found[j] = i

    specs = [tf.IndexedSlicesSpec(shape=v.shape, dtype=dtype, indices_dtype=tf.int64,
                                  dense_shape_dtype=tf.int64)
             if j in sparse else None
             for j, (v, dtype) in enumerate(zip(step.state.variables,
                                                 step.state.compute_dtypes))]
    with build_scope(step.context):
        try:
            tf.function(probe, autograph=False).get_concrete_function(*specs)
        finally:
            step.context.shared.clear()
    return found


class _Refused(Exception):
    """Transform ``index`` failed on a sparse gradient: the step gives it dense ones."""

    def __init__(self, index: int, cause: Exception) -> None:
        super().__init__(index, cause)
        self.index, self.cause = index, cause
