"""The Pipeline: a ``tf.Module`` that owns all state and applies one step.

One call of :meth:`Pipeline.apply_gradients` does, in order (DESIGN §5):

1. reduce gradients across replicas once, through the placement;
2. unscale by the loss scale and decide finiteness on the reduced gradients;
   the loss scaler updates its scale;
3. accumulate micro-batches when ``accumulation_steps > 1``;
4. if the step is finite (and completes an accumulation window), run the
   transforms in file order and subtract the result from the variables.

A skipped step changes no variable, no transform state and not
``iterations``. Every new value is computed before the first assignment, so a
failure leaves all variables as they were.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

from .build import build_component
from .errors import GradpipeError
from .fields import ScheduleRef
from .registry import Registry, get_registry
from .spec import ComponentSpec, PipelineSpec
from .state import StateStore, layout_difference
from .summaries import (
    scheduled_hyperparameters,
    write_step_summaries,
    write_update_summaries,
)
from .transform import (
    BuildContext,
    build_scope,
    record_squared_norm,
    squared_norm,
    sum_of_squares,
)

# "auto" compiles steps over at most this many variables: XLA's compile time grows
# with the number of variables (minutes at 2,000), its gain shrinks as they get small.
AUTO_JIT_MAX_VARIABLES = 256


class Pipeline(tf.Module):
    """A built gradient pipeline. Create it with ``gradpipe.load``/``gradpipe.build``."""

    def __init__(self, spec: PipelineSpec, registry: Registry | None = None) -> None:
        super().__init__(name="gradpipe")
        self._spec = spec
        registry = registry or get_registry()
        self._registry = registry
        self.placement = build_component(spec.placement, registry) if spec.placement \
            else None
        self._built_schedules: dict[str, Any] = {}
        # Every state variable keeps aggregation NONE: each replica updates its own
        # copy from the *reduced* gradients, so all copies compute the same value,
        # and no merge_call is needed inside the step's tf.cond (which
        # ONLY_FIRST_REPLICA would require, and which fails in a replica context).
        with self.strategy.scope():
            self._iterations = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="iterations")
            self._skipped = tf.Variable(0, dtype=tf.int64, trainable=False,
                                        name="skipped_steps")
            self._micro_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                            name="micro_steps")
            # The state layout (names and shapes), saved with every checkpoint so a
            # restore into a different pipeline fails naming what differs. Python
            # state, not a string variable: MultiWorkerMirrored cannot broadcast those.
            self._layout = _LayoutState()
            self._context = BuildContext(step=self._iterations.read_value,
                                         resolve_schedule=self._resolve_schedule)
            with build_scope(self._context):
                self.loss_scaler = (build_component(spec.loss_scale, registry)
                                    if spec.loss_scale else None)
                self.schedules = {name: self._resolve_schedule(ScheduleRef(name))
                                  for name in spec.schedules}
                self._transforms = [build_component(t, registry) for t in spec.transforms]
                self.criteria = [build_component(c, registry) for c in spec.convergence]
                self._learning_rate = _first_learning_rate(spec)
                self._scheduled = scheduled_hyperparameters(spec)
        self._state = StateStore(self, spec)
        self._pre_reduce = self._clipping_before_reduce()
        self._guard = self._update_guard()
        self._scaler_takes_finite = self.loss_scaler is not None and "finite" in \
            inspect.signature(self.loss_scaler.update).parameters
        self._power_of_two_scale = bool(getattr(self.loss_scaler, "power_of_two", False))
        # One XLA function for the whole update: fusion across every variable.
        self._compiled_step = tf.function(self._step, jit_compile=True, autograph=False)
        self._compiling = False

    # -- public API --------------------------------------------------------

    @property
    def spec(self) -> PipelineSpec:
        return self._spec

    @property
    def strategy(self) -> tf.distribute.Strategy:
        return self.placement.strategy if self.placement else tf.distribute.get_strategy()

    @property
    def iterations(self) -> tf.Variable:
        """Number of applied updates (skipped and accumulating calls excluded)."""
        return self._iterations

    @property
    def skipped_steps(self) -> tf.Variable:
        """Number of calls skipped for non-finite gradients."""
        return self._skipped

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current loss scale (1.0 without a loss scaler)."""
        if self.loss_scaler is None:
            return tf.constant(1.0, tf.float32)
        return tf.convert_to_tensor(self.loss_scaler())

    @property
    def learning_rate(self) -> tf.Tensor:
        """The current learning rate of the first update rule (``nan`` if none has one)."""
        if self._learning_rate is None:
            return tf.constant(float("nan"), tf.float32)
        return self._learning_rate()

    def minimize(self, loss_fn: Any, var_list: Sequence[Any], max_steps: int,
                 trace_fn: Any = None, *, return_full_length_trace: bool = True,
                 batch_convergence_reduce_fn: Any = None, jit_compile: bool = False) -> Any:
        """Run up to ``max_steps`` updates in one ``tf.function`` loop (``tfp.math.minimize``).

        Stops when any ``[[convergence]]`` criterion converges. Returns a
        :class:`gradpipe.convergence.MinimizeResult`.
        """
        from .convergence import minimize

        return minimize(self, loss_fn, var_list, max_steps, trace_fn=trace_fn,
                        return_full_length_trace=return_full_length_trace,
                        batch_convergence_reduce_fn=batch_convergence_reduce_fn,
                        jit_compile=jit_compile)

    def named_variables(self) -> dict[str, tf.Variable]:
        """Every state variable under a stable name (the checkpoint/.keras layout)."""
        named = {"iterations": self._iterations, "skipped_steps": self._skipped,
                 "micro_steps": self._micro_steps}
        if self.loss_scaler is not None:
            for var in self.loss_scaler.variables:
                named[f"loss_scale/{var.name.split(':')[0].split('/')[-1]}"] = var
        store = self._state
        for key, slots in store.slots.items():
            named.update({f"slots/{key}/{name}": var for name, var in slots.items()})
        named.update({f"accumulators/{p}": v for p, v in store.accumulators.items()})
        named.update({f"masters/{p}": v for p, v in store.masters.items()})
        return named

    def layout(self) -> dict[str, list[int]]:
        """Name -> shape of every state variable; two pipelines with equal layouts
        can restore each other's state."""
        return {name: list(var.shape) for name, var in sorted(self.named_variables().items())}

    def keras_optimizer(self, name: str = "gradpipe") -> Any:
        """A ``keras.optimizers.Optimizer`` that applies this pipeline in compile()/fit()."""
        from .keras_adapter import pipeline_optimizer

        return pipeline_optimizer(self, name=name)

    def transform_state(self, which: int | str) -> dict[str, tf.Variable]:
        """The state variables of one transform, by index or kind, keyed by name.

        ``pipe.transform_state("clippy_adagrad")["clipping_factor/dense_kernel"]``
        """
        for i, spec in enumerate(self._spec.transforms):
            if which in (i, spec.name):
                return dict(self._state.slots.get(f"{i}_{spec.name}", {}))
        raise GradpipeError(f"no transform {which!r} in this pipeline; it has: "
                            f"{', '.join(t.name for t in self._spec.transforms)}")

    def to_toml(self) -> str:
        """The resolved pipeline, defaults filled in; it loads back identically."""
        return self._spec.to_toml()

    def scale_loss(self, loss: Any) -> tf.Tensor:
        """Multiply ``loss`` by the loss scale (and 1/N for ``reduction = mean``)."""
        loss = tf.convert_to_tensor(loss)
        factor = self.loss_scale
        divisor = self.placement.loss_divisor if self.placement else 1
        if divisor != 1:
            factor = factor / float(divisor)
        return loss * tf.cast(factor, loss.dtype)

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """Create all state for ``variables`` now (also done on first use)."""
        if self.placement is not None and self.strategy.num_replicas_in_sync > 1:
            self.placement.check_can_update_mirrored()
            if self._spec.options.jit_compile is True:
                from .errors import PlacementError

                raise PlacementError(
                    "[pipeline] jit_compile = true compiles the update for one device; "
                    f"this placement has {self.strategy.num_replicas_in_sync} replicas. "
                    "Compile the whole replica step instead, or turn jit_compile off")
        if self._state.built:
            return
        self._state.build(list(variables))
        self._layout.value = json.dumps(self.layout(), sort_keys=True)

    def restore(self, path: str, key: str = "pipeline") -> None:
        """Restore this pipeline's state from a ``tf.train.Checkpoint`` written with
        ``tf.train.Checkpoint(**{key: pipe}, ...)``; a different layout is an error
        naming what differs, never a silent fresh start."""
        if not self._state.built:
            raise GradpipeError("build the pipeline (pipe.build(variables)) before "
                                "restoring it, so its state exists to receive the values")
        try:
            saved = tf.train.load_variable(path, f"{key}/_layout/.ATTRIBUTES/py_state")
        except (tf.errors.NotFoundError, ValueError) as exc:
            raise GradpipeError(f"{path} holds no gradpipe pipeline under {key!r}: "
                                f"{exc}") from None
        saved_layout = json.loads(saved.decode() if isinstance(saved, bytes) else saved)
        difference = layout_difference(self.layout(), saved_layout)
        if difference:
            raise GradpipeError(f"checkpoint {path} was written by a different pipeline: "
                                f"{difference}")
        tf.train.Checkpoint(**{key: self}).restore(path).expect_partial() \
            .assert_existing_objects_matched()

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> tf.Tensor:
        """Apply gradients of the scaled loss; return whether the step was applied."""
        pairs = list(grads_and_vars)
        if not pairs:
            raise GradpipeError("apply_gradients() got no (gradient, variable) pairs")
        variables = [v for _, v in pairs]
        if not self._state.built:
            with tf.init_scope():  # state is created eagerly, never inside a trace
                self.build(variables)
        grads = self._state.align(pairs)
        if all(g is None for g in grads):
            raise GradpipeError("no gradients provided for any variable")
        if self.placement is not None:
            if self._pre_reduce:  # clip_before_reduce: clip each replica's gradients
                grads = self._run_chain(grads, only=self._pre_reduce)[0]
            grads = self.placement.reduce(grads)  # once, batched
        self._compiling = self._should_compile(grads)
        # Outside XLA even when compiling: TF's fused L2Loss kernel reads each gradient
        # once, XLA's reduction on CPU reads and writes it three times over.
        scaled_total = (sum_of_squares(grads) if self._power_of_two_scale and not any(
            isinstance(g, tf.IndexedSlices) for g in grads) else None)
        if self._compiling:
            return self._compiled_step(grads, scaled_total)
        return self._step(grads, scaled_total)

    def _should_compile(self, grads: list[Any]) -> bool:
        """``[pipeline] jit_compile``; ``"auto"`` compiles wherever that is known to be
        safe and to pay: one device, dense gradients, components that declare
        ``xla_compatible``, no summary writer, and few enough variables to compile
        quickly (see docs/performance.md)."""
        mode = self._spec.options.jit_compile
        if mode != "auto":
            return bool(mode)
        components = [t.config for t in self._spec.transforms]
        if self._spec.loss_scale is not None:
            components.append(self._spec.loss_scale.config)
        recording = tf.get_static_value(tf.summary.should_record_summaries())
        return (all(getattr(c, "xla_compatible", False) for c in components)
                and not tf.distribute.has_strategy()
                and (self.placement is None or self.strategy.num_replicas_in_sync == 1)
                and not any(isinstance(g, tf.IndexedSlices) for g in grads)
                and len(grads) <= AUTO_JIT_MAX_VARIABLES
                and recording is not None and not recording)

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

    def _clipping_before_reduce(self) -> set[int]:
        """Leading clipping transforms to run per replica (``clip_before_reduce``)."""
        if not getattr(self.placement, "clip_before_reduce", False):
            return set()
        leading = set()
        for i, t in enumerate(self._spec.transforms):
            if not getattr(type(t.config), "gradient_clipping", False):
                break
            leading.add(i)
        return leading

    # -- the step ----------------------------------------------------------

    def _step(self, grads: list[Any], scaled_total: Any) -> tf.Tensor:
        """``scaled_total``: the sum of squares of the scaled gradients when the loss
        scale is a power of two (see ``_finite_and_record_norm``), else ``None``."""
        with build_scope(self._context):  # squared_norm/require_finite reach this step
            self._context.shared.clear()
            scale = self.loss_scale
            # Half-precision gradients are unscaled in float32: g/S can underflow in fp16.
            reciprocal = self._power_of_two_scale
            raw = grads

            def unscaled() -> list[Any]:
                return [None if g is None else _unscale(g, scale, dtype, reciprocal)
                        for g, dtype in zip(raw, self._state.compute_dtypes)]

            grads = unscaled()
            finite = _finite_and_record_norm(grads, unscaled, scaled_total, scale)
            if self.loss_scaler is not None:
                _, should_apply = (self.loss_scaler.update(grads, finite=finite)
                                   if self._scaler_takes_finite
                                   else self.loss_scaler.update(grads))
                finite = tf.logical_and(finite, tf.cast(should_apply, tf.bool))
            self._skipped.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
            k = self._spec.options.accumulation_steps
            if k > 1:
                applied = self._accumulate(grads, finite, k)
            elif self._compiling and self._guard != "updates":
                applied = self._fused_update(grads, unscaled, finite)
            else:
                applied = tf.cond(finite, lambda: self._update(grads),
                                  lambda: tf.constant(False))
            with tf.control_dependencies([applied]):
                if not self._compiling:  # XLA cannot compile summary ops
                    write_step_summaries(self)
                return tf.identity(applied)

    def _fused_update(self, grads: list[Any], unscaled: Any, finite: tf.Tensor) -> tf.Tensor:
        """The compiled step's update: one real XLA conditional around all of it.

        The chain is traced once outside the conditional, for the scalars its
        transforms require finite (its tensor work is dead and eliminated), and
        once inside, on gradients unscaled again there: nothing the size of the
        parameters becomes an operand of the conditional, so XLA fuses unscaling,
        chain and assignment.
        """
        ok = finite
        if self._guard == "scalars":
            ok = tf.logical_and(ok, self._required_finite(grads))

        def commit() -> tf.Tensor:
            fresh = unscaled()
            record_squared_norm(fresh, squared_norm(grads))
            return self._commit(fresh, *self._run_chain(fresh, skip=self._pre_reduce))

        def reject() -> tf.Tensor:  # non-finite gradients are counted by _step already
            self._skipped.assign_add(tf.cast(finite, tf.int64))
            return tf.constant(False)

        return tf.cond(ok, commit, reject)

    def _required_finite(self, grads: list[Any]) -> tf.Tensor:
        """Trace the chain for the scalars its transforms ``require_finite``."""
        shared = self._context.shared
        shared.pop("required_finite", None)
        self._run_chain(grads, skip=self._pre_reduce)
        return _all_finite(shared.pop("required_finite", []))

    def _accumulate(self, grads: list[Any], finite: tf.Tensor, k: int) -> tf.Tensor:
        store = self._state

        def add() -> tf.Tensor:
            micro = self._micro_steps.assign_add(1)
            store.accumulate(grads)
            return tf.equal(micro % k, 0)

        complete = tf.cond(finite, add, lambda: tf.constant(False))

        def apply() -> tf.Tensor:
            mean = store.accumulated(k, like=grads)
            applied = self._update(mean)
            with tf.control_dependencies([applied]):
                store.reset_accumulators()
            return tf.identity(applied)

        return tf.cond(complete, apply, lambda: tf.constant(False))

    def _run_chain(self, grads: list[Any], only: set[int] | None = None,
                   skip: set[int] | None = None) -> tuple[list[Any], list[Any]]:
        """Run the transforms in file order; return the updates and the new states."""
        store = self._state
        variables = store.variables
        updates = list(grads)
        new_states = []
        for i, (spec, transform) in enumerate(zip(self._spec.transforms,
                                                  self._transforms)):
            state = store.read(i)
            if (only is not None and i not in only) or (skip and i in skip):
                new_states.append(state)
                continue
            mask = store.masks[i]
            masked = [u if m else None for u, m in zip(updates, mask)]
            result, state = transform.update(masked, state, variables)
            if len(result) != len(variables):
                raise GradpipeError(
                    f"transform {spec.name!r} at {spec.path} returned {len(result)} "
                    f"updates for {len(variables)} variables")
            updates = [r if m else u for r, u, m in zip(result, updates, mask)]
            new_states.append(state)
        return updates, new_states

    def _update(self, grads: list[Any]) -> tf.Tensor:
        """Run the chain and assign, unless a NaN/Inf would reach the weights.

        A NaN/Inf born inside the chain (0/0 in a trust ratio, an overflow) is skipped
        like a non-finite gradient. Where every transform ``preserves_finite``, the
        scalars they ``require_finite`` prove the updates finite; otherwise every
        update element is checked. Either check comes before the first assignment.
        """
        chain = self._pre_reduce
        if self._can_apply_in_place(grads):
            return self._update_in_place(grads)
        if self._guard == "none":
            return self._commit(grads, *self._run_chain(grads, skip=chain))
        shared = self._context.shared
        shared.pop("required_finite", None)
        updates, new_states = self._run_chain(grads, skip=chain)
        checks = (shared.pop("required_finite", []) if self._guard == "scalars" else
                  [u for u, frozen in zip(updates, self._state.frozen) if not frozen])
        return tf.cond(_all_finite(checks), lambda: self._commit(grads, updates, new_states),
                       self._reject)

    def _can_apply_in_place(self, grads: list[Any]) -> bool:
        """Whether the last transform may update its variables and state in place.

        Only on the plain path, on one device, where nothing else needs the
        updates: its check is by scalars (or off), it covers every variable, no
        variable is frozen or has a float32 master, the gradients are dense and
        no summary writer wants the updates.
        """
        last = len(self._transforms) - 1
        store = self._state
        recording = tf.get_static_value(tf.summary.should_record_summaries())
        return (self._transforms[last].apply is not None
                and not self._compiling and self._guard != "updates"
                and last not in self._pre_reduce and all(store.masks[last])
                and not any(store.frozen) and not store.masters
                and not tf.distribute.has_strategy()
                and (self.placement is None or self.strategy.num_replicas_in_sync == 1)
                and not any(isinstance(g, tf.IndexedSlices) for g in grads)
                and recording is not None and not recording)

    def _update_in_place(self, grads: list[Any]) -> tf.Tensor:
        """The chain up to its last transform, then that transform's fused ``apply``.

        The last transform's ``update`` is traced only for the scalars it requires
        finite; its tensor work is unused and pruned.
        """
        last = len(self._transforms) - 1
        store, shared = self._state, self._context.shared
        shared.pop("required_finite", None)
        inputs, new_states = self._run_chain(grads, skip=self._pre_reduce | {last})
        finite = tf.constant(True)
        if self._guard == "scalars":
            self._transforms[last].update(inputs, store.read(last), store.variables)
            finite = _all_finite(shared.pop("required_finite", []))

        def commit() -> tf.Tensor:
            ops = store.write(new_states, skip=last)
            with tf.control_dependencies(ops):
                ops = ops + list(self._transforms[last].apply(
                    inputs, store.slot_variables(last), store.variables))
            with tf.control_dependencies(ops):
                self._iterations.assign_add(1)
            with tf.control_dependencies([self._iterations.read_value()]):
                return tf.constant(True)

        return tf.cond(finite, commit, self._reject)

    def _commit(self, grads: list[Any], updates: list[Any], new_states: list[Any]) -> tf.Tensor:
        """Assign the new state and subtract the updates; everything is computed."""
        store = self._state
        ops = store.write(new_states)
        for var, update, frozen in zip(store.variables, updates, store.frozen):
            if update is not None and not frozen:
                ops.append(_subtract(var, update))
        with tf.control_dependencies(ops):
            ops = ops + store.refresh_from_masters(updates)
        with tf.control_dependencies(ops):
            self._iterations.assign_add(1)
        with tf.control_dependencies(ops + [self._iterations.read_value()]):
            if not self._compiling:
                write_update_summaries(self, grads, updates)
                return tf.constant(True)
            return _real_branch_marker(self._iterations)

    def _reject(self) -> tf.Tensor:
        self._skipped.assign_add(1)
        return tf.constant(False)

    def _resolve_schedule(self, value: Any) -> Any:
        if isinstance(value, ScheduleRef):
            if value.name not in self._built_schedules:
                spec = self._spec.schedules[value.name]
                self._built_schedules[value.name] = build_component(spec, self._registry)
            return self._built_schedules[value.name]
        assert isinstance(value, ComponentSpec)
        return build_component(value, self._registry)


