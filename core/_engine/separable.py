"""Whether a chain can be compiled variable by variable: found out, not declared.

``probe_transform`` traces a transform's ``update`` for two small probe
variables and follows each output back to the inputs it reads: where each
variable's updates and state come from its own gradient, state and value
alone, the transform is *separable*, and the step may call one XLA function
per variable (:mod:`gradpipe._engine.per_variable`). The probe variables note
whether the maths reads their names, so that no two variables with different
names share a function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from ..names import leaf_names
from ..transform import build_scope, record_squared_norm


def probe_transform(transform: Any, context: Any, given_input_norm: bool = False
                    ) -> tuple[str, bool, bool]:
    """Whether ``transform`` computes each variable's updates and state from that
    variable's gradient, state and value alone ("" if it does, else why not),
    whether its maths reads the variables' names (then no two variables share a
    function), and whether it reads its input's global norm: its update traced
    for two small variables, each output followed back to the inputs it reads. A
    global norm of its inputs, a state shared by all variables that some
    variable's gradient writes, or any other mixing shows there.

    ``given_input_norm``: the step knows the global norm of this transform's input
    (the step's own gradients: the chain's first transform), so ``squared_norm``
    of its whole input is handed in, as the per-variable functions hand it, and
    reading it does not mix variables (unless it also sums squares of some of its
    inputs alone, which in one variable's function would read the same list).
    Whether it reads that norm is the third value."""
    named: list[str] = []
    variables = [_Watched(tf.zeros([3]), name="probe/bias", reads=named),
                 _Watched(tf.zeros([2, 3]), name="probe/kernel", reads=named)]
    paths = ["bias", "kernel"]
    try:
        with build_scope(context):
            state = tf.nest.map_structure(tf.convert_to_tensor, transform.init(variables))
        _, owners = leaf_names(state, paths)
        specs = tf.nest.map_structure(tf.TensorSpec.from_tensor, state)
        named.clear()  # init may name its state after the variables: only update counts
        partial: list[Any] = []

        def probe(grads: list[Any], old: Any, input_norm: Any) -> Any:
            with build_scope(context):
                context.shared.clear()
                given = list(grads)
                if given_input_norm:
                    record_squared_norm(given, input_norm)
                outputs, new = transform.update(given, old, variables)
                # A norm of some of its inputs (one variable's, say) would read, in a
                # function of one variable, the same list as the whole input's: any
                # sum of squares over its inputs but the one handed in.
                partial.extend(value for tensors, value in context.shared.get(
                    "squared_norms", {}).values() if value is not input_norm
                    and any(t is g for t in tensors for g in given))
            return list(outputs), tf.nest.flatten(new)

        concrete = tf.function(probe, autograph=False).get_concrete_function(
            [tf.TensorSpec(v.shape, v.dtype) for v in variables], specs,
            tf.TensorSpec([], tf.float32))
    except Exception as exc:  # a transform that cannot be traced so runs as a whole
        return (f"its update could not be traced for two variables "
                f"({type(exc).__name__})", bool(named), False)
    finally:
        context.shared.clear()
    reads_norm = bool(concrete.graph.inputs[2 + len(owners)].consumers())
    if reads_norm and partial:
        return _MIXES, bool(named), False
    return _mixing(concrete, variables, owners), bool(named), reads_norm


def _mixing(concrete: Any, variables: list[Any], owners: list[int | None]) -> str:
    """Why the probe's outputs mix variables ("" where none does)."""
    graph = concrete.graph
    flat_inputs = graph.inputs[:2 + len(owners)]
    source: dict[Any, int | None] = {flat_inputs[0].ref(): 0, flat_inputs[1].ref(): 1}
    source.update({t.ref(): o for t, o in zip(flat_inputs[2:], owners)})
    handles = {id(v.handle): k for k, v in enumerate(variables)}
    for external, internal in graph.captures:
        if id(external) in handles:
            source[internal.ref()] = handles[id(external)]
    outputs, new = concrete.structured_outputs
    expected = [0, 1, *owners]
    for tensor, owner in zip([*outputs, *new], expected):
        if tensor is None:
            continue
        read = variables_read(tensor, source)
        if (owner is None and read) or (owner is not None and read - {owner}):
            return _MIXES
    return ""


_MIXES = ("mixes variables: one variable's output reads another's gradient, state or "
          "value (a global norm, say)")


class _Watched(resource_variable_ops.ResourceVariable):
    """A probe variable that notes when its name is read."""

    def __init__(self, *args: Any, reads: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reads = reads

    @property
    def name(self) -> str:
        self._reads.append("name")
        return super().name

    @property
    def path(self) -> str:
        self._reads.append("path")
        return super().name.split(":")[0]


def variables_read(tensor: Any, source: dict[Any, int | None]) -> set[int]:
    """The variables whose gradient, state or value ``tensor`` is computed from."""
    found: set[int] = set()
    seen: set[Any] = set()
    stack = [tensor.op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        for t in op.inputs:
            owner = source.get(t.ref())
            if owner is not None:
                found.add(owner)
            stack.append(t.op)
    return found  # control inputs carry no values (a traced function orders its reads)


def per_variable_blocker(spec: Any, plan: Any, variables: list[Any], masks: list[list[bool]],
                         frozen: list[bool], replicas: int,
                         separable: Callable[[int], str]) -> str:
    """Why a compiled step is not run variable by variable ("" where it is);
    ``separable(i)``: why transform ``i`` is not separable (``probe_transform``)."""
    if plan.pack.on:
        return "the state is packed: one function for all variables"
    if replicas > 1 or tf.distribute.has_strategy():
        return "the step runs under a distribution strategy"
    if plan.clip_before_reduce:
        return "clip_before_reduce clips each replica's gradients separately"
    if spec.options.accumulation_steps > 1:
        return "accumulation_steps > 1"
    if not all(all(mask) for mask in masks) or any(frozen):
        return "freeze, variables or exclude select among the variables"
    if any(v.dtype not in (tf.float32, tf.float64) for v in variables):
        return "half-precision variables are updated through float32 masters"
    return next((f"transform {t.name} {why}" for i, t in enumerate(spec.transforms)
                 if (why := separable(i))), "")
