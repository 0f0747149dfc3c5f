"""The Pipeline: a ``tf.Module`` that owns all state, made of its parts.

Built from a spec, it holds the components (placement, loss scaler,
schedules, transforms, criteria) and the counters. ``build(variables)`` adds
the rest: the :class:`~gradpipe._engine.plan.Plan` (how a step runs), the
:class:`~gradpipe._engine.state.StateStore` (every state variable, by name)
and the :class:`~gradpipe._engine.step.Step` that runs it. One call of
``apply_gradients`` is one step (the user guide, "What one step does").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import tensorflow as tf

from ..components import build_component, component_spec
from ..distribute import build_eagerly_once
from ..errors import GradpipeError
from ..fields import ScheduleRef
from ..registry import Registry, get_registry
from ..spec import ComponentSpec, PipelineSpec
from ..transform import BuildContext, build_scope
from .compile_choice import compile_choices
from .guard import how_bounded, maths_key
from .layout import LayoutState
from .learning_rate import LearningRate
from .packed import elementwise_mismatch
from .plan import Choice, Plan, make_plan
from .proof_table import proof_for
from .rows import describe_rows
from .selection import check_one_rule_each, frozen_variables, transform_masks
from .shards import expand, servers_choice
from .state import Counters, StateStore
from .step import Step
from .summaries import scheduled_hyperparameters


class Pipeline(tf.Module):
    """A built gradient pipeline. Create it with ``gradpipe.load``/``gradpipe.build``."""

    def __init__(self, spec: PipelineSpec, registry: Registry | None = None) -> None:
        super().__init__(name="gradpipe")
        self._spec = spec
        self._registry = registry = registry or get_registry()
        self.placement = build_component(spec.placement, registry) if spec.placement \
            else None
        self._built_schedules: dict[str, Any] = {}
        # Every state variable keeps aggregation NONE: each replica updates its own
        # copy from the *reduced* gradients, so all copies compute the same value,
        # and no merge_call is needed inside the step's tf.cond (which
        # ONLY_FIRST_REPLICA would require, and which fails in a replica context).
        with self.strategy.scope():
            self._iterations, self._skipped, self._micro_steps = (
                tf.Variable(0, dtype=tf.int64, trainable=False, name=name)
                for name in ("iterations", "skipped_steps", "micro_steps"))
            # The state layout, saved with every checkpoint: a restore pairs its
            # names with this pipeline's and fails naming what differs.
            self._layout = LayoutState(self.layout, self._restore_layout)
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
                self._proofs = [proof_for(t) for t, _ in built]
                self._kernel = self._build_kernel(built[-1][0])
                self.criteria = [build_component(c, registry) for c in spec.convergence]
                self._rule_rates = self._rate.readers(built)
                self._scheduled = scheduled_hyperparameters(spec)
        self._attach_loss_scaler()
        self._state = StateStore(spec)
        self._plan: Plan | None = None
        self._step: Step | None = None

    # -- public API --------------------------------------------------------

    def __repr__(self) -> str:  # what Keras shows for compile(optimizer=pipe), too
        chain = ", ".join(t.name for t in self._spec.transforms)
        return f"<gradpipe pipeline [{chain}]; Keras takes pipe.keras_optimizer()>"

    @property
    def spec(self) -> PipelineSpec:
        return self._spec

    @property
    def plan(self) -> Plan:
        """How a step runs (XLA, packing, in place, how outputs are known finite), each
        with its reason; ``print(pipe.plan)``. Made when the pipeline is built."""
        if self._plan is None or self._step is None:
            raise GradpipeError("the plan depends on the variables: build the pipeline "
                                "first (pipe.build(variables), or its first step)")
        if self._plan.rows is None:  # a trace of its own, paid only by who reads it
            self._plan = attrs.evolve(self._plan, rows=Choice(
                *describe_rows(self._step, self._plan.pack.on)))
        return self._plan

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
    def model_variables(self) -> list[Any]:
        """The variables the pipeline was built for, in the order it was given them
        (a variable split over parameter servers as its shards)."""
        return list(self._state.model_variables)

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current loss scale (1.0 without a loss scaler)."""
        if self.loss_scaler is None:
            return tf.constant(1.0, tf.float32)
        return tf.convert_to_tensor(self.loss_scaler())

    @property
    def learning_rate(self) -> tf.Tensor:
        """The first update rule's current rate (``nan`` if none has one); each
        rule's is in :attr:`learning_rates`. Settable, as Keras's, where the rules
        share one constant rate: ``pipe.learning_rate = 1e-4`` applies from the next
        step on and is saved with the state. A scheduled rate is an error."""
        if self._rate.variable is not None:
            return self._rate.variable.read_value()
        first = next(iter(self._rule_rates.values()), None)
        return tf.constant(float("nan"), tf.float32) if first is None else first()

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self._rate.set(value)

    @property
    def learning_rates(self) -> Mapping[str, tf.Tensor]:
        """Each update rule's current learning rate, by its path (``"transforms[1]"``)."""
        return self._rate.current(self._rule_rates)

    def minimize(self, loss_fn: Any, var_list: Sequence[Any], max_steps: int,
                 trace_fn: Any = None, *, return_full_length_trace: bool = True,
                 batch_convergence_reduce_fn: Any = None, jit_compile: bool = False) -> Any:
        """Run up to ``max_steps`` updates in one ``tf.function`` loop (``tfp.math.minimize``).

        Stops when any ``[[convergence]]`` criterion converges. Returns a
        :class:`gradpipe.convergence.MinimizeResult`.
        """
        from ..convergence import minimize

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
        replicas = int(self.strategy.num_replicas_in_sync)
        if self.placement is not None and replicas > 1:
            self.placement.check_replicated_step(self._spec.options.jit_compile)
        if self._state.built:
            return
        shards = expand(variables)
        variables, paths = shards.variables, shards.paths
        masks = transform_masks(self._spec, paths)
        frozen = frozen_variables(self._spec, paths, masks)
        check_one_rule_each(self._spec, paths, masks)
        servers = servers_choice(shards, strategy=self.strategy, spec=self._spec,
                                 transforms=self._transforms, masks=masks,
                                 context=self._context)
        plan = make_plan(
            self._spec, variables=variables, masks=masks, frozen=frozen,
            proved=[p is not None for p in self._proofs], has_kernel=self._kernel is not None,
            replicas=replicas, clip_per_replica=bool(
                getattr(self.placement, "clip_before_reduce", False)), servers=servers,
            elementwise_probe=lambda i: elementwise_mismatch(self._transforms[i],
                                                             self._context),
            how_bounded=lambda i: how_bounded(self._transforms[i], self._context,
                                              maths_key(self._spec, i)))
        self._state.build(shards, transforms=self._transforms, strategy=self.strategy,
                          masks=masks, frozen=frozen, pack=plan.pack.on)
        step = Step(spec=self._spec, transforms=self._transforms, kernel=self._kernel,
                    proofs=self._proofs, state=self._state, plan=plan,
                    counters=Counters(iterations=self._iterations, skipped=self._skipped,
                                      micro_steps=self._micro_steps),
                    loss_scaler=self.loss_scaler, context=self._context, replicas=replicas,
                    reduce=self.placement.reduce if self.placement else list,
                    pipeline=self, scheduled=self._scheduled)
        if plan.compile.on:
            plan = step.plan = compile_choices(
                plan, step, self._transforms, self._context, variables=variables,
                masks=masks, frozen=frozen, replicas=replicas)
        self._plan, self._step = plan, step
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

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> tf.Tensor:
        """Apply gradients of the scaled loss; return whether the step was applied."""
        pairs = list(grads_and_vars)
        if not pairs:
            raise GradpipeError("apply_gradients() got no (gradient, variable) pairs")
        if self._step is None:
            variables = [v for _, v in pairs]
            build_eagerly_once(lambda: self.build(variables))
        assert self._step is not None
        return self._step.apply(pairs)

    def path(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> str:
        """Which path a step with these gradients takes here and now ("compiled",
        "in place" or "plain (why)"): the plan's choice, and what only a trace knows
        (sparse gradients, a summary writer, a strategy)."""
        pairs = list(grads_and_vars)
        return self._built_for(pairs).path(pairs)

    def compiled_hlo(self, grads_and_vars: Iterable[tuple[Any, Any]],
                     stage: str = "optimized_hlo") -> str:
        """What XLA makes of the compiled step for these gradients (``stage``: "hlo"
        or "optimized_hlo"), for inspecting the fused step; the plan must compile."""
        pairs = list(grads_and_vars)
        step = self._built_for(pairs)
        assert self._plan is not None
        if not self._plan.compile.on:
            raise GradpipeError(f"this pipeline's step is not compiled: {self._plan.compile}")
        return step.compiled_hlo(pairs, stage)

    def _built_for(self, pairs: list[tuple[Any, Any]]) -> Step:
        if self._step is None:
            self.build([v for _, v in pairs])
        assert self._step is not None
        return self._step

    def add_loss_scale(self, table: Mapping[str, Any]) -> None:
        """Give a pipeline without ``[loss_scale]`` the loss scaler ``table`` describes,
        before it is built: the Keras adapters do under ``mixed_float16``, as Keras's
        ``compile`` does. ``to_toml`` and a ``.keras`` file then include it."""
        if self.loss_scaler is not None:
            raise GradpipeError("this pipeline has a loss scaler already")
        if self._step is not None:
            raise GradpipeError("a loss scaler must be added before the pipeline is built")
        spec = component_spec("loss_scale", table, registry=self._registry)
        self._spec = attrs.evolve(self._spec, loss_scale=spec)
        self._attach_loss_scaler()

    # -- parts -------------------------------------------------------------

    def _attach_loss_scaler(self) -> None:
        spec = self._spec.loss_scale
        with self.strategy.scope(), build_scope(self._context):
            self.loss_scaler = build_component(spec, self._registry) if spec else None

    def _build_kernel(self, last: ComponentSpec) -> Any:
        """The last transform's fused in-place kernel, where its plugin registered one."""
        comp = self._registry.get("transform", f"{last.dist}>{last.name}" if last.dist
                                  else last.name)
        return comp.kernel(last.config) if comp.kernel is not None else None

    def _resolve_schedule(self, value: Any) -> Any:
        if isinstance(value, ScheduleRef):
            if value.name not in self._built_schedules:
                spec = self._spec.schedules[value.name]
                self._built_schedules[value.name] = build_component(spec, self._registry)
            return self._built_schedules[value.name]
        assert isinstance(value, ComponentSpec)
        return build_component(value, self._registry)

    def _restore_layout(self, saved: dict[str, list[int]]) -> None:
        """A checkpoint's layout, restored after TensorFlow deferred each saved
        state entry: pair them with this state now, or when it is built."""
        if self._state.built:
            self._state.restore_by_name(saved, self.layout(), "the checkpoint")
        else:
            self._state.pending_restore = saved
