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
        # No scaler: the scale is 1, a power of two (the norm is then also summed by the
        # fast L2Loss kernel outside XLA, and unscaling multiplies by exactly 1).
        self._power_of_two_scale = self.loss_scaler is None or bool(
            getattr(self.loss_scaler, "power_of_two", False))
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
        packing, present = self._state.packing, None
        if packing is not None:
            present = packing.present(grads)
            grads = [packing.pack(grads)]
        self._compiling = self._should_compile(grads)
        applied = (self._compiled_step if self._compiling else self._step)(grads, present)
        return applied if packing is None else self._subtract_packed(applied)

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


def variable_path(var: Any) -> str:
    """The path patterns match: Keras ``path`` (``dense/kernel``), else the TF name."""
    name = getattr(var, "path", None) or var.name
    return re.sub(r":\d+$", "", name)


def slot_name(path: str) -> str:
    """A checkpoint-safe key for a variable path; ``/`` becomes ``.`` so the path's
    components stay recognisable (``sequential.dense.kernel``)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", path.replace("/", "."))
