"""How a step knows every transform's outputs finite before its first write.

Each transform's updates and new state are *proved* finite (gradpipe's own
maths, :mod:`gradpipe._engine.proofs`), *bounded* (any other maths the engine
can follow, :mod:`gradpipe._engine.bounds`), or *checked*: one sum over them
(``step_ops.finite_outputs``). A proof or a bound is a sufficient condition
computed from a few scalars; where a bound fails at run time (a state too
large for it), the chain is checked instead, so a bound never skips a step
that a check would apply. ``pipe.plan`` says which each transform gets.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ..spec import PipelineSpec
from ..tensors import all_finite
from ..transform import BuildContext, build_scope
from .answers import remembered
from .bounds import bound_outputs, held_state, input_interval, record_bounds, record_largest
from .intervals import Unbounded
from .proofs import CheckedWhereItFails, Prove, Proved
from .scalar_values import own_values, taken_as_values
from .separable import variables_read
from .state_reads import (
    BY_NORM,
    BY_RANGE,
    NORMS_AT_VALUES,
    NORMS_WITHIN,
    WEIGHTS,
    Ranged,
    leaf_names,
    leaf_positions,
    reads_range,
    some_ranged,
)
from .step_ops import finite_outputs

#: how a traced transform's outputs were known finite ("proved", "bounded" or
#: "checked"), the scalars that say so, its outputs and its new state
Seen = tuple[str, list[Any], list[Any], Any]


class Guard:
    """The finite guarantee of one pipeline's chain, while a step is traced."""

    def __init__(self, proofs: list[Prove | None], bounded: tuple[int, ...],
                 ranged: tuple[tuple[int, Ranged], ...], valued: tuple[int, ...],
                 context: BuildContext) -> None:
        self.proofs, self.bounded, self.context = proofs, set(bounded), context
        self.ranged = dict(ranged)  # the state leaves whose range a bound reads
        self.valued = set(valued)  # bounds that take their maths' norms at their values
        self.seen: list[Seen] = []  # per transform of the chain traced last

    def ranges(self, i: int, leaf: int) -> bool:
        """Whether transform ``i``'s bound reads the range of its state's leaf ``leaf``
        (its position in one variable's state), not only its norm."""
        return reads_range(self.ranged.get(i, False), leaf)

    @property
    def used_bounds(self) -> bool:
        """Whether the chain traced last used a bound (``chain_finite`` then rechecks)."""
        return any(kind == "bounded" for kind, *_ in self.seen)

    @property
    def checks_some(self) -> bool:
        """Whether some transform's outputs are checked (no proof, no bound): a guard
        then computes them, from each variable's own gradient and state."""
        return any(p is None and i not in self.bounded for i, p in enumerate(self.proofs))

    def outputs_finite(self, i: int, inputs: list[Any], old: Any, outputs: list[Any],
                       state: Any, bounds: bool, variables: list[Any]) -> list[Any]:
        """Scalars under which transform ``i``'s outputs are finite: its proof's, the
        bounds of its maths (``bounds``, where the plan found them), or one check over
        its updates and new state. A proof ``CheckedWhereItFails`` counts as a bound."""
        prove = self.proofs[i]
        as_bound = isinstance(prove, CheckedWhereItFails)
        required = prove(inputs, lambda: old, variables) if prove is not None and (
            bounds or not as_bound) else None
        kind = "bounded" if as_bound else "proved"
        if isinstance(required, Proved):  # its updates' bound, for a later transform's
            required, largest = required
            record_largest(outputs, largest)
        if required is None and bounds and i in self.bounded:
            required = bounded_outputs(inputs, old, outputs, state, self.ranged.get(i, False),
                                       by_value=i in self.valued)
            kind = "bounded"
        if required is None:
            required, kind = [finite_outputs(outputs, tf.nest.flatten(state))], "checked"
        self.seen.append((kind, required, outputs, state))
        return required

    @staticmethod
    def checked_from_outputs(seen: list[Seen]) -> list[Any] | None:
        """The scalars a recheck without bounds gives for a traced chain (``seen``), from
        the outputs that trace computed: each transform from the first bounded one on
        checked, the proofs before it as they are. ``None`` where a transform after a
        bounded one is proved: its proof may read that bound, so the chain is traced
        again. Only for a step whose outputs exist before its verdict anyway (the plain
        step's, whose writes take them): no copy of the maths is traced."""
        first = next((k for k, each in enumerate(seen) if each[0] == "bounded"), None)
        if first is None or any(each[0] == "proved" for each in seen[first + 1:]):
            return None
        return [t for _, required, _, _ in seen[:first] for t in required] + [
            required[0] if kind == "checked" else
            finite_outputs(outputs, tf.nest.flatten(state))
            for kind, required, outputs, state in seen[first:]]

    def proved(self, i: int, inputs: list[Any], read_state: Callable[[], Any],
               variables: list[Any]) -> list[Any]:
        """The scalars of transform ``i``'s proof for ``inputs`` (false where it proves
        nothing for them: an in-place kernel writes before a check could run)."""
        prove = self.proofs[i]
        scalars = prove(inputs, read_state, variables) if prove is not None else None
        if isinstance(scalars, Proved):
            scalars = scalars.required
        return scalars if scalars is not None else [tf.constant(False)]

    def chain_finite(self, required: list[Any], recheck: Callable[[], list[Any]],
                     kept: list[Seen] | None = None) -> tf.Tensor:
        """Whether the chain's outputs are finite, from ``required`` (its transforms'
        proofs, bounds and checks); where a bound was among them and fails, from
        ``recheck()``, the chain traced again without bounds in a branch that only
        then runs, or from the outputs the step keeps (``kept``: the chain's ``seen``)
        where ``checked_from_outputs`` can."""
        ok = all_finite(required)
        if not self.used_bounds:
            return ok
        shared = self.context.shared

        def checked() -> tf.Tensor:
            saved = {k: dict(v) if isinstance(v, dict) else v for k, v in shared.items()}
            try:  # what the recheck records belongs to its branch's graph
                again = self.checked_from_outputs(kept) if kept else None
                return all_finite(again if again is not None else recheck())
            finally:
                shared.clear()
                shared.update(saved)

        return tf.cond(ok, lambda: tf.constant(True), checked)


