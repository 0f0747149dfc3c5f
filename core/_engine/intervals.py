"""Intervals of a transform's values, one operation at a time.

Each of a traced operation's supported types turns its inputs' intervals
``[lo, hi]`` (float32 scalars holding every element) into its own, with the
conditions its domain needs (no square root below 0, no divisor whose
interval holds 0). :mod:`gradpipe._engine.bounds` walks a transform's maths
with these rules.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from ..transform import sum_of_squares


class Interval(NamedTuple):
    lo: Any  # float32 scalars
    hi: Any


class Unbounded(Exception):
    """An operation the analysis has no bound for; the message says which."""


# float rounding makes a computed value exceed the exact interval by a relative
# 2**-24 per operation: half the dtype's maximum leaves room for millions of them
_LIMIT = {tf.float16: 65504.0 / 2, tf.bfloat16: 3.38e38 / 2}
_FLOAT32_LIMIT = 3.4e38 / 2
# A divisor, a logarithm's or a reciprocal root's argument must stay above this: a
# float32 below the smallest normal (1.18e-38) may be flushed to 0 where it is used
_TINY = 2.0**-125
# a norm bounds each element, but rounds: widened by more than its rounding
_WIDEN = 1 + 2.0**-20


def _f(x: Any) -> Any:
    return tf.cast(x, tf.float32)


def _hull(parts: Sequence[Interval]) -> Interval:
    """The smallest interval holding ``parts``. (A NaN that min or max drops comes
    only from an infinite end, whose own interval fails its check.)"""
    return Interval(functools.reduce(tf.minimum, [p.lo for p in parts]),
                    functools.reduce(tf.maximum, [p.hi for p in parts]))


def _mul(a: Interval, b: Interval) -> Interval:
    if b.lo is b.hi:  # a point (a scalar, a constant): two products, not four
        return _hull([Interval(a.lo * b.lo, a.lo * b.lo), Interval(a.hi * b.lo, a.hi * b.lo)])
    if a.lo is a.hi:
        return _mul(b, a)
    return _hull([Interval(x * y, x * y) for x in a for y in b])


def _abs(a: Interval) -> Interval:
    lo = tf.where(a.lo >= 0, a.lo, tf.where(a.hi <= 0, -a.hi, 0.0))
    return Interval(lo, tf.maximum(tf.abs(a.lo), tf.abs(a.hi)))


def _add(op: Any, *xs: Interval) -> tuple[Interval, list[Any]]:
    return Interval(tf.add_n([x.lo for x in xs]), tf.add_n([x.hi for x in xs])), []


def _sub(a: Interval, b: Interval) -> Interval:
    return Interval(a.lo - b.hi, a.hi - b.lo)


def _square(a: Interval) -> tuple[Interval, list[Any]]:
    magnitude = _abs(a)
    return Interval(magnitude.lo ** 2, magnitude.hi ** 2), []


def _monotone(fn: Callable[[Any], Any]) -> Callable[..., Any]:
    return lambda op, a: (Interval(fn(a.lo), fn(a.hi)), [])


def _divide(a: Interval, b: Interval) -> tuple[Interval, list[Any]]:
    apart = (b.lo >= _TINY) | (b.hi <= -_TINY)  # a divisor that cannot be 0
    safe = Interval(tf.where(apart, b.lo, 1.0), tf.where(apart, b.hi, 1.0))
    return _mul(a, Interval(1.0 / safe.hi, 1.0 / safe.lo)), [apart]


def _pow(op: Any, a: Interval, b: Interval) -> tuple[Interval, list[Any]]:
    """``a ** b``: a whole exponent known when traced (``g ** 2``) follows the sign of
    ``a``; any other needs ``a`` non-negative (positive for an exponent that may be
    0 or below), where the power is monotone in each argument: its extremes lie at
    the corners."""
    whole = tf.get_static_value(op.inputs[1])
    if whole is not None and np.size(whole) == 1 and float(whole) == int(whole) >= 0:
        k = int(whole)
        ends = _abs(a) if k % 2 == 0 else a
        return Interval(ends.lo ** k, ends.hi ** k), []
    base = Interval(tf.maximum(a.lo, 0.0), tf.maximum(a.hi, 0.0))
    corners = [tf.pow(x, p) for x in base for p in b]
    domain = (a.lo >= _TINY) | ((a.lo >= 0) & (b.lo > 0))
    return _hull([Interval(c, c) for c in corners]), [domain]


def _reduced(op: Any) -> float:
    """How many elements each output element of a reduction reduces (at least one:
    an empty max, min or mean is infinite or NaN)."""
    given, out = op.inputs[0].shape.num_elements(), op.outputs[0].shape.num_elements()
    if given is None or out is None:
        raise Unbounded(f"`{op.type}` over a tensor of unknown shape")
    if out and given < out:
        raise Unbounded(f"`{op.type}` over an empty tensor")
    return float(given) / max(out, 1)


def _sum(op: Any, a: Interval) -> tuple[Interval, list[Any]]:
    n = _reduced(op)
    return Interval(a.lo * n, a.hi * n), []


def _mean(op: Any, a: Interval) -> tuple[Interval, list[Any]]:
    # the sum it divides must not overflow either
    return a, [_abs(a).hi * _reduced(op) < _FLOAT32_LIMIT]


def _l2_loss(op: Any, a: Interval) -> tuple[Interval, list[Any]]:
    return Interval(tf.constant(0.0), _abs(a).hi ** 2 * (_reduced(op) / 2)), []


def _same(op: Any, *inputs: Interval) -> tuple[Interval, list[Any]]:
    return _hull(inputs) if len(inputs) > 1 else inputs[0], []


_ALL_BUT_LAST = "all but last"
# op type -> (the inputs that carry values: indices, None for all, or all but the
# last), rule
_RULES: dict[str, tuple[tuple[int, ...] | str | None, Callable[..., Any]]] = {
    "AddV2": (None, _add),
    "Add": (None, _add),
    "BiasAdd": (None, _add),
    "AddN": (None, _add),
    "Sub": (None, lambda op, a, b: (_sub(a, b), [])),
    # ``g * g`` (``tf.norm``'s square) is a square: not below 0
    "Mul": (None, lambda op, a, b: _square(a) if op.inputs[0] is op.inputs[1]
            else (_mul(a, b), [])),
    "RealDiv": (None, lambda op, a, b: _divide(a, b)),
    "Reciprocal": (None, lambda op, a: _divide(Interval(1.0, 1.0), a)),
    "Neg": (None, lambda op, a: (Interval(-a.hi, -a.lo), [])),
    "Abs": (None, lambda op, a: (_abs(a), [])),
    "Square": (None, lambda op, a: _square(a)),
    "SquaredDifference": (None, lambda op, a, b: _square(_sub(a, b))),
    "Sqrt": (None, lambda op, a: (Interval(tf.sqrt(tf.maximum(a.lo, 0.0)), tf.sqrt(a.hi)),
                                  [a.lo >= 0])),
    "Rsqrt": (None, lambda op, a: (Interval(tf.math.rsqrt(a.hi),
                                            tf.math.rsqrt(tf.maximum(a.lo, _TINY))),
                                   [a.lo >= _TINY])),
    "Pow": (None, _pow),
    "Exp": (None, _monotone(tf.exp)),
    "Log": (None, lambda op, a: (Interval(tf.math.log(a.lo), tf.math.log(a.hi)),
                                 [a.lo >= _TINY])),
    "Log1p": (None, lambda op, a: (Interval(tf.math.log1p(a.lo), tf.math.log1p(a.hi)),
                                   [a.lo > -1])),
    "Tanh": (None, _monotone(tf.tanh)),
    "Sigmoid": (None, _monotone(tf.sigmoid)),
    "Sign": (None, _monotone(tf.sign)),
    "Relu": (None, _monotone(lambda x: tf.maximum(x, 0.0))),
    "Softplus": (None, _monotone(tf.nn.softplus)),
    "Floor": (None, _monotone(tf.floor)),
    "Ceil": (None, _monotone(tf.math.ceil)),
    "Round": (None, _monotone(tf.round)),
    "Maximum": (None, lambda op, a, b: (Interval(tf.maximum(a.lo, b.lo),
                                                 tf.maximum(a.hi, b.hi)), [])),
    "Minimum": (None, lambda op, a, b: (Interval(tf.minimum(a.lo, b.lo),
                                                 tf.minimum(a.hi, b.hi)), [])),
    "ClipByValue": (None, lambda op, a, lo, hi: (Interval(
        tf.minimum(tf.maximum(a.lo, lo.lo), hi.lo),
        tf.minimum(tf.maximum(a.hi, lo.hi), hi.hi)), [])),
    "Select": ((1, 2), _same),
    "SelectV2": ((1, 2), _same),
    "Sum": ((0,), _sum),
    "Mean": ((0,), _mean),
    "Max": ((0,), _same),
    "Min": ((0,), _same),
    "L2Loss": ((0,), _l2_loss),
    "ConcatV2": (_ALL_BUT_LAST, _same),
    "Pack": (None, _same),
    "Split": ((1,), _same),
    "ZerosLike": ((), lambda op: (Interval(tf.constant(0.0), tf.constant(0.0)), [])),
    "OnesLike": ((), lambda op: (Interval(tf.constant(1.0), tf.constant(1.0)), [])),
    "Fill": ((1,), _same),
}
_RULES["Inv"] = _RULES["Reciprocal"]
# operations that move or copy values, never change them: the first input's interval
for _op in ("Identity", "StopGradient", "Snapshot", "Reshape", "Squeeze", "ExpandDims",
            "Transpose", "BroadcastTo", "Tile", "Slice", "StridedSlice", "GatherV2",
            "EnsureShape", "SplitV", "Unpack", "ReverseV2", "Cast", "PreventGradient"):
    _RULES[_op] = ((0,), _same)


def value_inputs(op: Any) -> list[Any]:
    """The inputs of ``op`` (one with bounds here) that carry the values it computes."""
    which = _RULES[op.type][0]
    if which == _ALL_BUT_LAST:
        return list(op.inputs[:-1])
    return list(op.inputs) if which is None else [op.inputs[k] for k in which]


def has_bounds(op: Any) -> bool:
    """Whether operations of ``op``'s type have an interval rule here."""
    return op.type in _RULES


