"""Composable schedules: ``fixed_lr``, ``constant``, ``linear``, ``cosine``,
``warmup`` (linear warm-up into any schedule) and ``sequence`` (schedules
joined at step boundaries).

Schedules nest in TOML: ``warmup.after`` and ``sequence.schedules`` take
``"@name"`` references or inline tables. Every schedule maps a step tensor of
any shape to float32 values with TensorFlow ops only.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import attrs

from gradpipe.plugin import (
    FieldError,
    at_least,
    hookimpl,
    increasing,
    non_negative,
    positive,
    schedule,
    schedule_field,
)


def _f(step: Any) -> Any:
    import tensorflow as tf

    return tf.cast(step, tf.float32)


def _fill(step: Any, value: float) -> Any:
    import tensorflow as tf

    return tf.fill(tf.shape(step), tf.constant(value, tf.float32))


@attrs.frozen(kw_only=True)
class FixedLrConfig:
    """Config of ``fixed_lr`` (OpenSeq2Seq ``fixed_lr``).

    Attributes:
        learning_rate: the value returned at every step.
    """

    example: ClassVar[dict] = {"learning_rate": 0.1}

    learning_rate: float


def fixed_lr(cfg: FixedLrConfig) -> Any:
    """The same learning rate at every step."""
    return lambda step: _fill(step, cfg.learning_rate)


@attrs.frozen(kw_only=True)
class ConstantConfig:
    """Config of ``constant``.

    Attributes:
        value: the value returned at every step.
    """

    example: ClassVar[dict] = {"value": 0.1}

    value: float


def constant(cfg: ConstantConfig) -> Any:
    """The same value at every step."""
    return lambda step: _fill(step, cfg.value)


@attrs.frozen(kw_only=True)
class LinearConfig:
    """Config of ``linear``.

    Attributes:
        start: the value at step ``begin`` and before.
        end: the value at step ``begin + steps`` and after.
        steps: length of the ramp.
        begin: the step where the ramp starts.
    """

    example: ClassVar[dict] = {"start": 0.1, "end": 0.01, "steps": 100}

    start: float
    end: float
    steps: int = attrs.field(validator=positive())
    begin: int = attrs.field(default=0, validator=non_negative())


def linear(cfg: LinearConfig) -> Any:
    """``start + (end - start) * clip((step - begin) / steps, 0, 1)``."""
    import tensorflow as tf

    def evaluate(step: Any) -> Any:
        frac = tf.clip_by_value((_f(step) - cfg.begin) / cfg.steps, 0.0, 1.0)
        return cfg.start + (cfg.end - cfg.start) * frac

    return evaluate


@attrs.frozen(kw_only=True)
class CosineConfig:
    """Config of ``cosine``: linear warm-up to a peak, cosine decay to a floor.

    Attributes:
        learning_rate: the peak value, reached at ``warmup_steps``.
        decay_steps: length of the cosine decay after the warm-up (optax's
            ``warmup_cosine_decay_schedule`` counts the warm-up in its ``decay_steps``).
        warmup_steps: length of the linear warm-up.
        warmup_init: the value at step 0.
        min_lr: the floor, in learning-rate units, reached after the decay.
    """

    example: ClassVar[dict] = {"learning_rate": 0.1, "decay_steps": 100, "warmup_steps": 10}

    learning_rate: float = attrs.field(validator=non_negative())
    decay_steps: int = attrs.field(validator=positive())
    warmup_steps: int = attrs.field(default=0, validator=non_negative())
    warmup_init: float = attrs.field(default=0.0, validator=non_negative())
    min_lr: float = attrs.field(default=0.0, validator=non_negative())

    def __attrs_post_init__(self) -> None:
        if self.min_lr > self.learning_rate:
            raise FieldError("min_lr", f"must be <= learning_rate ({self.learning_rate}), "
                             f"got {self.min_lr}")


def cosine(cfg: CosineConfig) -> Any:
    """Warm up linearly from ``warmup_init``, then cosine from the peak to ``min_lr``."""
    import tensorflow as tf

    def evaluate(step: Any) -> Any:
        s = _f(step)
        w = max(cfg.warmup_steps, 1)
        warm = cfg.warmup_init + (cfg.learning_rate - cfg.warmup_init) * s / w
        t = tf.clip_by_value(s - cfg.warmup_steps, 0.0, float(cfg.decay_steps))
        decay = cfg.min_lr + (cfg.learning_rate - cfg.min_lr) * 0.5 * (
            1 + tf.cos(math.pi * t / cfg.decay_steps))
        return tf.where(s < cfg.warmup_steps, warm, decay)

    return evaluate


@attrs.frozen(kw_only=True)
class WarmupConfig:
    """Config of ``warmup``: linear warm-up into another schedule.

    Attributes:
        after: the schedule that follows; it starts at its own step 0.
        warmup_steps: length of the warm-up.
        init_value: the value at step 0; the ramp ends at ``after(0)``.
    """

    example: ClassVar[dict] = {"warmup_steps": 10, "after": {"kind": "constant", "value": 0.1}}

    after: Any = schedule_field()
    warmup_steps: int = attrs.field(validator=at_least(1))
    init_value: float = 0.0


def warmup(cfg: WarmupConfig) -> Any:
    """``init + (after(0) - init) * step/W`` for ``step < W``, then ``after(step - W)``."""
    import tensorflow as tf

    after = schedule(cfg.after)

    def evaluate(step: Any) -> Any:
        s = _f(step)
        peak = after(tf.zeros_like(s))
        ramp = cfg.init_value + (peak - cfg.init_value) * s / cfg.warmup_steps
        return tf.where(s < cfg.warmup_steps, ramp,
                        after(tf.maximum(s - cfg.warmup_steps, 0.0)))

    return evaluate


@attrs.frozen(kw_only=True)
class SequenceConfig:
    """Config of ``sequence``: schedules joined at step boundaries.

    Attributes:
        schedules: ``n`` schedules (``"@name"`` or tables).
        boundaries: ``n - 1`` increasing steps; schedule ``i`` runs from
            ``boundaries[i-1]`` and sees ``step - boundaries[i-1]``.
    """

    example: ClassVar[dict] = {
        "schedules": [{"kind": "constant", "value": 0.1},
                      {"kind": "linear", "start": 0.1, "end": 0.0, "steps": 50}],
        "boundaries": [20]}

    schedules: Any = schedule_field(many=True)
    boundaries: tuple[int, ...] = attrs.field(validator=increasing())

    def __attrs_post_init__(self) -> None:
        count = len(self.schedules) if isinstance(self.schedules, tuple) else 1
        if count != len(self.boundaries) + 1:
            raise FieldError("boundaries", f"needs one boundary fewer than schedules: "
                             f"{count} schedules, {len(self.boundaries)} boundaries")


def sequence(cfg: SequenceConfig) -> Any:
    """Schedule ``i`` on ``[b[i-1], b[i])``, evaluated at ``step - b[i-1]``."""
    import tensorflow as tf

    parts = [schedule(s) for s in cfg.schedules]
    starts = [0, *cfg.boundaries]

    def evaluate(step: Any) -> Any:
        s = _f(step)
        out = parts[0](s)
        for start, part in zip(starts[1:], parts[1:]):
            out = tf.where(s >= start, part(tf.maximum(s - start, 0.0)), out)
        return out

    return evaluate


@hookimpl
def gradpipe_register_schedules(register: Any) -> None:
    register("fixed_lr", fixed_lr, FixedLrConfig)
    register("constant", constant, ConstantConfig)
    register("linear", linear, LinearConfig)
    register("cosine", cosine, CosineConfig)
    register("warmup", warmup, WarmupConfig)
    register("sequence", sequence, SequenceConfig)
