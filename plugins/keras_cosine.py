"""Keras's cosine schedules, configured exactly as Keras serializes them:
``CosineDecay`` (with its linear warm-up) and ``CosineDecayRestarts`` (SGDR).

The other four Keras schedules, and the conventions shared by all six (keys of
``get_config()``, float32 operations in Keras's order, ``tf.name_scope(name)``),
are in :mod:`gradpipe.plugins.keras_schedules`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import attrs

from gradpipe.plugin import at_least, hookimpl, in_range, non_negative
from gradpipe.plugins.keras_schedules import as_float, f32, learning_rate, name_field, steps


@attrs.frozen(kw_only=True)
class CosineDecayConfig:
    """Config of ``CosineDecay`` (``keras.optimizers.schedules.CosineDecay``).

    Attributes:
        initial_learning_rate: the value at step 0: the start of the warm-up, or
            of the decay without one.
        decay_steps: length of the cosine decay (after the warm-up).
        alpha: the floor, as a fraction of the decay's start value, in [0, 1].
        name: Keras's name, the name scope of the schedule's ops.
        warmup_target: with a warm-up, the value it reaches at ``warmup_steps``
            and the decay starts from. Unset (Keras's ``None``): no warm-up, and
            ``warmup_steps`` is ignored, as in Keras.
        warmup_steps: length of the linear warm-up from ``initial_learning_rate``
            to ``warmup_target``.
    """

    example: ClassVar[dict] = {"initial_learning_rate": 0.1, "decay_steps": 100}

    initial_learning_rate: float = learning_rate()
    decay_steps: int | float = steps()
    alpha: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    name: str = name_field("CosineDecay")
    warmup_target: float | None = learning_rate(default=None)
    warmup_steps: int | float = attrs.field(default=0, validator=non_negative())


def cosine_decay(cfg: CosineDecayConfig) -> Any:
    """Warm up linearly, then ``lr * ((1 - alpha) * 0.5 * (1 + cos(pi * t / D)) + alpha)``."""
    import tensorflow as tf

    def decay(t: Any, decay_steps: Any, start: Any) -> Any:
        cosine = 0.5 * (1.0 + tf.cos(f32(math.pi) * (t / decay_steps)))
        return start * ((1 - cfg.alpha) * cosine + cfg.alpha)

    def schedule(step: Any) -> Any:
        with tf.name_scope(cfg.name):
            initial, decay_steps = f32(cfg.initial_learning_rate), f32(cfg.decay_steps)
            s = as_float(step)
            if cfg.warmup_target is None:
                return decay(tf.minimum(s, decay_steps), decay_steps, initial)
            target, warmup_steps = f32(cfg.warmup_target), f32(cfg.warmup_steps)
            s = tf.minimum(s, decay_steps + warmup_steps)
            # Keras's tf.cond, elementwise; the unused branch may divide by zero.
            warm = (target - initial) * (s / warmup_steps) + initial
            return tf.where(s < warmup_steps, warm, decay(s - warmup_steps, decay_steps, target))

    return schedule


@attrs.frozen(kw_only=True)
class CosineDecayRestartsConfig:
    """Config of ``CosineDecayRestarts`` (``keras.optimizers.schedules.CosineDecayRestarts``).

    Attributes:
        initial_learning_rate: the value at step 0.
        first_decay_steps: length of the first period.
        t_mul: each period is ``t_mul`` times longer than the one before, >= 1
            (with less, the periods shrink and Keras's value is NaN from step
            ``first_decay_steps / (1 - t_mul)`` on).
        m_mul: each period starts at ``m_mul`` times the previous start, >= 0.
        alpha: the floor, as a fraction of ``initial_learning_rate``, in [0, 1].
        name: Keras's name, the name scope of the schedule's ops.
    """

    example: ClassVar[dict] = {"initial_learning_rate": 0.1, "first_decay_steps": 100}

    initial_learning_rate: float = learning_rate()
    first_decay_steps: int | float = steps()
    t_mul: float = attrs.field(default=2.0, validator=at_least(1.0))
    m_mul: float = attrs.field(default=1.0, validator=non_negative())
    alpha: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    name: str = name_field("SGDRDecay")


def cosine_decay_restarts(cfg: CosineDecayRestartsConfig) -> Any:
    """Cosine decay restarted after periods growing by ``t_mul``, peaks scaled by ``m_mul``."""
    import numpy as np
    import tensorflow as tf

    geometric = np.float32(cfg.t_mul) != 1.0  # Keras's tf.cond on t_mul == 1, in float32

    def schedule(step: Any) -> Any:
        with tf.name_scope(cfg.name):
            alpha, t_mul, m_mul = f32(cfg.alpha), f32(cfg.t_mul), f32(cfg.m_mul)
            fraction = as_float(step) / f32(cfg.first_decay_steps)
            if geometric:
                i_restart = tf.floor(tf.math.log(1.0 - fraction * (1.0 - t_mul))
                                     / tf.math.log(t_mul))
                sum_r = (1.0 - tf.pow(t_mul, i_restart)) / (1.0 - t_mul)
                fraction = (fraction - sum_r) / tf.pow(t_mul, i_restart)
            else:
                i_restart = tf.floor(fraction)
                fraction = fraction - i_restart
            m_fac = tf.pow(m_mul, i_restart)
            cosine = 0.5 * m_fac * (1.0 + tf.cos(f32(math.pi) * fraction))
            return f32(cfg.initial_learning_rate) * ((1 - alpha) * cosine + alpha)

    return schedule


@hookimpl
def gradpipe_register_schedules(register: Any) -> None:
    register("CosineDecay", cosine_decay, CosineDecayConfig)
    register("CosineDecayRestarts", cosine_decay_restarts, CosineDecayRestartsConfig)
