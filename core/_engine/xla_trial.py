"""Trying a step on XLA at build: does it lower, does it give the plain step's
numbers, and does it beat the last rule's in-place kernel?

XLA is never taken on a component's word. ``compiled_or_why_not`` reads the
answer off the traced step (or each per-variable function) where its ops tell
for certain (``xla_ops``), and else lowers it to HLO at build; the first
failure, named after the transform whose name scope it comes from, becomes the
plan's reason for not compiling. Random draws are refused up front: XLA draws
other numbers than TensorFlow's kernels, so a compiled step would not be the
plain step. So is a sort on a CPU, where XLA's is the slower.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import tensorflow as tf

from ..transform import build_scope
from .answers import remembered_for
from .plan import Plan, kernel_idle
from .xla_ops import lowers_by_its_ops, slower_on_a_cpu

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
    return _draws_in(_all_ops(function.get_concrete_function(*args).graph), names)


def _draws_in(ops: list[Any], names: dict[str, str]) -> str:
    for op in ops:
        if _draws(op.type):
            return (f"{_owner(op.name, names)} draws random numbers ({op.type}), which "
                    "XLA draws differently from the plain path")
    return ""


def _slower_compiled(ops: list[Any], names: dict[str, str]) -> str:
    """Which transform of the trace (``ops``) sorts, where XLA's sort on a CPU is slower
    than TensorFlow's ("" if none)."""
    op = slower_on_a_cpu(ops)
    if op is None:
        return ""
    return (f"{_owner(op.name, names)} sorts ({op.type}), which XLA runs 2-4x slower than "
            "TensorFlow's kernel on a CPU (jit_compile = true compiles it)")


def compiled_or_why_not(function: Any, args: tuple[Any, ...], names: dict[str, str],
                        lowered: set[str]) -> str:
    """Whether "auto" compiles ``function`` (``jit_compile=True``) for ``args``: "" if
    its ops alone say it lowers to XLA, or it lowers, else why not (it draws random
    numbers, sorts on a CPU, or fails to lower), naming the transform
    (``names``: name scope -> transform). The trace is the one the step reuses; the
    answer is remembered for that trace (a restart lowers nothing it lowered).
    ``lowered``: the shapeless digests of the build's functions that lowered; one
    that differs from them only in its tensors' shapes lowers alike, so is not
    lowered again (a transformer's ten shapes: 0.1 s each for an adaptive rule)."""
    concrete = function.get_concrete_function(*args)
    ops = _all_ops(concrete.graph)
    why = _draws_in(ops, names) or _slower_compiled(ops, names)
    if why:
        return why
    if lowers_by_its_ops(concrete.graph):
        return ""
    shapeless = trace_digest(concrete, shapes=False)
    if shapeless in lowered:
        return ""
    why = remembered_for("xla-lowers", trace_digest(concrete),
                         lambda: _lowers_or_why_not(function, args, names))
    if not why:
        lowered.add(shapeless)
    return why


def _lowers_or_why_not(function: Any, args: tuple[Any, ...], names: dict[str, str]) -> str:
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


def trace_digest(concrete: Any, shapes: bool = True) -> str:
    """A digest of everything XLA's lowering of ``concrete`` reads: its graph and
    the graphs it calls (their names, which hold a per-process counter, replaced by
    their digests), its inputs' and captured variables' shapes and types, the
    devices and ``TF_XLA_FLAGS``. Equal digests lower alike. Without ``shapes``:
    the same with every shape and constant left out."""
    def text(arg: Any) -> str:  # a Keras variable's spec prints its address: its type
        if not hasattr(arg, "dtype"):
            return type(arg).__name__
        return repr(arg) if shapes else f"{type(arg).__name__}({arg.dtype.name})"

    digest = hashlib.sha256(json.dumps([
        repr(tf.nest.map_structure(text, concrete.structured_input_signature)),
        [(v.dtype.name, v.shape.as_list() if shapes else None) for v in concrete.variables],
        sorted({d.device_type for d in tf.config.list_logical_devices()}),
        os.environ.get("TF_XLA_FLAGS", "")]).encode())
    _digest_graph(concrete.graph, digest, {}, shapes)
    return digest.hexdigest()


_SHAPE_ATTRS = ("_output_shapes", "shape", "output_shapes")


def _digest_graph(graph: Any, digest: Any, done: dict[str, str], shapes: bool) -> None:
    library = getattr(graph, "_functions", {})

    def called(name: str) -> str:
        if name not in done:
            inner = hashlib.sha256()
            traced = getattr(library.get(name), "graph", None)
            if traced is not None:
                _digest_graph(traced, inner, done, shapes)
            else:  # not traced here: only its name can tell it apart
                inner.update(name.encode())
            done[name] = inner.hexdigest()
        return done[name]

    for op in graph.get_operations():
        node = op.node_def
        if not shapes:
            for key in (*_SHAPE_ATTRS, *(("value",) if node.op == "Const" else ())):
                if key in node.attr:
                    del node.attr[key]
        for value in node.attr.values():
            if value.HasField("func"):
                value.func.name = called(value.func.name)
            for function in value.list.func:
                function.name = called(function.name)
        # control inputs come in a set's order, which changes from process to process
        data = [i for i in node.input if not i.startswith("^")]
        node.input[:] = data + sorted(i for i in node.input if i.startswith("^"))
        digest.update(node.SerializeToString(deterministic=True))


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