class _LayoutState(tf.train.experimental.PythonState):
    """The pipeline's state layout as JSON, written into every checkpoint."""

    def __init__(self) -> None:
        self.value = ""

    def serialize(self) -> str:
        return self.value

    def deserialize(self, string_value: Any) -> None:
        del string_value  # restore compares layouts first; ours stays authoritative


def _first_learning_rate(spec: PipelineSpec) -> Any:
    """``hyper()`` of the first update rule's ``learning_rate`` (call in a build scope)."""
    from .transform import hyper

    for t in spec.transforms:
        if getattr(type(t.config), "update_rule", False) and hasattr(t.config,
                                                                      "learning_rate"):
            return hyper(t.config.learning_rate)
    return None


def _unscale(g: Any, scale: tf.Tensor, dtype: tf.DType, reciprocal: bool) -> Any:
    """``g / scale`` in ``dtype`` (division, as Keras does: exact for any scale).

    For a scale that is always a power of two in the normal range (``reciprocal``),
    ``g * (1/scale)`` is the same, bit for bit, and a multiplication is cheaper.
    """
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(_unscale(g.values, scale, dtype, reciprocal), g.indices,
                                g.dense_shape)
    if reciprocal and dtype in (tf.float32, tf.float64):
        return tf.cast(g, dtype) * tf.cast(1.0 / scale, dtype)
    return tf.cast(g, dtype) / tf.cast(scale, dtype)


