"""One XLA function per distinct variable: compile time that grows with the shapes.

A step compiled as one XLA function grows with the variables: 50 variables of
one shape are traced and compiled 50 times over, in one function whose
compile time grows faster than its size (minutes for an adaptive rule at 50
variables of 400k floats). Where every transform of the chain computes each
variable's update and state from that variable's gradient, state and value
alone (*separable*, which the engine finds out, see ``separable_or_why_not``),
the step instead calls one small XLA function per variable. Each variable's
function is traced once, at build; variables whose functions trace to the same
graph share one, which XLA compiles once: those of one shape and dtype, and of
one path too where a transform's maths reads the variables' names.

The guarantees are the whole step's: the gradients' finite flag and every
variable's guard scalars (proofs, bounds or checks, from functions that write
nothing) are known before the first write. Each variable's function takes that
verdict as an argument, which orders its writes after it, and keeps its
variable and state where it is false. No conditional holds the calls (it would
capture every gradient and state: 0.1 s of the first step at 50 variables). A
guard that reads nothing of its variable (a proof from the gradients' norm and
its group's state's largest element, a bound from the norms or ranges of its
group's state and weights, read in the step) runs once per distinct function,
not once per variable.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, NamedTuple

import tensorflow as tf

from ..errors import GradpipeError
from ..names import variable_path
from ..tensors import all_finite
from ..transform import build_scope, record_squared_norm, squared_norm, sum_of_squares
from .bounds import held_state
from .intervals import Interval, largest_magnitude_of, state_range, within_norm
from .one_variable import OneVariableState, one_variable_structure
from .separable import variables_read
from .writes import assign

_SCALAR = tf.TensorSpec([], tf.float32)


class _Guard(NamedTuple):
    """A group's guard: its function, whether it reads each variable's own gradient,
    state or value (else it runs once for the group), the recheck of a failed bound
    (``None`` where no bound is used), and what the step reads for it: the
    ``(transform, leaf)`` state intervals and the weights' norm of the group."""

    function: Any
    per_variable: bool
    recheck: Any
    held: frozenset[tuple[int, int]] = frozenset()
    weights: bool = False