def bounded_outputs(inputs: list[Any], old: Any, outputs: list[Any], state: Any,
                    ranged: Ranged = False, *, by_value: bool = False) -> list[Any] | None:
    """The scalars under which a transform's ``outputs`` and new ``state`` are finite,
    from the bounds of its maths; ``None`` where this trace has none (sparse
    gradients, an operation without a bound, a step run eagerly, which leaves no
    graph to walk): the outputs are then checked."""
    if tf.executing_eagerly():
        return None
    try:
        return _bounded(inputs, old, outputs, state, ranged, by_value=by_value)
    except Unbounded:
        return None


def _bounded(inputs: list[Any], old: Any, outputs: list[Any], state: Any,
             ranged: Ranged, values: dict[Any, Any] | None = None, *,
             by_value: bool = False) -> list[Any]:
    """``bounded_outputs``' scalars; with ``values`` (``bound_outputs``: the inputs,
    old state, scalars and weight reads computed already), computed now."""
    leaves = [t for t in tf.nest.flatten(state) if isinstance(t, (tf.Tensor, tf.Variable))]
    before = [t for t in tf.nest.flatten(old) if isinstance(t, tf.Tensor)
              and t.dtype.is_floating]
    present = [g for g in inputs if g is not None]
    results = [t for t in [*outputs, *leaves] if t is not None]
    if any(isinstance(t, (tf.IndexedSlices, tf.Variable)) for t in
           [*present, *results, *tf.nest.flatten(old)]):
        raise Unbounded("sparse gradients or state")
    value = (lambda t: values.get(t.ref(), t)) if values else (lambda t: t)
    known = {}
    if present:
        # the same list as the step's (its norm is recorded under its tensors' ids)
        gradients = input_interval([g if g is None else value(g) for g in inputs])
        known = {g.ref(): gradients for g in present}
    if before:  # one read of the state, unless the step has read it already
        positions = leaf_positions(old, len(inputs)) if not isinstance(ranged, bool) else {}
        held = held_state([value(t) for t in before],
                          [reads_range(ranged, positions.get(id(t), -1)) for t in before])
        known.update({t.ref(): interval for t, interval in zip(before, held)})
    bounded = bound_outputs(results, known, values, by_value=by_value)
    record_bounds(bounded.magnitudes, outputs)
    return bounded.required


def maths_key(spec: PipelineSpec, i: int) -> tuple[Any, ...]:
    """What transform ``i``'s maths depends on besides its code: its component and
    version, its config and the schedules of the file (a field may name one)."""
    t = spec.transforms[i]
    return (t.dist, t.version, t.name, repr(t.config), repr(spec.schedules))


def how_bounded(transform: Any, context: Any, key: tuple[Any, ...]) -> str:
    """What the engine reads of ``transform``'s state to bound its maths
    (:mod:`gradpipe._engine.state_reads`), else why it does not bound it: its update
    traced once for two small variables and run once on ordinary values (unit
    gradients, a state of 0.5, weights from -0.5 to 0.5) for the scalars and weights
    it reads, and its bounds computed from those values (0.05 to 0.2 s), its state
    held within its norm, and else within its range (its least and largest
    element, one more pass over it: what proves the square root of a running mean
    of squares, which the norm cannot); then each leaf in turn is left to the norm
    where the bounds still hold (a few ms each). Each of these holds the norms and
    sums the maths computes within the bounds of what they reduce, and failing
    that, takes their values (``scalar_values``): the guard then computes them
    again. Where all fail even there, every step would be checked after all, and
    the transform is checked from the start.
    The answer is found once for ``key`` (``maths_key``) and the update's code, and
    remembered across processes (``answers``). It only picks the guard's mode:
    each step's bounds are traced from the step's own maths, and fall back to a
    check."""
    return remembered(key, transform.update, lambda: _how_bounded(transform, context))


