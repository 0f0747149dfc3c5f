"""The transform interface and hyperparameters that follow schedules.

A transform is a pair of pure functions over TensorFlow tensors (optax style):

* ``init(variables) -> state``
* ``update(grads, state, variables) -> (updates, state)``

The engine owns a ``tf.Variable`` for each state tensor, so a transform never
creates variables and can run eagerly, in ``tf.function``, under XLA and in a
replica context alike.

A float hyperparameter may be a schedule. ``hyper(cfg.learning_rate)`` turns
the config value into a zero-argument callable that returns the value at the
pipeline's current step as a float32 tensor. The step source is bound when the
component is built (``build_scope``), so evaluating it inside a traced step
reads a ``tf.Variable`` and a changing step never retraces.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from .fields import ScheduleRef


class Transform(NamedTuple):
    """A gradient transform: ``init(variables)`` and ``update(grads, state, variables)``."""

    init: Callable[[Sequence[Any]], Any]
    update: Callable[[Sequence[Any], Any, Sequence[Any]], tuple[list[Any], Any]]


def no_state(variables: Sequence[Any]) -> tuple[()]:
    """``init`` of a stateless transform."""
    del variables
    return ()


def map_grads(fn: Callable[..., Any], grads: Sequence[Any], *rest: Sequence[Any]) -> list[Any]:
    """Apply ``fn(g, *others)`` to every non-``None`` gradient; keep ``None`` as is."""
    return [None if g is None else fn(g, *others) for g, *others in zip(grads, *rest)]


class _BuildScope(threading.local):
    def __init__(self) -> None:
        self.stack: list[BuildContext] = []


_SCOPE = _BuildScope()


class BuildContext:
    """What a component factory can reach while it is being built.

    Attributes:
        step: zero-argument callable returning the current step (a tensor).
        resolve_schedule: turns a schedule spec or reference into a schedule.
        shared: values shared between the transforms of one pipeline, such as
            the global gradient norm, keyed by name.
    """

    def __init__(self, step: Callable[[], Any],
                 resolve_schedule: Callable[[Any], Callable[[Any], Any]]) -> None:
        self.step = step
        self.resolve_schedule = resolve_schedule
        self.shared: dict[str, Any] = {}


@contextlib.contextmanager
def build_scope(context: BuildContext) -> Iterator[BuildContext]:
    _SCOPE.stack.append(context)
    try:
        yield context
    finally:
        _SCOPE.stack.pop()


def current_context() -> BuildContext:
    if not _SCOPE.stack:
        return _default_context()
    return _SCOPE.stack[-1]


def _default_context() -> BuildContext:
    def step() -> Any:
        import tensorflow as tf

        return tf.constant(0, tf.int64)

    def resolve(value: Any) -> Callable[[Any], Any]:
        from .build import build_component

        if isinstance(value, ScheduleRef):
            from .errors import GradpipeError

            raise GradpipeError(
                f"schedule reference {value} can only be resolved inside a pipeline"
            )
        return build_component(value)

    return BuildContext(step, resolve)


def hyper(value: Any) -> Callable[[], Any]:
    """A callable returning ``value`` at the current step as a float32 scalar.

    ``value`` is what a ``hyperparameter()`` field holds: a number, a
    ``"@name"`` reference or an inline schedule. Call it inside ``update``.
    """
    import tensorflow as tf

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        constant = float(value)

        def fixed() -> Any:
            return tf.constant(constant, tf.float32)

        fixed.constant = constant  # type: ignore[attr-defined]
        return fixed
    context = current_context()
    schedule = context.resolve_schedule(value)
    step = context.step

    def evaluate() -> Any:
        return tf.cast(schedule(step()), tf.float32)

    evaluate.schedule = schedule  # type: ignore[attr-defined]
    evaluate.constant = None  # type: ignore[attr-defined]
    return evaluate


def one_minus(value: Callable[[], Any], dtype: Any) -> Any:
    """``1 - value`` in ``dtype``; for a constant, computed in Python float64 first.

    Keras computes ``1 - beta`` in Python, so doing the same keeps parity exact.
    """
    import tensorflow as tf

    constant = getattr(value, "constant", None)
    if constant is not None:
        return tf.constant(1.0 - constant, dtype)
    return 1 - tf.cast(value(), dtype)


def schedule(value: Any) -> Callable[[Any], Any]:
    """The schedule ``step -> value`` that a ``schedule_field`` (or hyperparameter) holds.

    Schedule factories use it to build the schedules they wrap (``warmup``,
    ``sequence``). A plain number becomes a constant schedule.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        constant = float(value)

        def fixed(step: Any) -> Any:
            import tensorflow as tf

            return tf.fill(tf.shape(step), tf.constant(constant, tf.float32))

        return fixed
    return current_context().resolve_schedule(value)



def shared() -> dict[str, Any]:
    """Per-pipeline values transforms share at trace time (e.g. the global norm)."""
    return current_context().shared
