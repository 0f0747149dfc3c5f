"""Convergence criteria (the TFP interface) and ``Pipeline.minimize``.

``minimize`` mirrors ``tfp.math.minimize``: step 0 is a real update whose loss
and gradients are taken before it and parameters after it; the criterion is
bootstrapped there; each later step runs only while the reduced
``has_converged`` is false, otherwise the previous quantities are carried
forward, so the trace has ``max_steps`` entries (or is cut at the first
converged step with ``return_full_length_trace=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple


class Criterion:
    """Base class of convergence criteria, with TFP ``ConvergenceCriterion`` semantics.

    Subclasses implement ``_bootstrap(loss, grads, parameters)`` and
    ``_one_step(step, loss, grads, parameters, state)``; ``one_step`` applies
    the ``step >= min_num_steps`` guard. An empty state is ``()``, never
    ``None`` (TFP's loop cannot carry ``None``).
    """

    def __init__(self, min_num_steps: int, name: str) -> None:
        self._min_num_steps = int(min_num_steps)
        self._name = name

    @property
    def min_num_steps(self) -> int:
        return self._min_num_steps

    @property
    def name(self) -> str:
        return self._name

    def bootstrap(self, loss: Any, grads: Any, parameters: Any) -> Any:
        import tensorflow as tf

        return self._bootstrap(tf.convert_to_tensor(loss), _tensors(grads),
                               _tensors(parameters))

    def one_step(self, step: Any, loss: Any, grads: Any, parameters: Any,
                 auxiliary_state: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        step = tf.convert_to_tensor(step)
        converged, state = self._one_step(step, tf.convert_to_tensor(loss), _tensors(grads),
                                          _tensors(parameters), auxiliary_state)
        return converged & (step >= tf.cast(self._min_num_steps, step.dtype)), state

    def _bootstrap(self, loss: Any, grads: Any, parameters: Any) -> Any:
        raise NotImplementedError

    def _one_step(self, step: Any, loss: Any, grads: Any, parameters: Any,
                  state: Any) -> tuple[Any, Any]:
        raise NotImplementedError


def _tensors(values: Any) -> Any:
    import tensorflow as tf

    return None if values is None else [tf.convert_to_tensor(v) for v in values]


class AnyOf:
    """Several criteria: converged when any of them is; remembers which fired first."""

    def __init__(self, criteria: Sequence[Any]) -> None:
        self.criteria = list(criteria)

    def bootstrap(self, loss: Any, grads: Any, parameters: Any) -> tuple[Any, ...]:
        return tuple(c.bootstrap(loss, grads, parameters) for c in self.criteria)

    def one_step(self, step: Any, loss: Any, grads: Any, parameters: Any,
                 states: tuple[Any, ...]) -> tuple[Any, Any, tuple[Any, ...]]:
        """``(has_converged, index of the first criterion that converged or -1, states)``."""
        import tensorflow as tf

        flags, new_states = [], []
        for criterion, state in zip(self.criteria, states):
            flag, state = criterion.one_step(step, loss, grads, parameters, state)
            flags.append(flag)
            new_states.append(state)
        shape = tf.broadcast_static_shape(*(f.shape for f in flags)) if len(flags) > 1 \
            else flags[0].shape
        stacked = tf.stack([tf.broadcast_to(f, shape) for f in flags])
        fired = tf.reduce_any(tf.reshape(stacked, [len(flags), -1]), axis=1)
        which = tf.where(tf.reduce_any(fired), tf.argmax(tf.cast(fired, tf.int32),
                                                        output_type=tf.int32), -1)
        return tf.reduce_any(stacked, axis=0), which, tuple(new_states)


class TraceableQuantities(NamedTuple):
    """What ``trace_fn`` receives (the fields of TFP's ``MinimizeTraceableQuantities``)."""

    step: Any
    loss: Any
    gradients: Any
    parameters: Any
    has_converged: Any
    convergence_criterion_state: Any
    optimizer_state: Any
    seed: Any


class MinimizeResult(NamedTuple):
    """The outcome of ``Pipeline.minimize``.

    Attributes:
        trace: stacked ``trace_fn`` values, one entry per step.
        steps: number of steps that ran an update (step 0 included).
        loss: the last loss computed.
        converged: whether a criterion fired (after ``batch_convergence_reduce_fn``).
        criterion: the name of the first criterion that fired, or ``None``.
        skipped_steps: steps skipped for non-finite gradients during the run.
        parameters: the final parameter values.
    """

    trace: Any
    steps: int
    loss: Any
    converged: bool
    criterion: str | None
    skipped_steps: int
    parameters: Any


def gradient_step(pipe: Any, loss_fn: Callable[[], Any], variables: list[Any]
                  ) -> tuple[Any, list[Any], list[Any], Any]:
    """One update of ``pipe`` on ``loss_fn``.

    Returns ``(loss, unscaled gradients, parameters after the update, applied)``,
    ordered after the update; the gradients are those the criteria should see
    (a ``None`` gradient is reported as zeros).
    """
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = loss_fn()
        scaled = pipe.scale_loss(loss)
    scale = pipe.loss_scale  # read before the update may change it
    grads = tape.gradient(scaled, variables)
    applied = pipe.apply_gradients(zip(grads, variables))
    unscaled = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) / scale
                for g, v in zip(grads, variables)]
    with tf.control_dependencies([applied]):
        return (tf.identity(loss), [tf.identity(g) for g in unscaled],
                [tf.identity(v) for v in variables], tf.identity(applied))


