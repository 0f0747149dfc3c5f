"""Trying a step on XLA at build: does it lower, does it give the plain step's
numbers, and does it beat the last rule's in-place kernel?

XLA is never taken on a component's word. ``compiled_or_why_not`` lowers the
traced step (or each per-variable function) to HLO at build, and the first
failure, named after the transform whose name scope it comes from, becomes the
plan's reason for not compiling. Random draws are refused up front: XLA draws
other numbers than TensorFlow's kernels, so a compiled step would not be the
plain step.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from ..transform import build_scope
from .plan import Plan, kernel_idle

# Random ops, stateful or not (after the prefix): XLA draws other numbers than TF's
# kernels do.
_RANDOM = ("Random", "TruncatedNormal", "ParameterizedTruncatedNormal", "Multinomial",
           "Uniform", "StandardNormal", "Shuffle")


def _draws(op_type: str) -> bool:
    kind = op_type.removeprefix("Stateless").removeprefix("Stateful")
    return kind.startswith(_RANDOM) or op_type.startswith("Rng")


def random_draws(function: Any, args: tuple[Any, ...], names: dict[str, str]) -> str:
    """Which transform of ``function``'s trace for ``args`` draws random numbers ("" if
    none): compiled, it would draw other numbers than on the plain path."""
    for op in _all_ops(function.get_concrete_function(*args).graph):
        if _draws(op.type):
            return (f"{_owner(op.name, names)} draws random numbers ({op.type}), which "
                    "XLA draws differently from the plain path")
    return ""


def compiled_or_why_not(function: Any, args: tuple[Any, ...], names: dict[str, str]
                        ) -> str:
    """Lower ``function`` (``jit_compile=True``) for ``args`` to XLA: "" if it compiles
    and gives what the plain step gives, else why not, naming the transform
    (``names``: name scope -> transform). The trace is the one the step reuses."""
    draws = random_draws(function, args, names)
    if draws:
        return draws
    try:
        _lower(function, args)
    except Exception as exc:  # XLA reports unsupported ops as ValueError/InvalidArgument
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{_owner(first, names)} failed to compile: {first[:300]}"
    return ""


def _lower(function: Any, args: tuple[Any, ...]) -> str:
    """The HLO of a traced ``jit_compile`` function: XLA lowers it or raises. Given
    specs, from the trace alone, so no argument of the parameters' size is allocated
    for it; given the arguments themselves (variables among them, which TF lowers
    only so), from the trace these arguments reuse."""
    if not any(isinstance(a, tf.TensorSpec) for a in tf.nest.flatten(args)):
        return str(function.experimental_get_compiler_ir(*args)(stage="hlo"))
    from tensorflow.python.eager.polymorphic_function import compiler_ir

    concrete = function.get_concrete_function(*args)
    specs = [s for s in tf.nest.flatten(concrete.structured_input_signature)
             if isinstance(s, tf.TensorSpec)]  # not the None of absent arguments
    return str(compiler_ir.from_concrete_function(concrete, specs)(stage="hlo"))


def one_kernel_alone(step: Any, plan: Plan) -> bool:
    """Whether the chain is its last rule alone, unscaled, whose in-place kernel reads
    and writes each variable in one op (sgd's): one pass already, where a compiled
    step adds a call per variable (50 x 400k: 24 ms a step in place, 31 compiled;
    adam's six kernels a variable lose to XLA)."""
    if len(step.transforms) != 1 or step.loss_scaler is not None or not kernel_idle(plan):
        return False
    store = step.state
    var = store.variables[0]

    def probe(g: Any) -> None:
        with build_scope(step.context):
            step.kernel([g] + [None] * (len(store.variables) - 1), store.slot_variables(0),
                        store.variables)

    try:
        graph = tf.function(probe, autograph=False).get_concrete_function(
            tf.TensorSpec(var.shape, var.dtype)).graph
    except Exception:  # a kernel that cannot run for one variable alone: compile
        return False
    passes = [op for op in graph.get_operations() if any(
        t.dtype.is_floating and t.shape == var.shape for t in op.inputs)]
    return len(passes) == 1


def _all_ops(graph: Any) -> list[Any]:
    ops = list(graph.get_operations())
    for function in getattr(graph, "_functions", {}).values():
        inner = getattr(function, "graph", None)
        if inner is not None:
            ops += _all_ops(inner)
    return ops


def _owner(text: str, names: dict[str, str]) -> str:
    """The transform whose name scope appears in ``text`` (an op name or an error)."""
    for scope, name in names.items():
        if f"{scope}/" in text:
            return f"transform {name}"
    return "the step"
