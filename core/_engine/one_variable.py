"""One variable's view of the state store, inside its own traced function.

What the chain reads (``read``) and what ``writes.assign`` writes, for one
variable of a step compiled variable by variable
(:mod:`gradpipe._engine.per_variable`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from ..errors import GradpipeError
from .bounds import record_state
from .intervals import Interval
from .step_ops import exactly_one_after


class OneVariableState:
    """One variable's view of the state store, inside its traced function: what the
    chain reads (``read``) and what ``writes.assign`` writes. The state a transform
    shares between variables (a step count) comes in as values read once for all
    variables, and its new values go out (``new_shared``): the step writes them once."""

    packing = None
    present = None

    def __init__(self, var: Any, layouts: list[tuple[Any, list[bool]]],
                 own: list[list[Any]], shared: list[list[Any]],
                 bounds: list[Any] | None = None) -> None:
        self.variables, self.frozen = [var], [False]
        self._bounds = bounds
        self.masks = [[True] for _ in layouts]
        self._layouts, self._own, self._shared = layouts, own, shared
        self.new_shared: list[list[Any]] = [list(values) for values in shared]

    def read(self, i: int, sparse: Any = frozenset()) -> Any:
        structure, owned = self._layouts[i]
        own, shared = iter(self._own[i]), iter(self._shared[i])
        values = [next(own).read_value() if mine else next(shared) for mine in owned]
        if self._bounds is not None:  # the step's bounds of the state: no read here
            for t, held in zip(values, self._bounds[i]):
                if isinstance(t, tf.Tensor) and t.dtype.is_floating:
                    record_state([t], Interval(*held))
        return tf.nest.pack_sequence_as(structure, values)

    def write(self, new_states: dict[int, Any], after: dict[int, Any] | None = None,
              kept: set[int] | None = None) -> list[Any]:
        ops = []
        for i, state in new_states.items():
            structure, owned = self._layouts[i]
            try:
                tf.nest.assert_same_structure(structure, state)
            except (ValueError, TypeError) as exc:
                raise GradpipeError(f"transform {i} returned a state whose structure "
                                    f"differs from its init(): {exc}") from None
            own, shared = iter(self._own[i]), iter(range(len(self._shared[i])))
            for mine, value in zip(owned, tf.nest.flatten(state)):
                if not mine:
                    self.new_shared[i][next(shared)] = value
                    continue
                leaf = next(own)
                value = tf.cast(value, leaf.dtype)
                previous = None if after is None or id(value) in (kept or ()) else after.get(0)
                if previous is not None and leaf.dtype.is_floating:
                    value = value * exactly_one_after(previous, leaf.dtype)
                ops.append(leaf.assign(value))
        return ops

    def refresh_from_masters(self, updates: list[Any]) -> list[Any]:
        return []  # per-variable functions are chosen only without half-precision masters


def one_variable_structure(structure: Any, count: int, index: int) -> Any:
    """``structure`` (a state nest of ``count`` variables) as ``init`` gives it for
    variable ``index`` alone: each list of one entry per variable keeps its entry."""
    if isinstance(structure, dict):
        return {k: one_variable_structure(v, count, index) for k, v in structure.items()}
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return type(structure)(*(one_variable_structure(v, count, index) for v in structure))
    if isinstance(structure, (list, tuple)):
        items = [structure[index]] if len(structure) == count else structure
        return type(structure)(one_variable_structure(v, count, index) for v in items)
    return structure