class PerVariable:
    """The step's per-variable XLA functions, traced at build (``trace``)."""

    def __init__(self, step: Any, hands_norm: bool = False) -> None:
        self._step = step
        # the first transform reads its input's global norm: each function is handed
        # the step's (``_fresh_scope``)
        self.hands_norm = hands_norm
        store = step.state
        variables = store.variables
        self._layouts: list[list[tuple[Any, list[bool]]]] = []  # per variable, per transform
        self._own: list[list[list[Any]]] = []
        self._shared: list[list[Any]] = [[] for _ in store.layout_items()]
        for j in range(len(variables)):
            layouts, own = [], []
            for i, (key, structure, names) in enumerate(store.layout_items()):
                owners = store.owners(i)
                single = one_variable_structure(structure, len(variables), j)
                picked = tf.nest.flatten(single)
                if sorted(picked) != sorted(k for k, o in enumerate(owners) if o in (None, j)):
                    raise GradpipeError(f"transform {key.split('_', 1)[1]} keeps state that "
                                        "is neither one entry per variable nor shared")
                owned = [owners[k] == j for k in picked]
                leaves = store.leaf_variables(i)
                own.append([leaves[names[k]] for k, mine in zip(picked, owned) if mine])
                if j == 0:
                    self._shared[i] = [leaves[names[k]] for k, mine in zip(picked, owned)
                                       if not mine]
                layouts.append((single, owned))
            self._layouts.append(layouts)
            self._own.append(own)
        self._apply: list[Any] = []
        self._guards: list[_Guard] = []

    # -- build ----------------------------------------------------------------

    def trace(self, guarded: bool, reads_names: bool) -> int:
        """Trace one function for each group of variables the same to the maths (shape,
        dtype, state; the path too where a transform reads it); return how many."""
        store = self._step.state
        shared = [[tf.TensorSpec(v.shape, v.dtype) for v in leaves]
                  for leaves in self._shared]
        groups: dict[Any, int] = {}
        self._apply, self._guards, self._group = [], [], []
        for j, var in enumerate(store.variables):
            key = (var.shape, var.dtype, var.trainable, variable_path(var) if reads_names
                   else None, repr([(tf.nest.map_structure(lambda _: 0, single), owned)
                                    for single, owned in self._layouts[j]]),
                   tuple((v.shape, v.dtype) for leaves in self._own[j] for v in leaves))
            first = groups.setdefault(key, j)
            self._group.append(first)
            if first != j:
                self._apply.append(self._apply[first])
                if guarded:
                    self._guards.append(self._guards[first])
                continue
            spec = tf.TensorSpec(var.shape, var.dtype)
            function = tf.function(functools.partial(self._apply_body, self._layouts[j]),
                                   jit_compile=True, autograph=False)
            function.get_concrete_function(spec, var, self._own[j], shared,
                                           tf.TensorSpec([], tf.bool), _SCALAR)
            self._apply.append(function)
            if guarded:
                # a chain whose bound reads one group's own reads every group's:
                # the other groups trace no plain guard (Lamb's norms: 0.14 s each)
                self._guards.append(self._trace_guard(j, spec, shared, plain=not any(
                    g.per_variable for g in self._guards)))
        return len(groups)

    def _trace_guard(self, j: int, spec: Any, shared: list[list[Any]], plain: bool
                     ) -> _Guard:
        """The guard of variable ``j``'s group: where it reads nothing of the variable
        (a proof or a bound from the norms the step has), a plain function run once
        per step, which costs no compile; else compiled, one call per variable, which
        reads the norms and ranges of its variable's state and weight itself (in
        the loops that read them anyway) instead of the step reading its group's.
        Where a transform is checked, the guard computes its outputs, so reads the
        variable's own: it is traced compiled only, as it is where not ``plain``."""
        var, own = self._step.state.variables[j], self._own[j]
        scalar = _SCALAR
        args = (spec, var, own, shared, scalar, self._interval_specs(j, scalar), [scalar] * 2,
                scalar)
        reads_own = self._step.guard.checks_some or not plain
        if not reads_own:
            function = tf.function(functools.partial(self._guard_body, self._layouts[j],
                                                     False), autograph=False)
            inputs = function.get_concrete_function(*args).graph.inputs
            reads_own = bool(variables_read(inputs[0].graph.outputs[0], {
                t.ref(): 0 for t in inputs[:2 + sum(len(leaves) for leaves in own)]}))
        if reads_own:
            compiled = tf.function(functools.partial(self._guard_body, self._layouts[j], True),
                                   jit_compile=True, autograph=False)
            compiled.get_concrete_function(*args)
            return _Guard(compiled, True, self._recheck(j))
        at = 2 + sum(len(leaves) for leaves in own) + sum(map(len, shared)) + 1
        held = set()
        for i, (_, owned) in enumerate(self._layouts[j]):  # [lo, hi] per state leaf
            for k in range(len(owned)):
                if any(t.consumers() for t in inputs[at:at + 2]):
                    held.add((i, k))
                at += 2
        return _Guard(function, False, self._recheck(j), frozenset(held),
                      any(t.consumers() for t in inputs[at:at + 2]))

    def _recheck(self, j: int) -> Any:
        """The guard of variable ``j``'s group without bounds, for a step where one
        fails (``None`` where the chain uses no bound)."""
        if not self._step.guard.used_bounds:
            return None
        return tf.function(functools.partial(self._recheck_body, self._layouts[j]),
                           jit_compile=True, autograph=False)

    def _interval_specs(self, j: int, scalar: Any) -> list[list[list[Any]]]:
        """Per transform, per leaf of variable ``j``'s state: ``[lo, hi]`` of ``scalar``."""
        return [[[scalar, scalar] for _ in owned] for _, owned in self._layouts[j]]

    def _held(self, first: int, members: list[int], shared: list[list[Any]]
              ) -> list[list[list[Any]]]:
        """The intervals the state of group ``first`` lies in: per transform, per leaf,
        the leaf's norm or range (``Guard.ranges``) over the group's ``members``, or,
        for a proof, within its largest magnitude, all a proof reads (``bounds``'
        ``largest_element``, ``largest_magnitude_element``); zeros where none is read."""
        guard = self._step.guard
        reads = self._guards[first].held
        held = self._interval_specs(first, tf.constant(0.0))
        for i, (_, owned) in enumerate(self._layouts[first]):
            for k, mine in enumerate(owned):
                if (i, k) not in reads:  # nothing read: no op traced either
                    continue
                at = sum(owned[:k]) if mine else k - sum(owned[:k])  # among own or shared
                leaves = ([self._own[j][i][at].read_value() for j in members] if mine
                          else [shared[i][at]])
                if not leaves[0].dtype.is_floating:
                    continue
                if guard.proofs[i] is not None:
                    held[i][k] = [-(most := largest_magnitude_of(leaves)), most]
                else:
                    held[i][k] = list(state_range(leaves) if guard.ranges(i, k)
                                      else held_state(leaves, [False] * len(leaves))[0])
        return held

    def trials(self) -> list[tuple[Any, tuple[Any, ...]]]:
        """Each distinct compiled function with arguments to lower it with (the build's
        XLA check): the variables themselves, zeros for the gradient, the shared state."""
        shared = [[leaf.read_value() for leaf in leaves] for leaves in self._shared]
        found: dict[int, tuple[Any, tuple[Any, ...]]] = {}
        variables = self._step.state.variables
        for j, function in enumerate(self._apply):
            if id(function) in found:
                continue
            g = tf.zeros(variables[j].shape, variables[j].dtype)
            found[id(function)] = (function, (g, variables[j], self._own[j], shared,
                                              tf.constant(True), tf.constant(0.0)))
            if self._guards and self._guards[j].per_variable:
                found[id(self._guards[j])] = (self._guards[j].function, (
                    g, variables[j], self._own[j], shared, tf.constant(0.0),
                    self._interval_specs(j, tf.constant(0.0)), [tf.constant(0.0)] * 2,
                    tf.constant(0.0)))
        return list(found.values())

    # -- the traced bodies ------------------------------------------------------

    @contextlib.contextmanager
    def _fresh_scope(self, g: Any, input_norm: Any) -> Iterator[dict[str, Any]]:
        """The pipeline's build scope with nothing shared from other traces, and nothing
        left for them: each function traces one variable's chain on its own. The
        chain's input ``[g]`` has the sum of squares of all the step's gradients
        (``input_norm``): a first transform that reads its input's global norm reads
        that one, as it would over every variable."""
        context = self._step.context
        with build_scope(context):
            context.shared.clear()
            if self.hands_norm:
                record_squared_norm([g], input_norm)
            try:
                yield context.shared
            finally:
                context.shared.clear()

    def _apply_body(self, layouts: Any, g: Any, var: Any, own: Any, shared: Any,
                    applies: Any, input_norm: Any) -> Any:
        """Variable ``var``'s update where ``applies`` (the step's verdict), its value
        and state kept where not: selects XLA fuses into the update's loops, and the
        writes ordered as the compiled step orders them."""
        step = self._step
        view = OneVariableState(var, layouts, own, shared)
        with self._fresh_scope(g, input_norm):
            step.kept_by_transforms = set()
            updates, new_states, _ = step.run_chain([g], applies=applies, store=view)
            ops = assign(view, new_states, updates, applies=applies,
                         kept=step.kept_by_transforms)
        with tf.control_dependencies(ops):
            return [tf.identity(v) for v in tf.nest.flatten(view.new_shared)] + [
                tf.constant(True)]

    def _guard_body(self, layouts: Any, inside: bool, g: Any, var: Any, own: Any,
                    shared: Any, bound: Any, state_bounds: Any, weight_bound: Any,
                    input_norm: Any) -> Any:
        """Whether the chain's outputs for ``g`` are finite, from its proofs, bounds and
        checks: the gradient's elements lie within ``bound`` (the root of the step's
        sum of squares), each transform's state within its ``state_bounds`` interval,
        the variable's within ``weight_bound`` (where the maths reads it: then the
        guard reads nothing of the variable, and runs once for its group); ``inside``:
        the state's and the variable's read here instead, for this variable alone."""
        view = OneVariableState(var, layouts, own, shared,
                                bounds=None if inside else state_bounds)
        with self._fresh_scope(g, input_norm) as known:
            known["bounds"] = {id(g): (g, bound)}
            if not inside:
                handle = tf.compat.v1.get_default_graph().capture(var.handle)
                known["weights"] = {handle.ref(): Interval(*weight_bound)}
            return all_finite(self._step.run_chain([g], guard=True, store=view)[2])

    def _recheck_body(self, layouts: Any, g: Any, var: Any, own: Any, shared: Any,
                      input_norm: Any) -> Any:
        """The guard without bounds, for a step where a bound failed: compiled the first
        time one fails."""
        view = OneVariableState(var, layouts, own, shared)
        with self._fresh_scope(g, input_norm):
            return all_finite(self._step.run_chain([g], guard=True, bounds=False,
                                                   store=view)[2])

    # -- the step -----------------------------------------------------------------

    def update(self, grads: list[Any], finite: tf.Tensor | None, counters: Any,
               of_sum: bool = False) -> tf.Tensor:
        """Guard every variable, then update each in its own function, given the
        verdict (it keeps the variable where the step is skipped), write the shared
        state once and count the step as applied or skipped. ``of_sum``: ``finite``
        is only whether the gradients' sum of squares is; where it is not, the
        gradients are checked one by one in the verdict's rare branch."""
        variables = self._step.state.variables
        shared = [[leaf.read_value() for leaf in leaves] for leaves in self._shared]
        present = [j for j, g in enumerate(grads) if g is not None]
        finite = tf.constant(True) if finite is None else finite
        # the guards' bound and the handed norm; nothing else reads it
        input_norm = (tf.cast(squared_norm(grads), tf.float32)
                      if self._guards or self.hands_norm else tf.constant(0.0))
        guards_ok, rechecked = (self._guarded(grads, variables, shared, present, input_norm)
                                if self._guards else (tf.constant(True), []))
        ok = self._verdict(finite, guards_ok, grads, present, rechecked, of_sum, input_norm)
        outputs = [self._apply[j](grads[j], variables[j], self._own[j], shared, ok,
                                  input_norm) for j in present]
        done = [t for out in outputs for t in out[-1:]]
        with tf.control_dependencies(done):
            flat = [leaf for leaves in self._shared for leaf in leaves]
            ops = [leaf.assign(value) for leaf, value in zip(flat, outputs[0][:-1])]
        with tf.control_dependencies(done + ops):
            counters.iterations.assign_add(tf.cast(ok, tf.int64))
            counters.skipped.assign_add(tf.cast(~ok, tf.int64))
        with tf.control_dependencies([counters.iterations.read_value()]):
            return tf.identity(ok)

    def _guarded(self, grads: list[Any], variables: list[Any], shared: list[list[Any]],
                 present: list[int], input_norm: Any) -> tuple[tf.Tensor, list[int]]:
        """Whether every guard holds, and the variables whose bounds are rechecked."""
        bound = tf.sqrt(input_norm)
        groups: dict[int, list[int]] = {}
        for j in present:
            groups.setdefault(self._group[j], []).append(j)
        results = []
        for first, members in groups.items():
            held = self._held(first, members, shared)
            guard = self._guards[first]
            weights = (list(within_norm(sum_of_squares([variables[j] for j in members])))
                       if guard.weights else [tf.constant(0.0)] * 2)
            for j in members if guard.per_variable else members[:1]:
                results.append(guard.function(grads[j], variables[j], self._own[j], shared,
                                              bound, held, weights, input_norm))
        return all_finite(results), [j for j in present
                                     if self._guards[j].recheck is not None]

    def _verdict(self, finite: tf.Tensor, guards_ok: tf.Tensor, grads: list[Any],
                 present: list[int], rechecked: list[int], of_sum: bool, input_norm: Any
                 ) -> tf.Tensor:
        """``finite & guards_ok`` where both are exact; else decided in one rare branch,
        run eagerly: the gradients checked one by one (``of_sum``), then the failed
        bounds without bounds. One conditional for both: each costs 0.1 s of the
        first step at 50 variables."""
        fast = finite & guards_ok
        if not of_sum and not rechecked:
            return fast
        variables, given = self._step.state.variables, present if of_sum else rechecked

        def rare(guards_held: Any, norm: Any, *tensors: Any) -> tf.Tensor:
            # traced and compiled when it first runs; the writes wait for the verdict
            if of_sum and not bool(all_finite(tensors)):
                return tf.constant(False)
            if bool(guards_held) or not rechecked:
                return guards_held
            now = [[leaf.read_value() for leaf in leaves] for leaves in self._shared]
            by_index = dict(zip(given, tensors))
            return all_finite([self._guards[j].recheck(by_index[j], variables[j],
                                                       self._own[j], now, norm)
                               for j in rechecked])

        settled = fast if of_sum else fast | ~finite
        return tf.cond(settled, lambda: fast, lambda: tf.reshape(tf.py_function(
            rare, [guards_ok, input_norm, *(grads[j] for j in given)], Tout=tf.bool), []))

