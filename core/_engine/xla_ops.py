"""Whether XLA lowers a trace, read from its ops alone where that is certain.

Lowering a traced step to HLO only to learn that it lowers costs 0.05 to 0.2 s a
distinct maths (a transformer's Adafactor: 1.7 s of a 3.2 s build, on every
first start). Most optimizer maths is made of ops whose lowering does not depend
on the values they see: elementwise arithmetic, reductions and reshapes over
fixed axes and shapes, variable reads and writes, conditionals. For such a
trace the answer is read from TensorFlow's own registry of XLA kernels (op
type and dtype), without lowering anything.

Anything else is not guessed: an op outside the list below, a shape not known
when traced, an integer operand XLA would need as a constant but that is
computed from a variable or an argument, an argument of a type XLA takes no
parameter of (a string), a function body not traced here, or a device other
than a CPU or GPU. The trial then lowers the trace as before. A
wrong "yes" would fail at the first step, after earlier functions of the same
step had run, so the list holds only ops whose lowering never depends on what
flows through them.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from ..transform import accelerator_visible


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# No operand XLA needs as a constant: any value lowers.
_ANY_OPERANDS = _names("""
    Abs AddN AddV2 Atan Atan2 Cast Ceil ClipByValue Cos Div DivNoNan Equal Erf Exp Expm1
    Floor FloorDiv FloorMod Greater GreaterEqual Identity IdentityN Inv IsFinite IsInf IsNan
    L2Loss Less LessEqual Log Log1p LogicalAnd LogicalNot LogicalOr Maximum Minimum Mul
    MulNoNan Neg NotEqual OnesLike Pow RealDiv Reciprocal Relu Rint Round Rsqrt Select
    SelectV2 Sigmoid Sign Sin Softplus Sqrt Square SquaredDifference StopGradient Sub Tan
    Tanh ZerosLike PreventGradient Snapshot Pack Unpack MatMul BatchMatMulV2 BatchMatMulV3
    ReadVariableOp AssignVariableOp AssignAddVariableOp AssignSubVariableOp
    Const NoOp Placeholder Shape Size Rank
""")
# The operands XLA needs as constants (axes, shapes, bounds; -1: the last), each of
# which must be computed from constants and static shapes alone; any other operand
# may hold any value.
_CONSTANT_OPERANDS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(_names("All Any ArgMax ArgMin Max Mean Min Prod Sum"), (1,)),
    **dict.fromkeys(_names("BroadcastTo Cumprod Cumsum ExpandDims Pad Reshape ReverseV2 Tile "
                           "Transpose"), (1,)),
    "ConcatV2": (-1,), "Fill": (0,), "Range": (0, 1, 2), "Slice": (1, 2), "Split": (0,),
    "SplitV": (1, 2), "Squeeze": (), "StridedSlice": (1, 2, 3),
}
# Functional ops: their bodies are checked as part of the trace.
_CALLS = _names("If StatelessIf PartitionedCall StatefulPartitionedCall")
# Producers whose integer outputs XLA folds to constants when their inputs are.
_FOLDS = _names("""
    AddV2 Cast ConcatV2 ExpandDims FloorDiv Identity Maximum Minimum Mul Pack Prod Range
    Reshape Slice Squeeze StridedSlice Sub Sum