def minimize(pipe: Any, loss_fn: Callable[[], Any], var_list: Sequence[Any], max_steps: int,
             *, trace_fn: Callable[[TraceableQuantities], Any] | None = None,
             return_full_length_trace: bool = True,
             batch_convergence_reduce_fn: Callable[[Any], Any] | None = None,
             jit_compile: bool = False) -> MinimizeResult:
    """Run up to ``max_steps`` updates of ``pipe`` on ``loss_fn`` in one ``tf.function``."""
    import tensorflow as tf

    from .errors import GradpipeError

    if int(max_steps) < 1:
        raise GradpipeError(f"max_steps must be at least 1, got {max_steps}")
    variables = list(var_list)
    pipe.build(variables)
    trace_fn = trace_fn or (lambda tq: tq.loss)
    reduce_fn = batch_convergence_reduce_fn or tf.reduce_all
    criteria = AnyOf(pipe.criteria) if pipe.criteria else None
    skipped_before = int(pipe.skipped_steps.numpy())

    # Traced once, called before the loop and inside it: the step's ops are built
    # once, not twice (a function call, inlined by TensorFlow's graph optimizer).
    @tf.function(autograph=False)
    def update() -> tuple[Any, list[Any], list[Any]]:
        loss, grads, params, _ = gradient_step(pipe, loss_fn, variables)
        return loss, grads, params

    def quantities(step: Any, loss: Any, grads: Any, params: Any, converged: Any,
                   state: Any) -> TraceableQuantities:
        return TraceableQuantities(step, loss, grads, params, converged, state, (), -1)

    def run() -> tuple[Any, ...]:
        loss, grads, params = update()
        state = criteria.bootstrap(loss, grads, params) if criteria else ()
        # carried: step, loss, grads, params, has_converged, state, which, updates run
        start = (tf.constant(0), loss, grads, params, tf.zeros(tf.shape(loss), tf.bool),
                 state, tf.constant(-1), tf.constant(1))

        def traced(carried: tuple[Any, ...]) -> Any:
            # The reduced flag is traced beside the user's values to cut short traces.
            return trace_fn(quantities(*carried[:6])), reduce_fn(carried[4])

        arrays = tf.nest.map_structure(
            lambda t: tf.TensorArray(tf.convert_to_tensor(t).dtype, size=max_steps,
                                     element_shape=tf.convert_to_tensor(t).shape).write(0, t),
            traced(start))

        def body(i: Any, carried: tuple[Any, ...], arrays: Any) -> tuple[Any, ...]:
            def advance() -> tuple[Any, ...]:
                loss, grads, params = update()
                if criteria is None:
                    return (i, loss, grads, params, carried[4], carried[5], carried[6],
                            carried[7] + 1)
                converged, which, state = criteria.one_step(i, loss, grads, params,
                                                            carried[5])
                which = tf.where(carried[6] >= 0, carried[6], which)
                return (i, loss, grads, params, converged, state, which, carried[7] + 1)

            new = tf.cond(reduce_fn(carried[4]), lambda: carried, advance)
            arrays = tf.nest.map_structure(lambda ta, t: ta.write(i, t), arrays, traced(new))
            return i + 1, new, arrays

        _, final, arrays = tf.while_loop(lambda i, *_: i < max_steps, body,
                                         (tf.constant(1), start, arrays))
        return tf.nest.map_structure(lambda ta: ta.stack(), arrays), final

    compiled = tf.function(run, jit_compile=jit_compile, autograph=False)
    (trace, flags), final = compiled()
    if not return_full_length_trace:
        fired = [bool(f) for f in flags.numpy()]
        cut = fired.index(True) + 1 if True in fired else max_steps
        trace = tf.nest.map_structure(lambda t: t[:cut], trace)
    which = int(final[6])
    return MinimizeResult(
        trace=trace, steps=int(final[7]), loss=final[1], converged=bool(flags[-1]),
        criterion=pipe.criteria[which].name if which >= 0 else None,
        skipped_steps=int(pipe.skipped_steps.numpy()) - skipped_before, parameters=final[3])
