"""Loss scalers with the TF ``LossScale`` interface: ``fixed`` and ``dynamic``.

``fixed`` is TF ``FixedLossScale``. ``dynamic`` is TF ``DynamicLossScale`` by
default (floor 1, growth only to a finite scale) and adds ``min_loss_scale``,
``max_loss_scale`` and DeepSpeed-style ``hysteresis``; ``min_loss_scale = 0``
reproduces Keras 3 ``LossScaleOptimizer``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import attrs

from gradpipe.plugin import (
    FieldError,
    all_finite,
    at_least,
    greater_than,
    hookimpl,
    non_negative,
)


def _power_of_two(x: float | None) -> bool:
    """Dividing by a power of two in the normal range equals multiplying by its
    reciprocal, bit for bit; the engine then unscales with a multiplication."""
    return x is None or (2.0**-126 <= x <= 2.0**126 and math.frexp(x)[0] == 0.5)


@attrs.frozen(kw_only=True)
class FixedConfig:
    """Config of ``fixed``.

    Attributes:
        loss_scale_value: the constant scale, at least 1.
    """

    example: ClassVar[dict] = {"loss_scale_value": 128.0}


    loss_scale_value: float = attrs.field()

    @loss_scale_value.validator
    def _check(self, attribute: Any, value: float) -> None:
        if value < 1:
            raise ValueError("loss_scale_value must be at least 1.")


def fixed(cfg: FixedConfig) -> Any:
    import tensorflow as tf

    class FixedLossScale(tf.Module):
        """TF ``FixedLossScale``: a constant scale; ``update`` always applies."""

        def __init__(self, value: float) -> None:
            super().__init__(name="fixed_loss_scale")
            self._value = float(value)
            self.power_of_two = _power_of_two(self._value)

        def __call__(self) -> Any:
            return tf.constant(self._value, tf.float32)

        def update(self, grads: Any, finite: Any = None) -> Any:
            del grads, finite
            return tf.no_op(), tf.constant(True)

        def get_config(self) -> dict[str, float]:
            return {"loss_scale_value": self._value}

        @classmethod
        def from_config(cls, config: dict[str, float]) -> Any:
            return cls(config["loss_scale_value"])

    return FixedLossScale(cfg.loss_scale_value)


@attrs.frozen(kw_only=True)
class DynamicConfig:
    """Config of ``dynamic``.

    Attributes:
        initial_loss_scale: the starting scale.
        increment_period: finite steps in a row before the scale grows.
        multiplier: growth and back-off factor, > 1.
        min_loss_scale: floor of the scale (TF: 1; Keras 3: 0, no floor).
        max_loss_scale: ceiling of the scale; none by default.
        hysteresis: the scale backs off on the ``hysteresis``-th overflow since
            the last back-off or growth (DeepSpeed ``delayed_shift``); 1 backs
            off on every overflow, as TF and Keras do.
    """

    initial_loss_scale: float = attrs.field(default=2.0**15, validator=greater_than(0))
    increment_period: int = attrs.field(default=2000, validator=non_negative())
    multiplier: float = attrs.field(default=2.0, validator=greater_than(1.0))
    min_loss_scale: float = attrs.field(default=1.0, validator=non_negative())
    max_loss_scale: float | None = attrs.field(default=None, validator=greater_than(0))
    hysteresis: int = attrs.field(default=1, validator=at_least(1))


    def __attrs_post_init__(self) -> None:
        if self.max_loss_scale is not None and self.max_loss_scale < self.min_loss_scale:
            raise FieldError("max_loss_scale",
                             f"must be >= min_loss_scale ({self.min_loss_scale}), "
                             f"got {self.max_loss_scale}")


def dynamic(cfg: DynamicConfig) -> Any:
    import tensorflow as tf

    class DynamicLossScale(tf.Module):
        """TF ``DynamicLossScale`` with a floor, a ceiling and hysteresis."""

        def __init__(self, config: DynamicConfig) -> None:
            super().__init__(name="dynamic_loss_scale")
            self.config = config
            self.current_loss_scale = tf.Variable(
                config.initial_loss_scale, dtype=tf.float32, trainable=False,
                name="current_loss_scale")
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="good_steps")
            self.overflows = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="overflows")
            # Every scale is initial * multiplier**k, clamped to min/max.
            self.power_of_two = all(_power_of_two(x) for x in (
                config.initial_loss_scale, config.multiplier, config.min_loss_scale,
                config.max_loss_scale))

        def __call__(self) -> Any:
            return tf.convert_to_tensor(self.current_loss_scale)

        def update(self, grads: Any, finite: Any = None) -> Any:
            """TF ``LossScale.update``; ``finite``: the engine's check, if it made one."""
            c = self.config
            finite = all_finite(list(grads)) if finite is None else finite
            scale = self.current_loss_scale.read_value()
            good = self.good_steps.read_value()
            overflows = self.overflows.read_value()
            grown = scale * c.multiplier
            if c.max_loss_scale is not None:
                grown = tf.minimum(grown, c.max_loss_scale)
            grow = tf.logical_and(finite, good + 1 >= c.increment_period)
            # Growth only to a finite scale (TF); the step counter resets either way.
            grown_scale = tf.where(tf.math.is_finite(grown), grown, scale)
            backoff = tf.logical_and(tf.logical_not(finite), overflows + 1 >= c.hysteresis)
            shrunk = tf.maximum(scale / c.multiplier, c.min_loss_scale)
            new_scale = tf.where(grow, grown_scale, tf.where(backoff, shrunk, scale))
            new_good = tf.where(finite & ~grow, good + 1, tf.zeros_like(good))
            new_overflows = tf.where(grow | backoff, tf.zeros_like(overflows),
                                     overflows + tf.cast(~finite, tf.int64))
            ops = [self.current_loss_scale.assign(new_scale),
                   self.good_steps.assign(new_good),
                   self.overflows.assign(new_overflows)]
            return tf.group(ops), finite

        def get_config(self) -> dict[str, Any]:
            return {k: v for k, v in attrs.asdict(self.config).items() if v is not None}

        @classmethod
        def from_config(cls, config: dict[str, Any]) -> Any:
            return cls(DynamicConfig(**config))

    return DynamicLossScale(cfg)


@hookimpl
def gradpipe_register_loss_scalers(register: Any) -> None:
    register("fixed", fixed, FixedConfig)
    register("dynamic", dynamic, DynamicConfig)
