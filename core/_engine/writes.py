"""The writes of one step: new states, updates subtracted, packed slices.

Compiled (``applies`` given), nothing is conditional: a skipped step's updates
are dropped by a select, and a slot is written after its variable where the
variable's update reads the old slot, so that XLA writes both in place.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from .sequence import VariableSequence
from .state import StateStore
from .step_ops import subtract_update, value_after


def assign(store: Any, new_states: dict[int, Any], updates: list[Any],
           applies: tf.Tensor | None = None,
           sequence: VariableSequence | None = None,
           kept: set[int] | None = None) -> list[Any]:
    """Subtract the updates (dropped where ``applies`` is false), write the new states
    (``store``: the ``StateStore``, or one variable's view of it), then refresh half-
    precision variables from their masters. With a ``sequence``, each variable's new
    value then gates the next one's gradient. Compiled (``applies``), each slot the
    engine kept is written after its variable, whose update reads the old slot: XLA then
    updates both in place. A slot the transform kept itself (``kept``: ids,
    ``keep_where_skipped``) is not ordered: its update reads the slot as written."""
    ops: list[Any] = []
    written: dict[int, tf.Tensor] = {}
    if store.packing is not None:  # _subtract_packed applies it to the variables
        update = updates[0]
        if store.present is not None:
            update = tf.where(store.present, update, tf.zeros([], update.dtype))
        ops.append(store.pending.assign(update))
        if applies is not None:
            written[0] = value_after(store.pending, ops[-1])
        return ops + store.write(new_states, after=written, kept=kept)
    for i, (var, update, frozen) in enumerate(zip(store.variables, updates, store.frozen)):
        if update is not None and not frozen:
            if applies is not None:
                # A scalar zero: with zeros_like XLA writes the variable to a new
                # buffer (measured: peak memory 320 against 95 MiB at 20M params).
                update = _where(applies, update)
            ops.append(subtract_update(var, update))
            if applies is not None:
                written[i] = value_after(var, ops[-1])
            if sequence is not None:
                sequence.written(i, var, ops[-1])
    if sequence is not None:
        sequence.link()
    ops += store.write(new_states, after=written, kept=kept)
    with tf.control_dependencies(ops):
        return ops + store.refresh_from_masters(updates)


def kept_where_skipped(result: list[Any], new: Any, old: Any, applies: tf.Tensor,
                       kept: dict[int, Any], kept_ids: set[int]) -> tuple[list[Any], Any]:
    """A transform's updates and state as a step that may be skipped writes them: each
    leaf ``new`` where it applies, else ``old``, selected by the transform's
    ``keep_where_skipped`` of this very ``old`` (``kept``: id of the selection -> old)
    or here. An update that is a new leaf itself (an EMA's) becomes the leaf as kept,
    equal where the step applies and dropped where not, so its variable reads the
    slot as written. ``kept_ids`` gets the ids of the leaves updates are computed
    from (``StateStore.write`` does not order them after their variable)."""
    def keep(n: Any, o: Any) -> Any:
        if kept.get(id(n)) is o:
            kept_ids.add(id(n))
            return n
        return tf.where(applies, n, o)

    state = tf.nest.map_structure(keep, new, old)
    as_kept = {id(n): k for n, k in zip(tf.nest.flatten(new), tf.nest.flatten(state))
               if n is not k}
    result = [None if r is None else as_kept.get(id(r), r) for r in result]
    leaves = {id(k) for k in as_kept.values()}
    kept_ids.update(id(r) for r in result if r is not None and id(r) in leaves)
    return result, state


def subtract_packed(store: StateStore, applied: tf.Tensor) -> tf.Tensor:
    """Subtract each variable's slice of the packed update, if the step applied.

    Every slice exists before the first variable is written, so the variables
    are updated together or not at all, as on every other path.
    """
    packing = store.packing
    assert packing is not None

    def subtract() -> tf.Tensor:
        deltas = packing.unpack(store.pending.read_value())
        with tf.control_dependencies([tf.group(*deltas)]):
            ops = [var.assign_sub(d) for var, d in zip(store.parameters, deltas)]
        with tf.control_dependencies(ops):
            return tf.constant(True)

    return tf.cond(applied, subtract, lambda: tf.constant(False))


def _where(applies: tf.Tensor, update: Any) -> Any:
    if isinstance(update, tf.IndexedSlices):
        return tf.IndexedSlices(_where(applies, update.values), update.indices,
                                update.dense_shape)
    return tf.where(applies, update, tf.zeros([], update.dtype))