def structure(x: Any, own_value: bool) -> tuple[tuple[Any, ...] | None, list[Any]]:
    """What ``x``'s interval depends on besides its inputs' intervals (``None``: on
    ``x`` itself, a scalar taken as its ``own_value``), and the inputs whose
    intervals it needs."""
    if not (x.dtype.is_floating or x.dtype.is_integer):
        raise Unbounded(f"its maths uses a {x.dtype.name} tensor ({x.op.type})")
    if x.op.type == "Const":
        return ("Const", *_constant_range(x)), []
    if own_value:  # a hyperparameter, a counter: its own value
        return None, []
    if x.op.type == "ReadVariableOp":  # a weight the maths reads: within its norm
        return None, []
    if x.op.type not in _RULES:
        raise Unbounded(f"its maths uses `{x.op.type}`, which has no bound here")
    if x.op.type == "Cast" and not (x.dtype.is_floating and (
            x.op.inputs[0].dtype.is_floating or x.op.inputs[0].dtype.is_integer)):
        raise Unbounded(f"its maths casts {x.op.inputs[0].dtype.name} to {x.dtype.name}")
    reduced = _reduced(x.op) if x.op.type in ("Sum", "Mean", "L2Loss", "Max", "Min") \
        else None
    return (x.op.type, x.dtype, reduced), value_inputs(x.op)


