"""Keras's learning-rate schedules, configured exactly as Keras serializes them.

``ExponentialDecay``, ``PiecewiseConstantDecay``, ``PolynomialDecay`` and
``InverseTimeDecay`` here; ``CosineDecay`` and ``CosineDecayRestarts`` in
:mod:`gradpipe.plugins.keras_cosine`. Each component is named after its Keras
class and takes the keys of that class's ``get_config()``, ``name`` included,
with Keras's defaults, so ``{"kind": type(s).__name__, **s.get_config()}`` is
a valid table. Each computes in float32 with the operations of
``keras/src/optimizers/schedules/learning_rate_schedule.py``, in the same
order, inside ``tf.name_scope(name)`` as Keras does, elementwise over a step
tensor of any shape.

Keras's own errors (``decay_steps <= 0``, the lengths of ``boundaries`` and
``values``) are ``ConfigError`` s naming the key. Some values that Keras
accepts but that give a negative, infinite or NaN rate are rejected too; each
validator says why.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import attrs

from gradpipe.plugin import FieldError, hookimpl, increasing, non_negative, positive

#: ``tf.name_scope`` rejects other names inside a ``tf.function`` (Keras included).
_SCOPE = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")


def scope_name() -> Any:
    """Validator of ``name``: Keras opens ``tf.name_scope(name)``, which fails in
    graph mode (``model.fit``, a pipeline's step) unless the name is valid."""

    def check(inst: Any, attribute: Any, value: str) -> None:
        if not _SCOPE.match(value):
            raise ValueError(f"must be a valid TensorFlow name scope (letters, digits and "
                             f"'_.-/>', not starting with '_-/>'), as Keras opens "
                             f"tf.name_scope(name); got {value!r}")

    return check


def learning_rate(**kwargs: Any) -> Any:
    """A learning-rate key: a number >= 0."""
    return attrs.field(validator=non_negative(), **kwargs)


def steps(**kwargs: Any) -> Any:
    """A step-count key: a number > 0 (Keras: "must be > 0"); Keras casts it to
    float, so a float such as ``1e4`` is accepted as Keras accepts it."""
    return attrs.field(validator=positive(), **kwargs)


def name_field(default: str) -> Any:
    return attrs.field(default=default, validator=scope_name())


def as_float(step: Any) -> Any:
    import tensorflow as tf

    return tf.cast(step, tf.float32)


def f32(value: float) -> Any:
    import tensorflow as tf

    return tf.constant(value, tf.float32)


@attrs.frozen(kw_only=True)
class ExponentialDecayConfig:
    """Config of ``ExponentialDecay`` (``keras.optimizers.schedules.ExponentialDecay``).

    Attributes:
        initial_learning_rate: the value at step 0.
        decay_steps: steps per factor of ``decay_rate``.
        decay_rate: the factor per ``decay_steps`` steps.
        staircase: floor ``step / decay_steps`` (decay in whole periods).
        name: Keras's name, the name scope of the schedule's ops.
    """

    example: ClassVar[dict] = {"initial_learning_rate": 0.1, "decay_steps": 100,
                               "decay_rate": 0.96}

    initial_learning_rate: float = learning_rate()
    decay_steps: int | float = steps()
    decay_rate: float = attrs.field(validator=positive())
    staircase: bool = False
    name: str = name_field("ExponentialDecay")


def exponential_decay(cfg: ExponentialDecayConfig) -> Any:
    """``initial_learning_rate * decay_rate ^ (step / decay_steps)``."""
    import tensorflow as tf

    def schedule(step: Any) -> Any:
        with tf.name_scope(cfg.name):
            p = as_float(step) / f32(cfg.decay_steps)
            if cfg.staircase:
                p = tf.floor(p)
            return f32(cfg.initial_learning_rate) * tf.pow(f32(cfg.decay_rate), p)

    return schedule


@attrs.frozen(kw_only=True)
class PiecewiseConstantDecayConfig:
    """Config of ``PiecewiseConstantDecay`` (``keras.optimizers.schedules.PiecewiseConstantDecay``).

    Attributes:
        boundaries: strictly increasing steps, at least one.
        values: one more than ``boundaries``: ``values[0]`` up to and including
            ``boundaries[0]``, ``values[i]`` for ``boundaries[i-1] < step <=
            boundaries[i]``, ``values[-1]`` after the last boundary.
        name: Keras's name, the name scope of the schedule's ops.
    """

    example: ClassVar[dict] = {"boundaries": [100, 200], "values": [0.1, 0.01, 0.001]}

    boundaries: tuple[int | float, ...] = attrs.field(validator=increasing())
    values: tuple[float, ...] = attrs.field()
    name: str = name_field("PiecewiseConstant")

    @values.validator
    def _values(self, attribute: Any, value: tuple[float, ...]) -> None:
        for i, v in enumerate(value):
            if v < 0:
                raise ValueError(f"item {i}: must be >= 0, got {v!r}")

    def __attrs_post_init__(self) -> None:
        if len(self.boundaries) != len(self.values) - 1:
            raise FieldError("values", "the length of boundaries should be 1 less than the "
                             f"length of values (Keras); got {len(self.boundaries)} "
                             f"boundaries and {len(self.values)} values")
        if not self.boundaries:
            raise FieldError("boundaries", "needs at least one boundary (Keras fails at "
                             "its first step without one); for a constant, use 'constant'")


def piecewise_constant_decay(cfg: PiecewiseConstantDecayConfig) -> Any:
    """``values[i]`` for ``boundaries[i-1] < step <= boundaries[i]``."""
    import tensorflow as tf

    values = tf.constant(cfg.values, tf.float32)

    def schedule(step: Any) -> Any:
        with tf.name_scope(cfg.name):
            step = tf.convert_to_tensor(step)
            # As Keras: each boundary a tensor of its own (int32 or float32), cast to the
            # step's dtype (a float boundary truncated for an integer step).
            bounds = tf.stack([tf.cast(tf.convert_to_tensor(b), step.dtype)
                               for b in cfg.boundaries])
            index = tf.reduce_sum(tf.cast(step[..., None] > bounds, tf.int32), axis=-1)
            return tf.gather(values, index)

    return schedule


@attrs.frozen(kw_only=True)
class PolynomialDecayConfig:
    """Config of ``PolynomialDecay`` (``keras.optimizers.schedules.PolynomialDecay``).

    Attributes:
        initial_learning_rate: the value at step 0.
        decay_steps: steps from ``initial_learning_rate`` to ``end_learning_rate``.
        end_learning_rate: the value at ``decay_steps`` and after (without ``cycle``).
        power: exponent of ``1 - step / decay_steps``, >= 0 (a negative one makes
            the rate infinite at ``decay_steps``).
        cycle: restart the decay from a multiple of ``decay_steps`` after the
            first period, ``decay_steps * ceil(step / decay_steps)`` steps long.
        name: Keras's name, the name scope of the schedule's ops.
    """

    example: ClassVar[dict] = {"initial_learning_rate": 0.1, "decay_steps": 100}

    initial_learning_rate: float = learning_rate()
    decay_steps: int | float = steps()
    end_learning_rate: float = learning_rate(default=0.0001)
    power: float = attrs.field(default=1.0, validator=non_negative())
    cycle: bool = False
    name: str = name_field("PolynomialDecay")


def polynomial_decay(cfg: PolynomialDecayConfig) -> Any:
    """``(initial - end) * (1 - step / decay_steps) ^ power + end``."""
    import tensorflow as tf

    def schedule(step: Any) -> Any:
        with tf.name_scope(cfg.name):
            initial, end = f32(cfg.initial_learning_rate), f32(cfg.end_learning_rate)
            s = as_float(step)
            decay_steps = f32(cfg.decay_steps)
            if cfg.cycle:
                multiplier = tf.where(tf.equal(s, 0.0), 1.0, tf.math.ceil(s / decay_steps))
                decay_steps = decay_steps * multiplier
            else:
                s = tf.minimum(s, decay_steps)
            p = s / decay_steps
            return (initial - end) * tf.pow(1 - p, f32(cfg.power)) + end

    return schedule


@attrs.frozen(kw_only=True)
class InverseTimeDecayConfig:
    """Config of ``InverseTimeDecay`` (``keras.optimizers.schedules.InverseTimeDecay``).

    Attributes:
        initial_learning_rate: the value at step 0.
        decay_steps: steps per unit of ``decay_rate`` in the denominator.
        decay_rate: ``initial_learning_rate / (1 + decay_rate * step / decay_steps)``.
        staircase: floor ``step / decay_steps`` (decay in whole periods).
        name: Keras's name, the name scope of the schedule's ops.
    """

    example: ClassVar[dict] = {"initial_learning_rate": 0.1, "decay_steps": 100,
                               "decay_rate": 0.5}

    initial_learning_rate: float = learning_rate()
    decay_steps: int | float = steps()
    decay_rate: float = attrs.field(validator=non_negative())
    staircase: bool = False
    name: str = name_field("InverseTimeDecay")


def inverse_time_decay(cfg: InverseTimeDecayConfig) -> Any:
    """``initial_learning_rate / (1 + decay_rate * step / decay_steps)``."""
    import tensorflow as tf

    def schedule(step: Any) -> Any:
        with tf.name_scope(cfg.name):
            p = as_float(step) / f32(cfg.decay_steps)
            if cfg.staircase:
                p = tf.floor(p)
            return f32(cfg.initial_learning_rate) / (1.0 + f32(cfg.decay_rate) * p)

    return schedule


@hookimpl
def gradpipe_register_schedules(register: Any) -> None:
    register("ExponentialDecay", exponential_decay, ExponentialDecayConfig)
    register("PiecewiseConstantDecay", piecewise_constant_decay, PiecewiseConstantDecayConfig)
    register("PolynomialDecay", polynomial_decay, PolynomialDecayConfig)
    register("InverseTimeDecay", inverse_time_decay, InverseTimeDecayConfig)
