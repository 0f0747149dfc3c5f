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
variable's guard scalars (its proofs, bounds or checks, from a function of its
own that writes nothing) are known before the first write, and the writes run
under one conditional, so a skipped step writes nothing. A guard function
that reads nothing of its variable (a proof from the gradients' norm) runs
once per distinct function, not once per variable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from ..errors import GradpipeError
from ..names import leaf_names, variable_path
from ..tensors import all_finite
from ..transform import build_scope, squared_norm
from .bounds import Interval, held_state, hull, record_state
from .step_ops import exactly_one_after
from .writes import assign


class OneVariableState:
    """One variable's view of the state store, inside its traced function: what the
    chain reads (``read``) and what ``writes.assign`` writes. The state a transform
    shares between variables (a step count) comes in as values read once for all
    variables, and its new values go out (``new_shared``): the step writes them once."""

    packing = None
    present = None

    def __init__(self, var: Any, layouts: list[tuple[Any, list[bool]]],
                 own: list[list[Any]], shared: list[list[Any]],
                 bounds: list[Any] | None = None) -> None:
        self.variables, self.frozen = [var], [False]
        self._bounds = bounds
        self.masks = [[True] for _ in layouts]
        self._layouts, self._own, self._shared = layouts, own, shared
        self.new_shared: list[list[Any]] = [list(values) for values in shared]

    def read(self, i: int, sparse: Any = frozenset()) -> Any:
        structure, owned = self._layouts[i]
        own, shared = iter(self._own[i]), iter(self._shared[i])
        values = [next(own).read_value() if mine else next(shared) for mine in owned]
        if self._bounds is not None:  # the step's bounds of the state: no read here
            for t, held in zip(values, self._bounds[i]):
                if isinstance(t, tf.Tensor) and t.dtype.is_floating:
                    record_state([t], Interval(*held))
        return tf.nest.pack_sequence_as(structure, values)

    def write(self, new_states: dict[int, Any], after: dict[int, Any] | None = None,
              kept: set[int] | None = None) -> list[Any]:
        ops = []
        for i, state in new_states.items():
            structure, owned = self._layouts[i]
            try:
                tf.nest.assert_same_structure(structure, state)
            except (ValueError, TypeError) as exc:
                raise GradpipeError(f"transform {i} returned a state whose structure "
                                    f"differs from its init(): {exc}") from None
            own, shared = iter(self._own[i]), iter(range(len(self._shared[i])))
            for mine, value in zip(owned, tf.nest.flatten(state)):
                if not mine:
                    self.new_shared[i][next(shared)] = value
                    continue
                leaf = next(own)
                value = tf.cast(value, leaf.dtype)
                previous = None if after is None or id(value) in (kept or ()) else after.get(0)
                if previous is not None and leaf.dtype.is_floating:
                    value = value * exactly_one_after(previous, leaf.dtype)
                ops.append(leaf.assign(value))
        return ops

    def refresh_from_masters(self, updates: list[Any]) -> list[Any]:
        return []  # per-variable functions are chosen only without half-precision masters


def one_variable_structure(structure: Any, count: int, index: int) -> Any:
    """``structure`` (a state nest of ``count`` variables) as ``init`` gives it for
    variable ``index`` alone: each list of one entry per variable keeps its entry."""
    if isinstance(structure, dict):
        return {k: one_variable_structure(v, count, index) for k, v in structure.items()}
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return type(structure)(*(one_variable_structure(v, count, index) for v in structure))
    if isinstance(structure, (list, tuple)):
        items = [structure[index]] if len(structure) == count else structure
        return type(structure)(one_variable_structure(v, count, index) for v in items)
    return structure


class _Guard(NamedTuple):
    """A group's guard: its function, whether it reads each variable's own gradient,
    state or value (else it runs once for the group), and the recheck of a failed
    bound (``None`` where no bound is used)."""

    function: Any
    per_variable: bool
    recheck: Any


class PerVariable:
    """The step's per-variable XLA functions, traced at build (``trace``)."""

    def __init__(self, step: Any) -> None:
        self._step = step
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
        self._state_bounds = False  # whether a guard bounds a transform's state

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
            function.get_concrete_function(spec, var, self._own[j], shared)
            self._apply.append(function)
            if guarded:
                self._guards.append(self._trace_guard(j, spec, shared))
        return len(groups)

    def _trace_guard(self, j: int, spec: Any, shared: list[list[Any]]) -> _Guard:
        """The guard of variable ``j``'s group: where it reads nothing of the variable
        (a proof or a bound from the norms the step has), a plain function run once
        per step, which costs no compile; else compiled, one call per variable."""
        var, own = self._step.state.variables[j], self._own[j]
        scalar = tf.TensorSpec([], tf.float32)
        args = (spec, var, own, shared, scalar, self._interval_specs(j, scalar))
        body = functools.partial(self._guard_body, self._layouts[j])
        function = tf.function(body, autograph=False)
        concrete = function.get_concrete_function(*args)
        used_bounds = self._step.guard.used_bounds
        inputs = concrete.graph.inputs
        per_variable = bool(_variables_read(concrete.graph.outputs[0], {
            t.ref(): 0 for t in inputs[:2 + sum(len(leaves) for leaves in own)]}))
        bounds_at = 2 + sum(len(leaves) for leaves in own) + sum(map(len, shared)) + 1
        pairs = sum(len(owned) for _, owned in self._layouts[j])
        self._state_bounds |= any(t.consumers() for t in inputs[bounds_at:bounds_at + 2 * pairs])
        if per_variable:  # traced again, compiled: it reads each variable's tensors
            function = tf.function(body, jit_compile=True, autograph=False)
            function.get_concrete_function(*args)
        recheck = tf.function(functools.partial(self._recheck_body, self._layouts[j]),
                              jit_compile=True, autograph=False) if used_bounds else None
        return _Guard(function, per_variable, recheck)

    def _interval_specs(self, j: int, scalar: Any) -> list[list[list[Any]]]:
        """Per transform, per leaf of variable ``j``'s state: ``[lo, hi]`` of ``scalar``."""
        return [[[scalar, scalar] for _ in owned] for _, owned in self._layouts[j]]

    def _held(self, first: int, members: list[int], shared: list[list[Any]]
              ) -> list[list[list[Any]]]:
        """The intervals the state of group ``first`` lies in: per transform, per leaf,
        the leaf's norm or range (``Guard.ranged``) over the group's ``members``;
        zeros where the guard bounds no state."""
        bounded, ranged = self._step.guard.bounded, self._step.guard.ranged
        held = self._interval_specs(first, tf.constant(0.0))
        for i, (_, owned) in enumerate(self._layouts[first]):
            own, common = 0, 0
            for k, mine in enumerate(owned):
                if mine:
                    leaves = [self._own[j][i][own].read_value() for j in members]
                    own += 1
                else:
                    leaves = [shared[i][common]]
                    common += 1
                if self._state_bounds and i in bounded and leaves[0].dtype.is_floating:
                    held[i][k] = list(hull(held_state(leaves, i in ranged)))
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
            found[id(function)] = (function, (g, variables[j], self._own[j], shared))
            if self._guards and self._guards[j].per_variable:
                found[id(self._guards[j])] = (self._guards[j].function, (
                    g, variables[j], self._own[j], shared, tf.constant(0.0),
                    self._interval_specs(j, tf.constant(0.0))))
        return list(found.values())

    # -- the traced bodies ------------------------------------------------------

    def _apply_body(self, layouts: Any, g: Any, var: Any, own: Any, shared: Any) -> Any:
        step, context = self._step, self._step.context
        view = OneVariableState(var, layouts, own, shared)
        with build_scope(context):
            context.shared.clear()
            try:
                # a constant "applies": the selects a skippable step needs fold away,
                # and the writes are ordered as the compiled step orders them
                applies = tf.constant(True)
                step.kept_by_transforms = set()
                updates, new_states, _ = step.run_chain([g], applies=applies, store=view)
                ops = assign(view, new_states, updates, applies=applies,
                             kept=step.kept_by_transforms)
            finally:
                context.shared.clear()
        with tf.control_dependencies(ops):
            return [tf.identity(v) for v in tf.nest.flatten(view.new_shared)] + [
                tf.constant(True)]

    def _guard_body(self, layouts: Any, g: Any, var: Any, own: Any, shared: Any,
                    bound: Any, state_bounds: Any) -> Any:
        """Whether the chain's outputs for ``g`` are finite, from its proofs, bounds and
        checks: the gradient's elements lie within ``bound`` (the root of the step's
        sum of squares), each transform's state within its ``state_bounds`` interval."""
        step, context = self._step, self._step.context
        view = OneVariableState(var, layouts, own, shared, bounds=state_bounds)
        with build_scope(context):
            context.shared.clear()
            try:
                context.shared["bounds"] = {id(g): (g, bound)}
                return all_finite(step.run_chain([g], guard=True, store=view)[2])
            finally:
                context.shared.clear()

    def _recheck_body(self, layouts: Any, g: Any, var: Any, own: Any, shared: Any) -> Any:
        """The guard without bounds, for a step where a bound failed: compiled the first
        time one fails."""
        step, context = self._step, self._step.context
        view = OneVariableState(var, layouts, own, shared)
        with build_scope(context):
            context.shared.clear()
            try:
                return all_finite(step.run_chain([g], guard=True, bounds=False,
                                                 store=view)[2])
            finally:
                context.shared.clear()

    # -- the step -----------------------------------------------------------------

    def update(self, grads: list[Any], finite: tf.Tensor | None,
               reject: Callable[[], tf.Tensor], iterations: tf.Variable) -> tf.Tensor:
        """Guard every variable, then, under one conditional, update each in its own
        function and write the shared state once."""
        variables = self._step.state.variables
        shared = [[leaf.read_value() for leaf in leaves] for leaves in self._shared]
        present = [j for j, g in enumerate(grads) if g is not None]
        ok = tf.constant(True) if finite is None else finite
        if self._guards:
            ok = ok & self._guarded(grads, variables, shared, present, ok)

        def commit() -> tf.Tensor:
            outputs = [self._apply[j](grads[j], variables[j], self._own[j], shared)
                       for j in present]
            done = [t for out in outputs for t in out[-1:]]
            with tf.control_dependencies(done):
                flat = [leaf for leaves in self._shared for leaf in leaves]
                ops = [leaf.assign(value) for leaf, value in zip(flat, outputs[0][:-1])]
            with tf.control_dependencies(done + ops):
                iterations.assign_add(1)
            with tf.control_dependencies([iterations.read_value()]):
                return tf.constant(True)

        return tf.cond(ok, commit, reject)

    def _guarded(self, grads: list[Any], variables: list[Any], shared: list[list[Any]],
                 present: list[int], finite: tf.Tensor) -> tf.Tensor:
        bound = tf.sqrt(tf.cast(squared_norm(grads), tf.float32))
        groups: dict[int, list[int]] = {}
        for j in present:
            groups.setdefault(self._group[j], []).append(j)
        results = []
        for first, members in groups.items():
            held = self._held(first, members, shared)
            guard = self._guards[first]
            for j in members if guard.per_variable else members[:1]:
                results.append(guard.function(grads[j], variables[j], self._own[j], shared,
                                              bound, held))
        ok = all_finite(results)
        if not any(self._guards[j].recheck is not None for j in present):
            return ok

        def recheck() -> tf.Tensor:
            return all_finite([self._guards[j].recheck(grads[j], variables[j], self._own[j],
                                                       shared)
                               for j in present if self._guards[j].recheck is not None])

        return tf.cond(ok | ~finite, lambda: ok, recheck)


def probe_transform(transform: Any, context: Any) -> tuple[str, bool]:
    """Whether ``transform`` computes each variable's updates and state from that
    variable's gradient, state and value alone ("" if it does, else why not), and
    whether its maths reads the variables' names (then no two variables share a
    function): its update traced for two small variables, each output followed
    back to the inputs it reads. A global norm of its inputs, a state shared by
    all variables that some variable's gradient writes, or any other mixing shows
    there."""
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

        def probe(grads: list[Any], old: Any) -> Any:
            with build_scope(context):
                context.shared.clear()
                outputs, new = transform.update(list(grads), old, variables)
            return list(outputs), tf.nest.flatten(new)

        concrete = tf.function(probe, autograph=False).get_concrete_function(
            [tf.TensorSpec(v.shape, v.dtype) for v in variables], specs)
    except Exception as exc:  # a transform that cannot be traced so runs as a whole
        return (f"its update could not be traced for two variables "
                f"({type(exc).__name__})", bool(named))
    finally:
        context.shared.clear()
    return _mixing(concrete, variables, owners), bool(named)


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
        read = _variables_read(tensor, source)
        if (owner is None and read) or (owner is not None and read - {owner}):
            return ("mixes variables: one variable's output reads another's "
                    "gradient, state or value (a global norm, say)")
    return ""


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


def _variables_read(tensor: Any, source: dict[Any, int | None]) -> set[int]:
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