def _lerp(x: Any, memo: dict[Any, Interval]) -> tuple[Interval, list[Any]] | None:
    """``a + (b - a) * c``, ``c`` a scalar in [0, 1] (Keras's EMA), lies between ``a``
    and ``b``, which the sum's rule loses (``a`` appears twice: a mean of squares
    would seem to go below 0); monotone rounding keeps it so up to one rounding of
    each end, and non-negative ``a`` and ``b`` give non-negative. ``None``: not so."""
    if x.op.type not in ("AddV2", "Add") or x.shape.num_elements() == 1:
        return None  # a scalar is its own value
    for base, step in (x.op.inputs, reversed(x.op.inputs)):
        if step.op.type != "Mul":
            continue
        for diff, c in (step.op.inputs, reversed(step.op.inputs)):
            if (diff.op.type == "Sub" and diff.op.inputs[1] is base
                    and c.shape.num_elements() == 1
                    and all(t.ref() in memo for t in (base, diff.op.inputs[0], c, step))):
                a, b, k = memo[base.ref()], memo[diff.op.inputs[0].ref()], memo[c.ref()]
                within = (k.lo >= 0) & (k.hi <= 1)
                lo, hi = tf.minimum(a.lo, b.lo), tf.maximum(a.hi, b.hi)
                lo = lo * tf.where(lo >= 0, 1 / _WIDEN, _WIDEN)
                hi = hi * tf.where(hi >= 0, _WIDEN, 1 / _WIDEN)
                general = _add(x.op, a, memo[step.ref()])[0]
                return Interval(tf.where(within, lo, general.lo),
                                tf.where(within, hi, general.hi)), []
    return None


