"""Built-in schedules: ``fixed_lr`` (OpenSeq2Seq) and ``constant``.

A schedule maps a step tensor to a float32 scalar with TensorFlow ops only.
"""

from __future__ import annotations

from typing import Any

import attrs
from gradpipe import hookimpl


@attrs.frozen(kw_only=True)
class FixedLrConfig:
    """Config of ``fixed_lr`` (OpenSeq2Seq ``fixed_lr``).

    Attributes:
        learning_rate: the value returned at every step.
    """

    learning_rate: float


class Constant:
    """A schedule that returns one value at every step."""

    def __init__(self, value: float) -> None:
        self.value = float(value)

    def __call__(self, step: Any) -> Any:
        import tensorflow as tf

        del step
        return tf.constant(self.value, tf.float32)


def fixed_lr(cfg: FixedLrConfig) -> Constant:
    return Constant(cfg.learning_rate)


@attrs.frozen(kw_only=True)
class ConstantConfig:
    """Config of ``constant``.

    Attributes:
        value: the value returned at every step.
    """

    value: float


def constant(cfg: ConstantConfig) -> Constant:
    return Constant(cfg.value)


@hookimpl
def gradpipe_register_schedules(register: Any) -> None:
    register("fixed_lr", fixed_lr, FixedLrConfig)
    register("constant", constant, ConstantConfig)
