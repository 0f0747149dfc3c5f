"""One variable after another: the order of a compiled step's loops on a CPU.

XLA's CPU scheduler orders the chain's loops kind by kind: every variable's
moment loops first, then every variable's parameter loop, which reads the new
moments back from memory once they have long left the cache. Given a data
dependency from each variable's new value to the next variable's gradient, it
runs each variable's loops together, and the parameter loop finds the moments
in the cache: the step took 0.87 to 0.93 of its time at 50 variables of 400k
floats (benchmarks/HISTORY.md). Smaller variables are left unordered: there it
gained nothing, as XLA runs several short loops at once.

Tracing builds every gradient before any new value, so the dependency cannot
be written in order. Each gradient passes through an identity (a *gate*) whose
input is rewired, once the assignments are traced, to the gradient times a one
computed from the previous variable's new value. The one is ``1 - 0 * c`` with
``c`` 0 or 1, so it is exactly 1 (no NaN can leak from one variable into the
next) and no simplification removes it. A link is made only where it cannot
close a cycle: where the previous new value depends on no gate from this
variable on, which a transform that mixes variables (a global norm of its own
inputs) would break.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from .step_ops import exactly_one_after, value_after

# Measured, the full step at about 20M parameters (benchmarks/HISTORY.md): in
# sequence took 1.00-1.02 of the time at 50k and 131k floats per variable,
# 0.93-0.95 at 160k, 0.87-0.93 at 200k to 1M, 0.97 at 4M.
SEQUENCE_MIN_SIZE = 150_000


class VariableSequence:
    """Gates the gradients of large variables; ``written`` and ``link`` order them."""

    def __init__(self, grads: list[Any], variables: list[Any], enabled: bool) -> None:
        self._gates = [
            tf.identity(g) if enabled and _orderable(g, v) else None
            for g, v in zip(grads, variables)]
        self.grads = [g if gate is None else gate for g, gate in zip(grads, self._gates)]
        self._new_values: dict[int, tf.Tensor] = {}

    def written(self, index: int, variable: Any, write: Any) -> None:
        """Variable ``index`` was assigned its new value by ``write``."""
        if self._gates[index] is not None:
            self._new_values[index] = value_after(variable, write)

    def link(self) -> None:
        """Make each gated gradient wait for the previous gated variable's new value."""
        update_input = getattr(tf.Operation, "_update_input", None)
        if update_input is None or len(self._new_values) < 2:  # TF's graph surgery is internal
            return
        reach = _latest_gate_reached({gate.op: i for i, gate in enumerate(self._gates)
                                      if gate is not None})
        previous = None
        for index, gate in enumerate(self._gates):
            if gate is None:
                continue
            if previous is not None and reach[previous.op] < index:
                source = gate.op.inputs[0]
                update_input(gate.op, 0, source * exactly_one_after(previous, source.dtype))
            previous = self._new_values.get(index, previous)


def _orderable(g: Any, variable: Any) -> bool:
    size = variable.shape.num_elements()
    return (g is not None and not isinstance(g, tf.IndexedSlices)
            and size is not None and size >= SEQUENCE_MIN_SIZE)


def _latest_gate_reached(gates: dict[Any, int]) -> dict[Any, int]:
    """For each op of the graph being traced, the highest gate index among its
    ancestors (-1: none). Ops are listed in creation order, inputs first."""
    reach: dict[Any, int] = {}
    for op in tf.compat.v1.get_default_graph().get_operations():
        latest = gates.get(op, -1)
        for source in [t.op for t in op.inputs] + list(op.control_inputs):
            latest = max(latest, reach.get(source, -1))
        reach[op] = latest
    return reach