""")
_STATIC = _names("Const Shape Size Rank")


# Ops whose XLA code on a CPU is measured slower than TensorFlow's kernel: a sort
# or top-k (tf.sort, tf.math.top_k, tf.argsort) of 360k floats took 121-139 ms
# compiled against 34-62 ms plain, 2 cores.
_SLOWER_ON_A_CPU = _names("TopKV2")


def slower_on_a_cpu(ops: list[Any]) -> Any:
    """The first of ``ops`` that XLA runs slower than TensorFlow's kernel where the
    step runs on a CPU (no GPU or TPU visible, as "auto"'s size rule reads it), else
    None."""
    if accelerator_visible():
        return None
    return next((op for op in ops if op.type in _SLOWER_ON_A_CPU), None)


def lowers_by_its_ops(graph: Any) -> bool:
    """True where every op of ``graph`` and of the functions it calls is certain to
    lower to XLA on the devices at hand; False where that is not certain (lower it
    to find out)."""
    devices = _jit_devices()
    if not devices or not _kernels_registered(devices[0]):
        return False
    return _graph_lowers(graph, devices)


def _graph_lowers(graph: Any, devices: tuple[str, ...]) -> bool:
    library = getattr(graph, "_functions", {})
    for op in graph.get_operations():
        kind = op.type
        if kind in _CALLS:
            if not all(name in library and _graph_lowers(library[name].graph, devices)
                       for name in _called(op)):
                return False
        elif kind not in _ANY_OPERANDS and kind not in _CONSTANT_OPERANDS:
            return False
        if not all(_registered(*_kernel_of(op), device) for device in devices):
            return False
        if any(t.dtype != tf.resource and not t.shape.is_fully_defined() for t in op.outputs):
            return False
        if not all(_static(op.inputs[i].op) for i in _CONSTANT_OPERANDS.get(kind, ())):
            return False
    return True


def _called(op: Any) -> list[str]:
    names = []
    for value in op.node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names += [f.name for f in value.list.func]
    return names


def _static(op: Any, depth: int = 0) -> bool:
    """Whether ``op``'s output is computed from constants and static shapes alone."""
    if op.type in _STATIC:
        return True
    if op.type not in _FOLDS or depth > 16:
        return False
    return all(_static(t.op, depth + 1) for t in op.inputs)


def _kernel_of(op: Any) -> tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]:
    """The XLA kernel ``op`` needs, and its type attributes. An argument (a trace's
    placeholder) is a parameter of the HLO, XLA's ``_Arg``, which takes no string."""
    if op.type == "Placeholder":
        return "_Arg", (("T", (op.get_attr("dtype").as_datatype_enum,)),)
    return op.type, _type_attrs(op)


def _type_attrs(op: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The op's type attributes, each as the dtypes it holds."""
    attrs = []
    for name, value in op.node_def.attr.items():
        if value.HasField("type"):
            attrs.append((name, (value.type,)))
        elif value.HasField("list") and value.list.type:
            attrs.append((name, tuple(value.list.type)))
    return tuple(sorted(attrs))


@functools.cache
def _registered(kind: str, attrs: tuple[tuple[str, tuple[int, ...]], ...],
                device: str) -> bool:
    """Whether an XLA kernel of ``kind`` is registered for ``device`` whose type
    constraints admit ``attrs``."""
    from tensorflow.python.framework import kernels

    given = dict(attrs)
    for kernel in kernels.get_registered_kernels_for_op(kind).kernel:
        if kernel.device_type == device and all(
                set(given.get(c.name, ())) <= set(c.allowed_values.list.type)
                for c in kernel.constraint):
            return True
    return False


def _jit_devices() -> tuple[str, ...]:
    """The XLA devices a step lowers for here: the CPU's, and the GPU's where one is
    visible; none where another accelerator is (lower to find out)."""
    kinds = {d.device_type for d in tf.config.list_logical_devices()}
    if kinds - {"CPU", "GPU"}:
        return ()
    return ("XLA_CPU_JIT", *(("XLA_GPU_JIT",) if "GPU" in kinds else ()))


def _kernels_registered(device: str) -> bool:
    """TensorFlow lists XLA's kernels once XLA has compiled or lowered something in
    this process: lower a one-op function first if it has not."""
    if _registered("Sqrt", (), device):
        return True
    probe = tf.function(lambda x: tf.sqrt(x), jit_compile=True, autograph=False)
    try:
        probe.experimental_get_compiler_ir(tf.TensorSpec([], tf.float32))(stage="hlo")
    except Exception:  # no XLA here: lower each trace to find out
        return False
    _registered.cache_clear()
    return _registered("Sqrt", (), device)