def _values(g: Any) -> tf.Tensor:
    return g.values if isinstance(g, tf.IndexedSlices) else g


def _all_finite(tensors: Sequence[Any]) -> tf.Tensor:
    """One scalar: every non-None tensor is finite (IndexedSlices: values; bool: true)."""
    checks = [t if t.dtype == tf.bool else tf.reduce_all(tf.math.is_finite(t))
              for t in (_values(t) for t in tensors if t is not None)]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def _finite_and_record_norm(grads: Sequence[Any], unscaled: Any, scaled_total: Any,
                            scale: tf.Tensor) -> tf.Tensor:
    """Whether every gradient is finite, from the pass that also yields their norm.

    Dense gradients: the float32 sum of squares is finite exactly when every
    element is, unless it overflows; only then are the elements checked one by
    one. The sum is recorded for ``squared_norm``, so global-norm clipping reuses
    it: one read of the gradients serves the finite check and the norm. With a
    power-of-two loss scale S the sum is taken over the scaled gradients
    (``scaled_total``) and divided by S**2, which is exact. The rare branches
    recompute the unscaled gradients (``unscaled()``) from the scaled ones, so
    XLA never has to materialise them and fuses the unscaling into the update.
    """
    present = [g for g in grads if g is not None]
    if not present or any(isinstance(g, tf.IndexedSlices) for g in present):
        return _all_finite(present)
    if scaled_total is None:
        total = sum_of_squares(grads)
    else:
        inverse = 1.0 / tf.cast(scale, tf.float32)
        # Only an overflow (or underflow) of the scaled sum needs the unscaled one.
        total = tf.cond(tf.math.is_finite(scaled_total) & (scaled_total < 2.0**100),
                        lambda: scaled_total * inverse * inverse,
                        lambda: sum_of_squares(unscaled()))
    record_squared_norm(grads, total)
    return tf.cond(tf.math.is_finite(total), lambda: tf.constant(True),
                   lambda: _all_finite(unscaled()))