def _constant_range(x: Any) -> tuple[float, float]:
    value = np.asarray(tf.get_static_value(x), dtype=np.float64)
    return (float(value.min()), float(value.max())) if value.size else (0.0, 0.0)


def _interval(x: Any, given: list[Interval], values: dict[Any, Any], own_value: bool
              ) -> tuple[Interval, list[Any]]:
    if x.op.type == "Const":
        lo, hi = _constant_range(x)
        low = tf.constant(lo, tf.float32)
        return Interval(low, low if hi == lo else tf.constant(hi, tf.float32)), []
    if own_value:
        value = _f(tf.reshape(values.get(x.ref(), x), []))
        return Interval(value, value), []
    if x.op.type == "ReadVariableOp":  # a weight: its norm, one pass where a range takes two
        return within_norm(sum_of_squares([values.get(x.ref(), x)])), []
    return _RULES[x.op.type][1](x.op, *given)


def interval_of(x: Any, given: list[Interval], memo: dict[Any, Interval],
                values: dict[Any, Any], own_value: bool) -> tuple[Interval, list[Any]]:
    """``x``'s interval (float32 ends) from its inputs' ``given`` ones (``memo``: every
    interval known so far), and the conditions its operation's domain needs; a
    scalar taken as its ``own_value`` is that value. A scalar or a weight read in
    ``values`` (``tensor.ref()`` -> its value, computed already) takes that value
    in its place."""
    computed, domain = _lerp(x, memo) or _interval(x, given, values, own_value)
    return Interval(_f(computed.lo), _f(computed.hi)), domain


def limit_of(dtype: Any) -> float:
    """How large an interval's ends may be in ``dtype``, with room for rounding."""
    return _LIMIT.get(dtype, _FLOAT32_LIMIT)


def largest_magnitude(a: Interval) -> Any:
    return _abs(a).hi


def state_range(tensors: Sequence[Any]) -> Interval:
    """The least and the largest element of ``tensors`` (NaN where one is: a NaN
    fails every check it reaches)."""
    return Interval(tf.reduce_min(tf.stack([_f(tf.reduce_min(t)) for t in tensors])),
                    largest_element_of(tensors))


def largest_element_of(tensors: Sequence[Any]) -> Any:
    """The largest element of ``tensors``, in float32 (one pass over each)."""
    return tf.reduce_max(tf.stack([_f(tf.reduce_max(t)) for t in tensors]))


def largest_magnitude_of(tensors: Sequence[Any]) -> Any:
    """The largest magnitude among ``tensors``' elements, in float32 (one pass over
    each): for a state its maths keeps non-negative, its largest element."""
    return tf.reduce_max(tf.stack([_f(tf.reduce_max(tf.abs(t))) for t in tensors]))


def within_largest(largest: Any) -> Interval:
    """An interval holding every element of tensors whose largest magnitude is at most
    ``largest`` (widened as ``within_norm``: a root of a sum may be that largest)."""
    bound = _f(largest) * _WIDEN
    return Interval(-bound, bound)


def within_norm(squared: Any) -> Interval:
    """An interval holding every element of tensors whose sum of squares is
    ``squared`` (widened by more than the rounding of the sum and the root)."""
    bound = tf.sqrt(_f(squared)) * _WIDEN
    return Interval(-bound, bound)