def _how_bounded(transform: Any, context: Any) -> str:
    # weights of either sign, as trained ones are (a rule may read them)
    variables = [tf.Variable(tf.linspace(-0.5, 0.5, 3), name="probe/bias"),
                 tf.Variable(tf.reshape(tf.linspace(-0.5, 0.5, 6), [2, 3]), name="probe/kernel")]
    traced: dict[str, Any] = {}

    def update(grads: list[Any], state: Any) -> list[Any]:
        with build_scope(context):
            context.shared.clear()
            outputs, new = transform.update(list(grads), state, variables)
        traced.update(grads=list(grads), state=state, outputs=list(outputs), new=new)
        results = [*outputs, *tf.nest.flatten(new)]
        scalars = taken_as_values(results, own_values(True))
        within = own_values(False)
        traced["norms"] = any(t.shape.num_elements() == 1 and not within(t) for t in scalars)
        taken = {t.ref(): t for t in [*scalars, *taken_as_values(results, within)]}
        traced["taken"] = list(taken.values())
        return traced["taken"]

    try:
        with build_scope(context):
            state = tf.nest.map_structure(tf.convert_to_tensor, transform.init(variables))
        held = tf.nest.map_structure(
            lambda t: tf.fill(tf.shape(t), tf.cast(0.5, t.dtype)) if t.dtype.is_floating
            else t, state)
        grads = [tf.ones(v.shape, v.dtype) for v in variables]
        specs = ([tf.TensorSpec.from_tensor(g) for g in grads],
                 tf.nest.map_structure(tf.TensorSpec.from_tensor, held))
        # Run for only the scalars and weights its maths reads; the bounds are then
        # computed eagerly from those values: a graph of their few scalar ops each
        # took 3x longer to build and run than the eager ops take, twice where the
        # norm fails and the range is tried (it costs one more pass per step)
        concrete = tf.function(update, autograph=False).get_concrete_function(*specs)
        taken = concrete(grads, held) if traced["taken"] else []
        values = {t.ref(): v for t, v in zip(traced["taken"], taken)}
        values.update((t.ref(), v) for t, v in zip(traced["grads"], grads))
        values.update((t.ref(), v) for t, v in zip(tf.nest.flatten(traced["state"]),
                                                   tf.nest.flatten(held)))

        def holds(ranged: Ranged, by_value: bool) -> bool:
            with build_scope(context):
                context.shared.clear()
                try:
                    required = _bounded(traced["grads"], traced["state"], traced["outputs"],
                                        traced["new"], ranged, values, by_value=by_value)
                except Unbounded:  # inside a norm, say: its value may still bound it
                    if by_value or not traced["norms"]:
                        raise
                    return False
            return bool(all_finite(required))

        # the cheapest reads first: a range costs two passes over a leaf, a norm's
        # value about one over the tensor it reduces
        for ranged in (False, True):
            # without norms or sums in the maths, both ways are the same walk
            for by_value in (False, True) if traced["norms"] else (False,):
                if not holds(ranged, by_value):
                    continue
                answer = BY_NORM if not ranged else _fewest_ranged(
                    traced["state"], len(variables), functools.partial(holds, by_value=by_value))
                norms = NORMS_AT_VALUES if by_value else NORMS_WITHIN
                answer = norms + answer if traced["norms"] else answer
                return answer + WEIGHTS if _reads_weights(concrete, traced, variables) \
                    else answer
    except Unbounded as exc:
        return str(exc)
    except Exception as exc:  # a transform that cannot be traced so is checked
        return f"its update could not be traced for bounds ({type(exc).__name__})"
    finally:
        context.shared.clear()
    return "its bounds fail on ordinary values, even from its state's range"


def _reads_weights(concrete: Any, traced: dict[str, Any], variables: list[Any]) -> bool:
    """Whether the traced maths' outputs or new state read a variable's value (then
    its bound reads the weights' norm)."""
    handles = {id(v.handle) for v in variables}
    source: dict[Any, int | None] = {
        inside.ref(): 0 for outside, inside in concrete.graph.captures
        if id(outside) in handles}
    return any(variables_read(t, source) for t in [*traced["outputs"],
                                                  *tf.nest.flatten(traced["new"])]
               if isinstance(t, tf.Tensor))


def _fewest_ranged(state: Any, count: int, holds: Callable[[Ranged], bool]) -> str:
    """The answer that reads the range of the fewest leaves of ``state`` (for ``count``
    variables) under which the bounds still hold: each floating leaf in turn left to
    the norm where they do."""
    positions = leaf_positions(state, count)
    floating = sorted({positions[id(t)] for t in tf.nest.flatten(state)
                       if isinstance(t, tf.Tensor) and t.dtype.is_floating})
    ranged = set(floating)
    for leaf in floating:
        if holds(frozenset(ranged - {leaf})):
            ranged.discard(leaf)
    if ranged == set(floating):
        return BY_RANGE
    names = leaf_names(state, count)
    return some_ranged({k: names[k] for k in ranged})