def _real_branch_marker(counter: tf.Variable) -> tf.Tensor:
    """``True``, computed by an op XLA does not count as elementwise (a cumsum).

    XLA turns a conditional whose branches hold only elementwise ops into
    selects: the update is then computed on every call, skipped or not, and
    every new slot value is computed from old values that the in-place writes
    overwrite, so XLA first copies every slot. One such op keeps the update a
    real conditional, measured 12-16% faster (docs/performance.md).
    """
    value = counter.read_value()
    return tf.math.cumsum(tf.stack([value, value + 1]))[1] > value


def _subtract(var: tf.Variable, update: Any) -> Any:
    if isinstance(update, tf.IndexedSlices):
        return var.scatter_sub(tf.IndexedSlices(tf.cast(update.values, var.dtype),
                                                update.indices, update.dense_shape))
    return var.assign_sub(tf.cast(update, var.dtype))


def variable_path(var: Any) -> str:
    """The path patterns match: Keras ``path`` (``dense/kernel``), else the TF name."""
    name = getattr(var, "path", None) or var.name
    return re.sub(r":\d+$", "", name)


def slot_name(path: str) -> str:
    """A checkpoint-safe key for a variable path; ``/`` becomes ``.`` so the path's
    components stay recognisable (``sequential.dense.kernel``)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", path.replace("/", "."))
