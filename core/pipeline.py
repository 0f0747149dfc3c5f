"""The Pipeline: a ``tf.Module`` that owns all state and applies one step.

One call of :meth:`Pipeline.apply_gradients` does, in order (the user guide,
"What one step does"):

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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import tensorflow as tf

from .build import build_component, component_spec
from .distribute import build_eagerly_once
from .errors import GradpipeError
from .fields import ScheduleRef
from .learning_rate import LearningRate
from .registry import Registry, get_registry
from .spec import ComponentSpec, PipelineSpec
from .state import StateStore
from .step import StepEngine
from .summaries import scheduled_hyperparameters
from .transform import BuildContext, build_scope


class Pipeline(StepEngine, tf.Module):
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
            # The state layout (names and shapes), saved with every checkpoint: a
            # restore pairs its names with this pipeline's and fails naming what
            # differs. Python state, not a string variable: MultiWorkerMirrored
            # cannot broadcast those.
            self._layout = _LayoutState(self)
            self._context = BuildContext(step=self._iterations.read_value,
                                         resolve_schedule=self._resolve_schedule)
            self._rate = LearningRate(spec)
            with build_scope(self._context):
                self.schedules = {name: self._resolve_schedule(ScheduleRef(name))
                                  for name in spec.schedules}
                built = [self._rate.for_build(t) for t in spec.transforms]
                self._transforms = [build_component(t, registry) for t, _ in built]
                # tracked, so that checkpoints hold it (None where it cannot be set)
                self._learning_rate_variable = self._rate.create_variable(built)
                self.criteria = [build_component(c, registry) for c in spec.convergence]
                self._learning_rate = _first_learning_rate(spec)
                self._scheduled = scheduled_hyperparameters(spec)
        self._attach_loss_scaler()
        self._state = StateStore(self, spec)
        self._pre_reduce = self._clipping_before_reduce()
        self._guard = self._update_guard()
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
        """The current learning rate of the first update rule (``nan`` if none has one).

        Settable, as Keras's ``optimizer.learning_rate``, where the update rules
        share one constant rate: ``pipe.learning_rate = 1e-4`` applies from the
        next step on and is saved with the state. A scheduled rate is an error.
        """
        if self._rate.variable is not None:
            return self._rate.variable.read_value()
        if self._learning_rate is None:
            return tf.constant(float("nan"), tf.float32)
        return self._learning_rate()

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self._rate.set(value)

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
        if self._rate.variable is not None:
            named["learning_rate"] = self._rate.variable
        if self.loss_scaler is not None:
            for var in self.loss_scaler.variables:
                named[f"loss_scale/{var.name.split(':')[0].split('/')[-1]}"] = var
        named.update(self._state.by_name)
        return named

    def layout(self) -> dict[str, list[int]]:
        """Name -> shape of every state variable; two pipelines with equal layouts
        can restore each other's state."""
        return {name: list(var.shape) for name, var in sorted(self.named_variables().items())}

    def keras_optimizer(self, name: str = "gradpipe", *, keras: str | None = None) -> Any:
        """An optimizer that applies this pipeline in ``compile()``/``fit()``.

        It is an optimizer of the Keras that ``tf.keras`` resolves to: Keras 3, or
        tf-keras (Keras 2) under ``TF_USE_LEGACY_KERAS=1``. ``keras="keras"`` or
        ``keras="tf_keras"`` picks one (``import tf_keras`` without that variable).
        """
        from .keras_common import which_keras

        flavour = keras or which_keras()
        if flavour == "keras":
            from .keras_adapter import pipeline_optimizer
        elif flavour == "tf_keras":
            from .tf_keras_adapter import pipeline_optimizer
        else:
            raise GradpipeError(f"keras must be 'keras' or 'tf_keras', got {keras!r}")
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
        divisor = self.placement.loss_divisor if self.placement else 1
        if self.loss_scaler is None and divisor == 1:
            return loss  # a factor of 1 would add a multiplication forward and back
        factor = self.loss_scale
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
        pending, self._state.pending_restore = self._state.pending_restore, None
        if pending is not None:  # a checkpoint restored before the state existed
            self._state.restore_by_name(pending, self.layout(), "the restored checkpoint")

    def restore(self, path: str, key: str = "pipeline") -> None:
        """Restore this pipeline's state from a ``tf.train.Checkpoint`` written with
        ``tf.train.Checkpoint(**{key: pipe}, ...)``, built or not (then the state
        is restored when it is built).

        ``tf.train.Checkpoint(...).restore(path)`` does the same; this also fails
        when ``path`` holds no pipeline under ``key``.
        """
        try:
            tf.train.load_variable(path, f"{key}/_layout/.ATTRIBUTES/py_state")
        except (tf.errors.NotFoundError, ValueError) as exc:
            raise GradpipeError(f"{path} holds no gradpipe pipeline under {key!r}: "
                                f"{exc}") from None
        tf.train.Checkpoint(**{key: self}).restore(path).expect_partial()

    def _restore_layout(self, saved: dict[str, list[int]]) -> None:
        """A checkpoint's layout, restored after TensorFlow deferred each saved
        state entry: pair them with this state now, or when it is built."""
        if self._state.built:
            self._state.restore_by_name(saved, self.layout(), "the checkpoint")
        else:
            self._state.pending_restore = saved

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> tf.Tensor:
        """Apply gradients of the scaled loss; return whether the step was applied."""
        pairs = list(grads_and_vars)
        if not pairs:
            raise GradpipeError("apply_gradients() got no (gradient, variable) pairs")
        if not self._state.built:
            variables = [v for _, v in pairs]
            build_eagerly_once(lambda: self.build(variables))
        grads = self._state.align(pairs)
        if all(g is None for g in grads):
            raise GradpipeError("no gradients provided for any variable")
        if self.placement is not None:
            if self._pre_reduce:  # clip_before_reduce: clip each replica's gradients
                grads = self._run_chain(grads, only=self._pre_reduce)[0]
            grads = self.placement.reduce(grads)  # once, batched
        packing, present = self._state.packing, None
        if packing is not None:
            present = packing.present(grads)
            grads = [packing.pack(grads)]
        self._compiling = self._should_compile(grads)
        applied = (self._compiled_step if self._compiling else self._step)(grads, present)
        return applied if packing is None else self._subtract_packed(applied)

    def add_loss_scale(self, table: Mapping[str, Any]) -> None:
        """Give a pipeline without ``[loss_scale]`` the loss scaler that ``table``
        describes (a TOML-shaped table), before its first step.

        The Keras adapters call it under the ``mixed_float16`` policy, as Keras's
        ``compile`` wraps a plain optimizer in a ``LossScaleOptimizer``. The
        resolved TOML (``to_toml``, a ``.keras`` file) then includes it.
        """
        if self.loss_scaler is not None:
            raise GradpipeError("this pipeline has a loss scaler already: "
                                f"{self._spec.loss_scale.name if self._spec.loss_scale else ''}")
        if int(self._iterations.numpy()) or int(self._skipped.numpy()):
            raise GradpipeError("a loss scaler can only be added before the first step")
        spec = component_spec("loss_scale", table, registry=self._registry)
        self._spec = attrs.evolve(self._spec, loss_scale=spec)
        self._attach_loss_scaler()

    def _attach_loss_scaler(self) -> None:
        spec = self._spec.loss_scale
        with self.strategy.scope(), build_scope(self._context):
            self.loss_scaler = build_component(spec, self._registry) if spec else None
        self._scaler_takes_finite = self.loss_scaler is not None and "finite" in \
            inspect.signature(self.loss_scaler.update).parameters
        # No scaler: the scale is 1, a power of two (the norm is then also summed by the
        # fast L2Loss kernel outside XLA, and unscaling multiplies by exactly 1).
        self._power_of_two_scale = self.loss_scaler is None or bool(
            getattr(self.loss_scaler, "power_of_two", False))

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

    def _resolve_schedule(self, value: Any) -> Any:
        if isinstance(value, ScheduleRef):
            if value.name not in self._built_schedules:
                spec = self._spec.schedules[value.name]
                self._built_schedules[value.name] = build_component(spec, self._registry)
            return self._built_schedules[value.name]
        assert isinstance(value, ComponentSpec)
        return build_component(value, self._registry)


class _LayoutState(tf.train.experimental.PythonState):
    """The pipeline's state layout (name -> shape) as JSON, in every checkpoint.

    TensorFlow restores Python state after it has looked up every other saved
    object of the restore, which is when the state's entries can be paired.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline

    def serialize(self) -> str:
        return json.dumps(self._pipeline.layout(), sort_keys=True)

    def deserialize(self, string_value: Any) -> None:
        text = string_value.decode() if isinstance(string_value, bytes) else string_value
        self._pipeline._restore_layout(json.loads(text) if text else {})


def _first_learning_rate(spec: PipelineSpec) -> Any:
    """``hyper()`` of the first update rule's ``learning_rate`` (call in a build scope)."""
    from .transform import hyper

    for t in spec.transforms:
        if getattr(type(t.config), "update_rule", False) and hasattr(t.config,
                                                                      "learning_rate"):
            return hyper(t.config.learning_rate)
    return None
