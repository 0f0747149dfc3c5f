"""What one step does: the engine half of :class:`gradpipe.pipeline.Pipeline`.

``Pipeline.apply_gradients`` reduces the gradients across replicas and hands
them to :meth:`StepEngine._step`, traced either plainly or as one XLA
function (``[pipeline] jit_compile``). The step unscales, checks finiteness in
the same pass that yields the global norm, updates the loss scale, and runs the
chain and the assignments under one guard, so a skipped step changes nothing
(the user guide's "What one step does"). The plain path's in-place update is
in :mod:`gradpipe.in_place`. docs/performance.md measures each path.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from .errors import GradpipeError
from .in_place import can_apply_in_place, update_in_place
from .packed import AUTO_PACK_MIN_VARIABLES, packing_blocker
from .sequence import VariableSequence
from .step_ops import (
    all_finite,
    finite_and_record_norm,
    real_branch_marker,
    subtract_update,
    unscale,
)
from .summaries import write_step_summaries, write_update_summaries, writer_may_record
from .transform import _accelerator_visible, build_scope, record_squared_norm, squared_norm

# "auto" compiles where XLA pays (docs/performance.md, measured on 2 cores): XLA
# fuses the chain's element-wise passes, so clipping + Adam's functional update over
# 64 variables of 1-10k floats is 0.82x the plain step's time. A rule with an in-place
# kernel (sgd, adam) makes fewer passes on the plain path already: there XLA pays
# only on larger variables (sgd compiled 1.04x at 1-10k floats, 0.75x at 400k; adam's
# six fused kernels, in model.fit against Keras: compiled 1.02x and in place 0.95x to
# 1.00x at a mean of 12.8k elements, compiled 0.82x to 0.84x and in place 0.91x at
# 44.9k; 0.71x of the in-place step's time compiled at 400k).
# Compiling takes about 0.15 s per variable of a distinct shape.
AUTO_JIT_MAX_VARIABLES = 128
AUTO_JIT_MIN_MEAN_SIZE = 4_096
AUTO_JIT_MIN_MEAN_SIZE_IN_PLACE = 16_384


class StepEngine:
    """The step's methods; the state they use is created by ``Pipeline.__init__``."""

    _spec: Any
    _state: Any
    _transforms: list[Any]
    _context: Any
    _iterations: tf.Variable
    _skipped: tf.Variable
    _micro_steps: tf.Variable
    _pre_reduce: set[int]
    _guard: str
    _compiling: bool
    _power_of_two_scale: bool
    _scaler_takes_finite: bool
    loss_scaler: Any
    placement: Any
    strategy: Any
    loss_scale: Any

    def _should_compile(self, grads: list[Any]) -> bool:
        """``[pipeline] jit_compile``; ``"auto"`` compiles wherever that is known to be
        safe and to pay: one device, dense gradients, components that declare
        ``xla_compatible``, no summary writer, and few variables that are not small
        (XLA's gain is fewer passes over memory; its compile time grows with every
        distinct shape)."""
        mode = self._spec.options.jit_compile
        if mode != "auto":
            return bool(mode)
        components = [t.config for t in self._spec.transforms]
        if self._spec.loss_scale is not None:
            components.append(self._spec.loss_scale.config)
        return (all(getattr(c, "xla_compatible", False) for c in components)
                # packed: one vector, one small XLA function that fuses the chain
                and (self._state.packing is not None or self._xla_pays(self._state.variables))
                and self._fast_path_allowed(grads))

    def _xla_pays(self, variables: list[Any]) -> bool:
        """Few variables, not small: "auto" compiles them (one XLA loop per array)."""
        sizes = [v.shape.num_elements() for v in variables]
        # the plain path's last rule may be one in-place kernel already (sgd)
        in_place = bool(self._transforms) and self._transforms[-1].apply is not None
        min_mean = AUTO_JIT_MIN_MEAN_SIZE_IN_PLACE if in_place else AUTO_JIT_MIN_MEAN_SIZE
        return (len(sizes) <= AUTO_JIT_MAX_VARIABLES and None not in sizes
                and sum(sizes) >= min_mean * max(len(sizes), 1))

    def _should_pack(self, variables: list[Any]) -> bool:
        """``[pipeline] pack_variables``, decided once, when the state is created."""
        mode = self._spec.options.pack_variables
        if mode is False:
            return False
        blocker = packing_blocker(self, variables)
        if mode is True and blocker:
            raise GradpipeError(f"[pipeline] pack_variables = true, but {blocker}")
        return not blocker and (mode is True or (
            len(variables) >= AUTO_PACK_MIN_VARIABLES and not self._xla_pays(variables)))

    def _fast_path_allowed(self, grads: list[Any]) -> bool:
        """One device, dense gradients, no summary writer: where the step may be fused
        (XLA, in-place kernels). A strategy's replicas, sparse updates and summary
        ops keep the plain path."""
        return (not tf.distribute.has_strategy()
                and (self.placement is None or self.strategy.num_replicas_in_sync == 1)
                and not any(isinstance(g, tf.IndexedSlices) for g in grads)
                and not writer_may_record())

    def _update_guard(self) -> str:
        """How a step proves its updates finite before assigning them.

        ``"scalars"`` when every transform of the update ``preserves_finite``: the
        scalars they ``require_finite`` suffice, so the updates are never
        materialised and XLA fuses computation and assignment. ``"updates"``
        otherwise: every update element is checked. ``"none"`` with
        ``check_updates = false``.
        """
        if not self._spec.options.check_updates:
            return "none"
        chain = [t for i, t in enumerate(self._spec.transforms) if i not in self._pre_reduce]
        if all(getattr(t.config, "preserves_finite", False) for t in chain):
            return "scalars"
        return "updates"

    def _step(self, grads: list[Any], present: tf.Tensor | None = None) -> tf.Tensor:
        """One step; packed (``present``: where the packed gradients exist, if not
        everywhere), the update is left in ``pending`` (``_subtract_packed``)."""
        self._state.present = present
        try:
            return self._traced_step(grads)
        finally:
            self._state.present = None

    def _traced_step(self, grads: list[Any]) -> tf.Tensor:
        with build_scope(self._context):  # squared_norm/require_finite reach this step
            self._context.shared.clear()
            scale = self.loss_scale
            # Half-precision gradients are unscaled in float32: g/S can underflow in fp16.
            reciprocal = self._power_of_two_scale
            raw = grads

            def unscaled() -> list[Any]:
                # without a loss scaler there is nothing to divide by: no op per gradient
                return [None if g is None else tf.cast(g, dtype) if self.loss_scaler is None
                        else unscale(g, scale, dtype, reciprocal)
                        for g, dtype in zip(raw, self._state.compute_dtypes)]

            grads = unscaled()
            # the sum over the scaled gradients, divided by S**2, saves a pass; without
            # a loss scale the gradients are the unscaled ones already
            scaled = raw if reciprocal and self.loss_scaler is not None else None
            finite = finite_and_record_norm(grads, unscaled, scaled, scale)
            if self.loss_scaler is not None:
                _, should_apply = (self.loss_scaler.update(grads, finite=finite)
                                   if self._scaler_takes_finite
                                   else self.loss_scaler.update(grads))
                finite = tf.logical_and(finite, tf.cast(should_apply, tf.bool))
            # A skip is counted where it is decided (_reject; the predicated compiled
            # step adds cast(~ok)): a step with a conditional that applies writes no
            # counter but the iterations.
            k = self._spec.options.accumulation_steps
            if k > 1:
                applied = self._accumulate(grads, finite, k)
            elif not self._compiling:
                applied = self._update(grads, finite)
            elif self._guard != "updates":
                applied = self._decide_then_update(grads, unscaled, finite)
            else:
                applied = tf.cond(finite, lambda: self._update(grads), self._reject)
            with tf.control_dependencies([applied]):
                if not self._compiling:  # XLA cannot compile summary ops
                    write_step_summaries(self)
                return tf.identity(applied)

    def _decide_then_update(self, grads: list[Any], unscaled: Any,
                            finite: tf.Tensor) -> tf.Tensor:
        """The compiled step: decide whether it applies, then run the chain and assign.

        The chain is traced once for the scalars its transforms require finite
        (its tensor work is dead and pruned) and once to update. One conditional
        holds the chain and the assignments, so that nothing the size of the
        parameters crosses it, which XLA would copy (the gradients are unscaled
        again inside). A predicated chain needs no conditional at all
        (``_predicated_update``). The plain step traces the chain once instead
        (``_update``): there a conditional copies nothing, and each scalar traced
        twice would run twice.
        """
        ok = finite
        if self._guard == "scalars":
            ok = tf.logical_and(ok, self._required_finite(grads))
        if self._compiling and self._chain_is_predicated():
            return self._predicated_update(grads, unscaled, ok)

        def commit() -> tf.Tensor:
            sequence = self._unscale_again(grads, unscaled)
            fresh = sequence.grads
            return self._commit(fresh, *self._run_chain(fresh, skip=self._pre_reduce),
                                sequence=sequence)

        return tf.cond(ok, commit, self._reject)

    def _chain_is_predicated(self) -> bool:
        """Every transform with state routes it through ``select_applied``."""
        store = self._state
        return all(getattr(spec.config, "predicated", False) or not store.slots[key]
                   for i, (spec, (key, *_)) in enumerate(zip(self._spec.transforms,
                                                              store.layout_items()))
                   if i not in self._pre_reduce)

    def _predicated_update(self, grads: list[Any], unscaled: Any, ok: tf.Tensor) -> tf.Tensor:
        """The chain and the assignments without a conditional: the transforms keep
        their state where ``ok`` is false (``select_applied``) and the updates are
        dropped there. No conditional means no copy of its operands or results, and
        each slot is updated in one loop whose result the variable's loop reads:
        the bare update's speed (docs/performance.md).
        """
        shared = self._context.shared
        sequence = self._unscale_again(grads, unscaled)
        fresh = sequence.grads
        shared["applies"] = ok
        try:
            updates, new_states = self._run_chain(fresh, skip=self._pre_reduce)
        finally:
            del shared["applies"]
        ops = self._assign(new_states, updates, applies=ok, sequence=sequence)
        with tf.control_dependencies(ops):
            self._iterations.assign_add(tf.cast(ok, tf.int64))
            self._skipped.assign_add(tf.cast(~ok, tf.int64))
        with tf.control_dependencies(ops + [self._iterations.read_value()]):
            return tf.identity(ok)

    def _unscale_again(self, grads: list[Any], unscaled: Any) -> VariableSequence:
        """The gradients unscaled again for the chain (``.grads``), with the sum of
        squares known for ``grads`` recorded for them too. Compiled on a CPU, they
        are gated so that XLA updates one large variable after another
        (``gradpipe.sequence``)."""
        enabled = (self._compiling and self._state.packing is None
                   and not _accelerator_visible())
        sequence = VariableSequence(unscaled(), self._state.variables, enabled)
        record_squared_norm(sequence.grads, squared_norm(grads))
        return sequence

    def _required_finite(self, grads: list[Any]) -> tf.Tensor:
        """Trace the chain for the scalars its transforms ``require_finite``."""
        return all_finite(self._run_chain_for_required(grads)[2])

    def _run_chain_for_required(
            self, grads: list[Any]) -> tuple[list[Any], dict[int, Any], list[Any]]:
        """The chain's updates and new states, and the scalars it ``require_finite``."""
        shared = self._context.shared
        shared.pop("required_finite", None)
        updates, new_states = self._run_chain(grads, skip=self._pre_reduce)
        return updates, new_states, shared.pop("required_finite", [])

    def _accumulate(self, grads: list[Any], finite: tf.Tensor, k: int) -> tf.Tensor:
        store = self._state

        def add() -> tf.Tensor:
            micro = self._micro_steps.assign_add(1)
            store.accumulate(grads)
            return tf.equal(micro % k, 0)

        complete = tf.cond(finite, add, self._reject)

        def apply() -> tf.Tensor:
            mean = store.accumulated(k, like=grads)
            applied = self._update(mean)
            with tf.control_dependencies([applied]):
                store.reset_accumulators()
            return tf.identity(applied)

        return tf.cond(complete, apply, lambda: tf.constant(False))

    def _run_chain(self, grads: list[Any], only: set[int] | None = None,
                   skip: set[int] | None = None) -> tuple[list[Any], dict[int, Any]]:
        """Run the transforms in file order; return the updates and the new states of
        those that ran, by index. The others' state is not read: a read is a stateful
        op, which TF never prunes, so each would cost every step."""
        store = self._state
        variables = store.variables
        updates = list(grads)
        new_states = {}
        for i, (spec, transform) in enumerate(zip(self._spec.transforms,
                                                  self._transforms)):
            if (only is not None and i not in only) or (skip and i in skip):
                continue
            state = store.read(i)
            mask = store.masks[i]
            masked = [u if m else None for u, m in zip(updates, mask)]
            result, state = transform.update(masked, state, variables)
            if len(result) != len(variables):
                raise GradpipeError(
                    f"transform {spec.name!r} at {spec.path} returned {len(result)} "
                    f"updates for {len(variables)} variables")
            updates = [r if m else u for r, u, m in zip(result, updates, mask)]
            new_states[i] = state
        return updates, new_states

    def _update(self, grads: list[Any], finite: tf.Tensor | None = None) -> tf.Tensor:
        """Run the chain and assign, unless a NaN/Inf would reach the weights.

        A NaN/Inf born inside the chain (0/0 in a trust ratio, an overflow) is skipped
        like a non-finite gradient. Where every transform ``preserves_finite``, the
        scalars they ``require_finite`` prove the updates finite; otherwise every
        update element is checked. Either check comes before the first assignment.
        The plain step passes ``finite`` (whether the gradients are): the chain is
        then traced once, and one conditional, which only writes, decides on both.
        """
        if can_apply_in_place(self, grads):
            return update_in_place(self, grads, finite)
        updates, new_states, required = self._run_chain_for_required(grads)
        checks = {"none": [], "scalars": required, "updates": [
            u for u, frozen in zip(updates, self._state.frozen) if not frozen]}[self._guard]
        checks = checks if finite is None else [finite, *checks]
        if not checks:
            return self._commit(grads, updates, new_states)
        return tf.cond(all_finite(checks), lambda: self._commit(grads, updates, new_states),
                       self._reject)

    def _commit(self, grads: list[Any], updates: list[Any], new_states: dict[int, Any],
                sequence: VariableSequence | None = None) -> tf.Tensor:
        """Assign the new state and subtract the updates, once all of them exist.

        Atomic: no assignment runs before every new value is computed, so an
        error inside the chain (a failing assertion, running out of memory)
        leaves every variable, slot and counter as it was. (XLA allocates its
        buffers before it runs and ignores control dependencies.)
        """
        computed = [] if self._compiling else [
            t for t in tf.nest.flatten([updates, new_states], expand_composites=True)
            if t is not None]
        # One barrier: every op under control_dependencies(computed) would get an
        # edge from each value, quadratic in the variables (minutes to trace 2,000).
        with tf.control_dependencies([tf.group(*computed)] if computed else []):
            ops = self._assign(new_states, updates, sequence=sequence)
        with tf.control_dependencies(ops):
            self._iterations.assign_add(1)
        with tf.control_dependencies(ops + [self._iterations.read_value()]):
            if not self._compiling:
                write_update_summaries(self, grads, updates)
                return tf.constant(True)
            return real_branch_marker(self._iterations)

    def _assign(self, new_states: dict[int, Any], updates: list[Any],
                applies: tf.Tensor | None = None,
                sequence: VariableSequence | None = None) -> list[Any]:
        """Write the new states, subtract the updates (dropped where ``applies`` is
        false), then refresh half-precision variables from their masters. With a
        ``sequence``, each variable's new value then gates the next one's gradient."""
        store = self._state
        ops = store.write(new_states)
        if store.packing is not None:  # _subtract_packed applies it to the variables
            update = updates[0]
            if store.present is not None:
                update = tf.where(store.present, update, tf.zeros([], update.dtype))
            return ops + [store.pending.assign(update)]
        for i, (var, update, frozen) in enumerate(zip(store.variables, updates, store.frozen)):
            if update is not None and not frozen:
                if applies is not None:
                    # A scalar zero: with zeros_like XLA writes the variable to a new
                    # buffer (measured: peak memory 320 against 95 MiB at 20M params).
                    update = tf.where(applies, update, tf.zeros([], update.dtype))
                ops.append(subtract_update(var, update))
                if sequence is not None:
                    sequence.written(i, var, ops[-1])
        if sequence is not None:
            sequence.link()
        with tf.control_dependencies(ops):
            return ops + store.refresh_from_masters(updates)

    def _subtract_packed(self, applied: tf.Tensor) -> tf.Tensor:
        """Subtract each variable's slice of the packed update, if the step applied.

        Every slice exists before the first variable is written, so the variables
        are updated together or not at all, as on every other path.
        """
        store = self._state

        def subtract() -> tf.Tensor:
            deltas = store.packing.unpack(store.pending.read_value())
            with tf.control_dependencies([tf.group(*deltas)]):
                ops = [var.assign_sub(d) for var, d in zip(store.parameters, deltas)]
            with tf.control_dependencies(ops):
                return tf.constant(True)

        return tf.cond(applied, subtract, lambda: tf.constant(False))

    def _reject(self) -> tf.Tensor:
        """Count a skipped step (or micro-step): the one counter a skip writes."""
        self._skipped.assign_add(1)
        return tf.constant(False)

