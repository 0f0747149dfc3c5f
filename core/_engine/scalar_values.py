"""Which scalars a bound takes as their own values, and which of those are the same.

A bound (:mod:`gradpipe._engine.bounds`) holds a hyperparameter, a counter or a
scalar of the state at its own value: free, and exact. A scalar the maths
computes from a tensor (a norm, a sum) is different: its value costs the guard
a pass over that tensor, where its interval, from the tensor's, costs a few
scalar ops. The build finds out whether the bounds hold with the interval
(``guard.how_bounded``), and takes the value only where they do not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from .intervals import has_bounds, value_inputs


def own_values(by_value: bool) -> Callable[[Any], bool]:
    """Which tensors a bound takes as their own values: every scalar where
    ``by_value``, else all but the scalars computed, by operations that have bounds
    here, from a tensor of more than one element (a norm, a sum, a mean): the value
    of such a scalar costs the guard a pass over that tensor, its interval a few
    scalar ops, so it is taken by value only where its interval is too wide for the
    bounds to hold (``guard.how_bounded`` finds out)."""
    seen: dict[Any, bool] = {}

    def scalar_inputs(t: Any) -> list[Any]:  # a tensor input decides: no need of these
        inputs = value_inputs(t.op) if has_bounds(t.op) else []
        return [] if any(i.shape.num_elements() != 1 for i in inputs) else inputs

    def from_a_tensor(t: Any) -> bool:
        inputs = value_inputs(t.op) if has_bounds(t.op) else []
        return (any(i.shape.num_elements() != 1 for i in inputs)
                or any(seen[i.ref()] for i in inputs))

    return lambda x: x.shape.num_elements() == 1 and (
        by_value or not after_inputs(x, seen, scalar_inputs, from_a_tensor))


def taken_as_values(tensors: Sequence[Any], own_value: Callable[[Any], bool]) -> list[Any]:
    """The tensors that ``tensors``' intervals take as their own values (the scalars
    that ``own_value`` says so of, and the weight reads they are computed from,
    not constants): given their values, the analysis needs no graph of its own
    (``interval_of``)."""
    found, seen = [], set()
    stack = [t for t in tensors if isinstance(t, tf.Tensor)]
    while stack:
        x = stack.pop()
        if x.ref() in seen or x.op.type == "Const":
            continue
        seen.add(x.ref())
        if x.op.type == "ReadVariableOp" or (x.shape.num_elements() == 1 and own_value(x)):
            if x.dtype.is_floating or x.dtype.is_integer:
                found.append(x)
            continue
        stack.extend(x.op.inputs)
    return found


# stateless operations whose scalar result depends on their inputs' values alone
_PURE = frozenset(("Cast", "Identity", "Neg", "AddV2", "Add", "Sub", "Mul", "RealDiv", "Div",
                   "DivNoNan", "Maximum", "Minimum", "Sqrt", "Rsqrt", "Square", "Pow", "Exp",
                   "Log", "Reciprocal", "Abs", "Reshape", "Sign", "Floor", "Ceil"))


def same_value(x: Any, keys: dict[Any, Any]) -> int:
    """A key that two scalars share where they are the same value: constants, and the
    same pure operations of such (a rule's ``1 - beta`` is computed again for each
    variable: without this, each variable's maths would be a new walk). ``keys``
    memoizes it by tensor; a scalar of any other origin is its own key. Each key is
    a number, and an operation's key holds its inputs' numbers: keys of a schedule's
    chain of thousands of scalar ops stay flat, and so does the walk."""

    def pure_inputs(t: Any) -> list[Any]:
        op = t.op
        return list(op.inputs) if (op.type in _PURE and not op.control_inputs and all(
            i.shape.num_elements() == 1 for i in op.inputs)) else []

    def key_of(t: Any) -> int:
        key: tuple[Any, ...] = ("own", t.ref())
        if t.op.type == "Const":
            key = ("Const", t.dtype.name, tuple(t.shape.as_list()),
                   np.asarray(tf.get_static_value(t)).tobytes())
        elif inputs := pure_inputs(t):
            key = (t.op.type, t.dtype.name, tuple(t.shape.as_list()),
                   tuple(keys[i.ref()] for i in inputs))
        return keys.setdefault(("number", key), len(keys))

    return int(after_inputs(x, keys, pure_inputs, key_of))


def after_inputs(x: Any, done: dict[Any, Any], inputs: Callable[[Any], list[Any]],
                  compute: Callable[[Any], Any]) -> Any:
    """``done[x.ref()]``, set to ``compute(t)`` for ``x`` and each tensor it depends on
    through ``inputs``, after theirs (``compute`` reads them from ``done``). With a
    stack, not recursion: a schedule's scalars can chain thousands of ops."""
    stack = [x]
    while stack:
        top = stack[-1]
        if top.ref() in done:
            stack.pop()
            continue
        pending = [i for i in inputs(top) if i.ref() not in done]
        if pending:
            stack.extend(pending)
            continue
        done[top.ref()] = compute(top)
        stack.pop()
    return done[x.ref()]
