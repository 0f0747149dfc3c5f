"""Bounds of a transform's outputs from its traced maths: finite without a pass.

Where the engine knows no proof for a transform (any plugin's), it walks the
operations that compute the transform's outputs, back to its inputs, and
gives each an interval ``[lo, hi]`` holding every element: the gradients lie
within their largest magnitude (the step knows their norm, or the bound the
previous transform's analysis gave), the state within its own norm (one read
of the state), a weight the maths reads (decoupled weight decay) within its
own norm, constants and scalars are what they are, but for the norms and sums
the maths computes, which lie within the interval of what they reduce
(:mod:`gradpipe._engine.scalar_values`). Each operation turns
its inputs' intervals into its own in a few scalar ops. Where every interval
lies inside its dtype's range, with room for float rounding, and every
operation's domain holds (no square root below 0, no divisor whose interval
holds 0), every output is finite: no sum over the outputs, which would have to
exist before the first write. Where that fails at run time, the guard
(:mod:`gradpipe._engine.guard`) checks the chain instead; an operation with no
bound here leaves the transform checked, and the plan says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from ..tensors import all_true
from ..transform import current_context, in_xla_function, squared_norm, sum_of_squares
from .intervals import (
    Interval,
    interval_of,
    largest_magnitude,
    limit_of,
    state_range,
    structure,
    within_largest,
    within_norm,
)
from .scalar_values import after_inputs, own_values, same_value


class Bounded(NamedTuple):
    required: list[Any]  # bool scalars: true where every output is finite
    magnitudes: dict[int, Any]  # id(output) -> a bound of its largest magnitude


def bound_outputs(outputs: Sequence[Any], known: dict[Any, Interval],
                  values: dict[Any, Any] | None = None, *, by_value: bool = False
                  ) -> Bounded:
    """Bounds of ``outputs`` (tensors traced in the current graph) from the intervals
    ``known`` of their inputs (``tensor.ref()`` -> Interval); raises ``Unbounded``.
    A read of a variable whose interval the step gave (``shared["weights"]``, by
    handle) takes it; any other lies within its own norm. With ``values``
    (``scalar_values.taken_as_values``' tensors -> their values, computed already) and
    ``known`` computed too, the bounds are computed now, outside ``outputs``' graph.
    A scalar is taken as its own value where ``scalar_values.own_values(by_value)``
    says so, else given the interval of the maths that computes it.

    Operations of the same kind on the same intervals share one interval, and so do
    scalars of the same value (``same_value``), so a transform's maths repeated for
    each variable costs its scalar ops once."""
    memo: dict[Any, Interval] = dict(known)
    values = values or {}
    own_value = own_values(by_value)
    weights = current_context().shared.get("weights", {})  # variable handle -> Interval
    same: dict[tuple[Any, ...], Interval] = {}
    scalars: dict[Any, Any] = {}  # same_value's keys
    required: list[Any] = []
    ends: dict[float, tuple[list[Any], list[Any]]] = {}  # limit -> the intervals' lo, hi
    checked: set[tuple[int, float]] = set()

    def check(interval: Interval, dtype: Any) -> None:
        limit = limit_of(dtype)
        if (id(interval), limit) not in checked:
            checked.add((id(interval), limit))
            los, his = ends.setdefault(limit, ([], []))
            los.append(interval.lo)
            his.append(interval.hi)

    for interval in known.values():  # an infinite input fails too
        check(interval, tf.float32)
    def weight_of(x: Any) -> Interval | None:
        """A weight whose interval the step gave, where ``x`` reads one."""
        return weights.get(x.op.inputs[0].ref()) if x.op.type == "ReadVariableOp" else None

    planned: dict[Any, tuple[Any, Any, list[Any]]] = {}  # x -> own value, key, inputs

    def inputs_of(x: Any) -> list[Any]:
        if weight_of(x) is not None:
            return []
        if x.ref() not in planned:
            own = own_value(x)
            key, deps = structure(x, own)
            if key is None and own:
                key = ("scalar", same_value(x, scalars))
            planned[x.ref()] = own, key, deps
        return planned[x.ref()][2]

    def bound(x: Any) -> Interval:
        weight = weight_of(x)
        if weight is not None:
            check(weight, tf.float32)
            return weight
        own, key, deps = planned.pop(x.ref())
        given = [memo[d.ref()] for d in deps]
        if key is not None:
            key += tuple(id(i) for i in given)
        found = same.get(key) if key is not None else None
        if found is None:
            found, domain = interval_of(x, given, memo, values, own)
            required.extend(domain)
            if key is not None:
                same[key] = found
        if x.dtype.is_floating:
            check(found, x.dtype)
        return found

    for output in outputs:
        after_inputs(output, memo, inputs_of, bound)
    xla = in_xla_function()
    for limit, (los, his) in ends.items():  # compared one by one: a NaN fails
        # in XLA each end on its own (see all_true), else each list as one vector
        required.append(all_true([lo > -limit for lo in los] + [hi < limit for hi in his]
                                 if xla else [tf.stack(los) > -limit, tf.stack(his) < limit]))
    magnitudes: dict[int, Any] = {}  # one per distinct interval: most outputs share one
    for interval in (memo[t.ref()] for t in outputs):
        if id(interval) not in magnitudes:
            magnitudes[id(interval)] = largest_magnitude(interval)
    return Bounded(required, {id(t): magnitudes[id(memo[t.ref()])] for t in outputs})


def record_bounds(magnitudes: dict[int, Any], tensors: Sequence[Any]) -> None:
    """Remember each of ``tensors``' bound, for the next transform's inputs."""
    bounds = current_context().shared.setdefault("bounds", {})
    for t in tensors:
        if t is not None and id(t) in magnitudes:
            bounds[id(t)] = (t, magnitudes[id(t)])  # the tensor keeps its id alive


def record_largest(tensors: Sequence[Any], largest: Any) -> None:
    """Remember that every element of ``tensors`` (a proved transform's updates) lies
    within ``largest`` of 0, for a later transform's bound (``input_interval``). Not
    for ``squared_bound``: a proof's bound may be past 2**64, whose square overflows,
    where the later transform's proof would fail on the inputs' own finite norm."""
    current_context().shared.setdefault("largest", {}).update(
        {id(t): (t, largest) for t in tensors if t is not None})


def input_interval(tensors: Sequence[Any]) -> Interval:
    """An interval holding every element of ``tensors``, a transform's inputs: within
    the largest magnitude recorded for them (by the bound or the proof of the
    transform before, or the step's for its gradients: no pass), else within their
    norm (``squared_bound``)."""
    shared = current_context().shared
    recorded = {**shared.get("bounds", {}), **shared.get("largest", {})}
    present = [t for t in tensors if t is not None]
    if present and all(id(t) in recorded for t in present):
        return within_largest(tf.reduce_max(tf.stack([_float32(recorded[id(t)][1])
                                                      for t in present])))
    return within_norm(squared_bound(tensors))


def _float32(x: Any) -> Any:
    """``x`` (a proof's bound: a number, or a float scalar) as a float32 scalar; a
    number past float32 becomes inf, which fails the bound that takes it."""
    return tf.cast(x if tf.is_tensor(x) else tf.constant(x, tf.float64), tf.float32)


def squared_bound(tensors: Sequence[Any]) -> Any:
    """A float32 bound of every element's square in ``tensors``: from the bounds
    recorded for them, else their sum of squares (which the engine has for the
    gradients: no extra pass). Finite only where every element is below 2**64."""
    bounds = current_context().shared.get("bounds", {})
    present = [t for t in tensors if t is not None]
    if present and all(id(t) in bounds for t in present):
        return tf.square(tf.reduce_max(tf.stack([bounds[id(t)][1] for t in present])))
    return squared_norm(tensors)


def weight_norm_bound(variables: Sequence[Any]) -> Any:
    """A float32 bound of each of ``variables``' norm (weights a proof reads): the top
    of the interval the step gave each (``shared["weights"]``, by handle: the norm
    of its group, read once per step), else their norm, read now."""
    given = current_context().shared.get("weights")
    if given:
        graph = tf.compat.v1.get_default_graph()
        found = [given.get(graph.capture(v.handle).ref()) for v in variables]
        if found and None not in found:
            return tf.reduce_max(tf.stack([interval.hi for interval in found]))
    return within_norm(sum_of_squares(variables)).hi


def held_state(tensors: Sequence[Any], ranged: Sequence[bool]) -> list[Interval]:
    """An interval for each of a transform's state ``tensors``: the one the step
    recorded for it (``record_state``), else its range where ``ranged`` says so
    (its least and largest element, NaN where one is), else the norm of all the
    others, read now."""
    recorded = current_context().shared.get("intervals", {})
    if all(id(t) in recorded for t in tensors):
        return [recorded[id(t)][1] for t in tensors]
    normed = [t for t, r in zip(tensors, ranged) if not r]
    norm = within_norm(squared_bound(normed)) if normed else None
    return [state_range([t]) if r or norm is None else norm for t, r in zip(tensors, ranged)]


def largest_element(tensor: Any) -> Any:
    """The largest element of a transform's state ``tensor``: the top of the interval
    the step recorded for it (``record_state``: read once for a group of variables),
    else read now."""
    recorded = current_context().shared.get("intervals", {})
    return recorded[id(tensor)][1].hi if id(tensor) in recorded else tf.reduce_max(tensor)


def largest_magnitude_element(tensor: Any) -> Any:
    """The largest magnitude among a transform's state ``tensor``'s elements (a first
    moment's, of either sign): from the interval the step recorded for it
    (``record_state``), else read now."""
    recorded = current_context().shared.get("intervals", {})
    if id(tensor) in recorded:
        return largest_magnitude(recorded[id(tensor)][1])
    return tf.reduce_max(tf.abs(tensor))


def record_state(tensors: Sequence[Any], held: Interval) -> None:
    """Remember that every element of ``tensors`` (a transform's state) lies in ``held``."""
    current_context().shared.setdefault("intervals", {}).update({id(t): (t, held) for t in tensors})
