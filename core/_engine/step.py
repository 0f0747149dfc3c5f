"""What one step does, along the paths the plan chose.

``Step.apply`` reduces the gradients across replicas and hands them to the traced
step: plain, or compiled (``plan.compile``: one XLA function, or one per variable,
``gradpipe._engine.per_variable``). The step unscales, checks finiteness in the
same pass that yields the global norm, updates the loss scale, and runs the chain
and the assignments under one guard, so a skipped step changes nothing.

The guard (:mod:`gradpipe._engine.guard`) knows every transform's outputs finite
before the first write: proved, bounded or checked. Compiled, the step has no
conditional but the rare recheck where a bound fails: the chain runs, the engine
keeps each transform's state where the step is skipped and drops the updates
there, so XLA fuses computation and assignment and copies nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ..errors import GradpipeError
from ..names import scope_name
from ..spec import PipelineSpec
from ..tensors import all_finite
from ..transform import (
    APPLIES,
    KEPT,
    BuildContext,
    build_scope,
    in_xla_function,
    record_squared_norm,
    squared_norm,
)
from .accumulation import accumulate_then_update
from .guard import Guard
from .plan import Plan, fusion_blocker
from .proofs import Prove
from .rows import SparseInputs
from .sequence import VariableSequence
from .state import Counters, StateStore
from .step_ops import finite_and_record_norm, real_branch_marker, unscale
from .summaries import rates_of_this_update, write_step_summaries, write_update_summaries
from .writes import assign, kept_where_skipped, subtract_packed


class Step:
    """The traced step of one built pipeline."""

    def __init__(self, *, spec: PipelineSpec, transforms: list[Any],
                 kernel: Callable[..., list[Any]] | None, proofs: list[Prove | None],
                 state: StateStore, plan: Plan, counters: Counters, loss_scaler: Any,
                 context: BuildContext, replicas: int, reduce: Callable[[list[Any]], Any],
                 pipeline: Any, scheduled: list[tuple[str, Any]]) -> None:
        self.spec, self.state, self.plan, self.counters = spec, state, plan, counters
        self.transforms, self.kernel = transforms, kernel
        self.guard = Guard(proofs, plan.bounded, plan.ranged, plan.valued, context)
        self.loss_scaler, self.context = loss_scaler, context
        # the public facade, for the values summaries report (rate, scale, counters)
        self.pipeline, self.scheduled = pipeline, scheduled
        self._replicas, self._reduce = replicas, reduce
        self._pre_reduce = set(plan.clip_before_reduce)
        self._guarded = spec.options.check_updates
        # ids of the state a transform kept itself (keep_where_skipped), while tracing
        self.kept_by_transforms: set[int] = set()
        self._sparse = SparseInputs(self._chain_once, state.compute_dtypes, replicas)
        self._takes_finite = loss_scaler is not None and "finite" in \
            inspect.signature(loss_scaler.update).parameters
        # No scaler: the scale is 1, a power of two (the norm is then also summed by the
        # fast L2Loss kernel outside XLA, and unscaling multiplies by exactly 1).
        self._power_of_two = loss_scaler is None or bool(
            getattr(loss_scaler, "power_of_two", False))
        self.per_variable: Any = None  # per_variable.PerVariable, where the plan says so
        # One XLA function for the whole update: fusion across every variable.
        self.compiled = tf.function(lambda grads, present: self._step(grads, present, True),
                                    jit_compile=True, autograph=False)

    # -- entry -------------------------------------------------------------

    def apply(self, pairs: list[tuple[Any, Any]]) -> tf.Tensor:
        lock = self.state.lock  # on parameter servers: one step at a time
        return lock(lambda: self._apply(pairs)) if lock else self._apply(pairs)

    def _apply(self, pairs: list[tuple[Any, Any]]) -> tf.Tensor:
        grads, present = self._inputs(pairs)
        blocked = fusion_blocker(grads, self._replicas)
        # per variable: the step calls each variable's XLA function (``_update``)
        compiling = self.plan.compile.on and not self._per_variable_usable(grads) and (
            self.spec.options.jit_compile is True or not blocked)
        applied = (self.compiled(grads, present) if compiling
                   else self._step(grads, present, False))
        return applied if self.state.packing is None else subtract_packed(self.state, applied)

    def _inputs(self, pairs: list[tuple[Any, Any]]) -> tuple[list[Any], Any]:
        """The gradients as the step takes them: aligned with the variables, clipped
        per replica where the plan says so, reduced once, packed where it packs (and
        where the packed gradients exist, ``None`` if everywhere)."""
        grads = self.state.align(pairs)
        if all(g is None for g in grads):
            raise GradpipeError("no gradients provided for any variable")
        if self._pre_reduce:  # clip_before_reduce: clip each replica's gradients
            grads = self.run_chain(grads, only=self._pre_reduce)[0]
        grads = self._reduce(grads)  # once, batched
        packing = self.state.packing
        if packing is None:
            return self._sparse(grads), None
        return [packing.pack(grads)], packing.present(grads)

    def _chain_once(self, given: list[Any]) -> tuple[list[Any], dict[int, Any]]:
        """The chain's updates and new states, traced on its own (``SparseInputs``)."""
        try:
            with build_scope(self.context):
                return self.run_chain(given, skip=self._pre_reduce)[:2]
        finally:
            self.context.shared.clear()

    def _per_variable_usable(self, grads: list[Any], compiling: bool = False) -> bool:
        """Whether the step calls the per-variable functions (``_update``): planned, the
        whole step not compiled, and nothing known only now keeps other paths."""
        return bool(self.per_variable is not None and self.plan.compile.on and not compiling
                    and not fusion_blocker(grads, self._replicas) and not in_xla_function())

    def path(self, pairs: list[tuple[Any, Any]]) -> str:
        """The path a step with these gradients takes now, and why."""
        blocked = fusion_blocker(self._inputs(pairs)[0], self._replicas)
        if self.plan.compile.on and (self.spec.options.jit_compile is True or not blocked):
            return "compiled"
        if self.plan.in_place.on and not blocked:
            return "in place"
        why = (f"not compiled: {self.plan.compile.reason}" if not self.plan.compile.on
               else f"{blocked} keeps the plain path")
        return f"plain ({why})"

    def compiled_hlo(self, pairs: list[tuple[Any, Any]], stage: str) -> str:
        return self.compiled.experimental_get_compiler_ir(*self._inputs(pairs))(stage=stage)

    def _step(self, grads: list[Any], present: tf.Tensor | None, compiling: bool
              ) -> tf.Tensor:
        """Packed (``present``: where the packed gradients exist, if not everywhere),
        the update is left in ``pending`` (``_subtract_packed``)."""
        self.state.present = present
        try:
            with build_scope(self.context):  # squared_norm reaches this step
                self.context.shared.clear()
                return self._traced(grads, compiling)
        finally:
            self.state.present = None

    def _traced(self, grads: list[Any], compiling: bool) -> tf.Tensor:
        scale = self.pipeline.loss_scale
        # Half-precision gradients are unscaled in float32: g/S can underflow in fp16.
        reciprocal, raw = self._power_of_two, grads

        def unscaled() -> list[Any]:
            # without a loss scaler there is nothing to divide by: no op per gradient
            return [None if g is None else tf.cast(g, dtype) if self.loss_scaler is None
                    else unscale(g, scale, dtype, reciprocal)
                    for g, dtype in zip(raw, self.state.compute_dtypes)]

        grads = unscaled()
        # the sum over the scaled gradients, divided by S**2, saves a pass; without
        # a loss scale the gradients are the unscaled ones already
        scaled = raw if reciprocal and self.loss_scaler is not None else None
        # per variable, unscaled: an overflowing sum is checked in the verdict's branch
        of_sum = (self.loss_scaler is None and self.spec.options.accumulation_steps == 1
                  and self._per_variable_usable(grads, compiling))
        finite = finite_and_record_norm(grads, unscaled, scaled, scale, of_sum)
        if self.loss_scaler is not None:
            _, should_apply = (self.loss_scaler.update(grads, finite=finite)
                               if self._takes_finite else self.loss_scaler.update(grads))
            finite = tf.logical_and(finite, tf.cast(should_apply, tf.bool))
        # A skip is counted where it is decided (_reject; the compiled step adds
        # cast(~ok)): a step with a conditional that applies writes no counter but
        # the iterations.
        k = self.spec.options.accumulation_steps
        if k > 1:
            # finite micro-steps can still sum past the float32 maximum; the same
            # pass yields the norm a clip reuses
            applied = accumulate_then_update(
                self.state.accumulators, self.counters.micro_steps, grads, finite, k,
                lambda mean: self._update(mean, finite_and_record_norm(
                    mean, lambda: mean, None, scale=None), compiling), self._reject)
        elif not compiling:
            applied = self._update(grads, finite, compiling, of_sum)
        else:
            applied = self._update_predicated(grads, unscaled, finite)
        with tf.control_dependencies([applied]):
            if not compiling:  # XLA cannot compile summary ops
                write_step_summaries(self)
            return tf.identity(applied)

    # -- the chain ---------------------------------------------------------

    def run_chain(self, grads: list[Any], only: set[int] | None = None,
                  skip: set[int] | None = None, applies: tf.Tensor | None = None,
                  guard: bool = False, bounds: bool = True, store: Any = None
                  ) -> tuple[list[Any], dict[int, Any], list[Any]]:
        """Run the transforms in file order: the updates, the new states of those that
        ran (by index; kept where ``applies`` is false) and, with ``guard``, the
        scalars under which every output is finite (``Guard``; ``bounds``: bounded
        where the plan says so). Others' state is not read: a read is a stateful op,
        which TF never prunes, so each would cost every step. ``store``: the state
        store, or one variable's view of it."""
        store = self.state if store is None else store
        variables = store.variables
        self.guard.seen = []
        updates, new_states, required = list(grads), {}, []
        for i, (spec, transform) in enumerate(zip(self.spec.transforms, self.transforms)):
            if (only is not None and i not in only) or (skip and i in skip):
                continue
            mask = store.masks[i]
            masked = [u if m else None for u, m in zip(updates, mask)]
            old = store.read(i, sparse={j for j, u in enumerate(masked)
                                        if isinstance(u, tf.IndexedSlices)})
            shared = self.context.shared
            if applies is not None:
                shared[APPLIES], shared[KEPT] = applies, {}
            with tf.name_scope(scope_name(i, spec.name)):
                result, state = transform.update(masked, old, variables)
                kept: dict[int, Any] = shared.pop(KEPT, {})
                shared.pop(APPLIES, None)
                if len(result) != len(variables):
                    raise GradpipeError(
                        f"transform {spec.name!r} at {spec.path} returned {len(result)} "
                        f"updates for {len(variables)} variables")
                if guard and self._guarded:
                    required += self.guard.outputs_finite(i, masked, old, result, state, bounds,
                                                          variables)
                if applies is not None:  # a skipped step keeps the state as it was
                    result, state = kept_where_skipped(result, state, old, applies, kept,
                                                       self.kept_by_transforms)
            updates = [r if m else u for r, u, m in zip(result, updates, mask)]
            new_states[i] = state
        return updates, new_states, required

    def rechecked(self, required: list[Any], inputs: Callable[[], list[Any]],
                  skip: set[int], last: Callable[[list[Any]], list[Any]] | None = None,
                  outputs_kept: bool = False) -> list[Any]:
        """``required`` as one scalar; where a bound fails, the chain (and ``last``) is
        checked without bounds from ``inputs()``, or from the outputs it keeps."""
        kept = self.guard.seen if outputs_kept else None  # the chain just traced

        def recheck() -> list[Any]:
            given, _, again = self.run_chain(inputs(), skip=skip, guard=True, bounds=False)
            return again + (last(given) if last else [])

        return [self.guard.chain_finite(required, recheck, kept)] if required else []

    # -- plain path --------------------------------------------------------

    def _update(self, grads: list[Any], finite: tf.Tensor | None, compiling: bool,
                of_sum: bool = False) -> tf.Tensor:
        """Run the chain and assign, unless a NaN/Inf would reach the weights: one
        conditional, which only writes, decides on the gradients' finite flag and
        the chain's scalars, before the first assignment."""
        if self._per_variable_usable(grads, compiling):
            return self.per_variable.update(grads, finite, self.counters, of_sum)
        blocked = compiling or fusion_blocker(grads, self._replicas)
        if self.plan.in_place.on and not blocked:
            return self._update_in_place(grads, finite)
        updates, new_states, required = self.run_chain(grads, skip=self._pre_reduce, guard=True)
        required = self.rechecked(required, lambda: grads, self._pre_reduce, outputs_kept=True)
        checks = required if finite is None else [finite, *required]

        def commit() -> tf.Tensor:
            return self._commit(grads, updates, new_states, compiling)

        return tf.cond(all_finite(checks), commit, self._reject) if checks else commit()

    def _update_in_place(self, grads: list[Any], finite: tf.Tensor | None) -> tf.Tensor:
        """The chain up to its last transform, then that transform's fused kernel, under
        one conditional that only writes. The last transform's maths is proved, so its
        outputs need not exist before the kernel writes them."""
        last = len(self.transforms) - 1
        store = self.state
        skip = self._pre_reduce | {last}
        inputs, new_states, required = self.run_chain(grads, skip=skip, guard=True)
        checks = [] if finite is None else [finite]
        if self._guarded:  # the plan takes this path only where the last is proved
            def proved(given: list[Any]) -> list[Any]:
                return self.guard.proved(last, given, lambda: store.read(last), store.variables)

            checks += self.rechecked(required + proved(inputs), lambda: grads, skip, proved)
        kernel = self.kernel
        assert kernel is not None

        def commit() -> tf.Tensor:
            ops = store.write(new_states)
            with tf.control_dependencies(ops):
                ops = ops + list(kernel(inputs, store.slot_variables(last), store.variables))
            with tf.control_dependencies(ops):
                self.counters.iterations.assign_add(1)
            with tf.control_dependencies([self.counters.iterations.read_value()]):
                return tf.constant(True)

        return tf.cond(all_finite(checks), commit, self._reject) if checks else commit()

    def _commit(self, grads: list[Any], updates: list[Any], new_states: dict[int, Any],
                compiling: bool) -> tf.Tensor:
        """Assign the new state and subtract the updates, once all of them exist.

        Atomic: no assignment runs before every new value is computed, so an
        error inside the chain (a failing assertion, running out of memory)
        leaves every variable, slot and counter as it was. (XLA allocates its
        buffers before it runs and ignores control dependencies.)
        """
        computed = [] if compiling else [
            t for t in tf.nest.flatten([updates, new_states], expand_composites=True)
            if t is not None]
        # One barrier: every op under control_dependencies(computed) would get an
        # edge from each value, quadratic in the variables (minutes to trace 2,000).
        rates = [] if compiling else rates_of_this_update(self)  # before the count moves
        with tf.control_dependencies([tf.group(*computed)] if computed else []):
            ops = assign(self.state, new_states, updates)
        with tf.control_dependencies(ops):
            self.counters.iterations.assign_add(1)
        with tf.control_dependencies(ops + [self.counters.iterations.read_value()]):
            if not compiling:
                write_update_summaries(self, grads, updates, rates)
                return tf.constant(True)
            return real_branch_marker(self.counters.iterations)

    # -- compiled path -----------------------------------------------------

    def _update_predicated(self, grads: list[Any], unscaled: Any, finite: tf.Tensor
                           ) -> tf.Tensor:
        """The compiled step, with no conditional: the chain is traced once for the
        scalars its outputs are finite under (work that only a proof used is pruned)
        and once to update, keeping the state and dropping the updates where the step
        is skipped. No conditional means no copy of its operands or results, and each
        slot is updated in one loop whose result the variable's loop reads."""
        ok = finite
        if self._guarded:
            required = self.run_chain(grads, skip=self._pre_reduce, guard=True)[2]
            # rechecked from the gradients unscaled in the branch: nothing the size of
            # the parameters is made for a branch that rarely runs
            ok = tf.logical_and(ok, all_finite(self.rechecked(required, unscaled,
                                                                self._pre_reduce)))
        # The gradients unscaled again, so that nothing the size of the parameters is
        # shared by the decision and the writes; compiled on a CPU, gated so that XLA
        # updates one large variable after another (gradpipe._engine.sequence).
        sequence = VariableSequence(unscaled(), self.state.variables, self.plan.sequence.on)
        record_squared_norm(sequence.grads, squared_norm(grads))
        self.kept_by_transforms = set()
        updates, new_states, _ = self.run_chain(sequence.grads, skip=self._pre_reduce, applies=ok)
        ops = assign(self.state, new_states, updates, applies=ok, sequence=sequence,
                     kept=self.kept_by_transforms)
        with tf.control_dependencies(ops):
            self.counters.iterations.assign_add(tf.cast(ok, tf.int64))
            self.counters.skipped.assign_add(tf.cast(~ok, tf.int64))
        with tf.control_dependencies(ops + [self.counters.iterations.read_value()]):
            return tf.identity(ok)

    def _reject(self) -> tf.Tensor:
        """Count a skipped step (or micro-step): the one counter a skip writes."""
        self.counters.skipped.assign_add(1)
        return tf.constant(False)

