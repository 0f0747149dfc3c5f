"""OpenSeq2Seq learning-rate policies, exactly as NVIDIA/OpenSeq2Seq
``optimizers/lr_policies.py`` computes them, quirks included.

Every policy maps a step tensor (any shape, so a whole range evaluates at
once) to float32 values with TensorFlow ops only. Where a quirk is a bug, the
reference behaviour stays the default and a clearly named option corrects it:

* ``poly_decay.decay_after_warmup``: start the decay after the warm-up
  (the reference before commit c56e2486) instead of overlapping them;
* ``cosine_decay.absolute_min_lr``: ``min_lr`` is a floor in learning-rate
  units, not a fraction of ``learning_rate``;
* ``inv_poly_decay.apply_warmup``: honour ``warmup_steps`` and
  ``begin_decay_at``, which the reference ignores.
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
)


def _f(step: Any) -> Any:
    import tensorflow as tf

    return tf.cast(step, tf.float32)


def _warmup(lr: float, step: Any, warmup_steps: int) -> Any:
    """``lr * step / warmup`` while ``step < warmup``, else ``lr`` (OpenSeq2Seq)."""
    import tensorflow as tf

    lr_t = tf.fill(tf.shape(step), tf.constant(lr, tf.float32))
    if warmup_steps <= 0:
        return lr_t
    return tf.where(step < warmup_steps, lr * step / warmup_steps, lr_t)


@attrs.frozen(kw_only=True)
class PiecewiseConfig:
    """Config of ``piecewise_constant``.

    Attributes:
        learning_rate: the value up to and including the first boundary.
        boundaries: increasing steps (or epochs with ``steps_per_epoch``).
        decay_rates: after boundary ``i`` the value is ``learning_rate * decay_rates[i]``.
        steps_per_epoch: when set, boundaries are in epochs.
    """

    example: ClassVar[dict] = {"learning_rate": 0.1, "boundaries": [10, 20],
                               "decay_rates": [0.5, 0.1]}

    learning_rate: float = attrs.field(validator=non_negative())
    boundaries: tuple[float, ...] = attrs.field(validator=increasing())
    decay_rates: tuple[float, ...]
    steps_per_epoch: int | None = attrs.field(default=None, validator=at_least(1))

    def __attrs_post_init__(self) -> None:
        if len(self.boundaries) != len(self.decay_rates):
            raise FieldError("decay_rates", f"needs one rate per boundary: "
                             f"{len(self.boundaries)} boundaries, "
                             f"{len(self.decay_rates)} rates")


def piecewise_constant(cfg: PiecewiseConfig) -> Any:
    """``values[i]`` for ``b[i-1] < step <= b[i]`` with ``values = [lr] + lr*decay_rates``."""
    import tensorflow as tf

    scale = cfg.steps_per_epoch or 1
    bounds = tf.constant([b * scale for b in cfg.boundaries], tf.float32)
    values = tf.constant([cfg.learning_rate] + [cfg.learning_rate * r for r in cfg.decay_rates],
                         tf.float32)

    def schedule(step: Any) -> Any:
        s = _f(step)
        index = tf.reduce_sum(tf.cast(s[..., None] > bounds, tf.int32), axis=-1)
        return tf.gather(values, index)

    return schedule


@attrs.frozen(kw_only=True)
class ExpDecayConfig:
    """Config of ``exp_decay``.

    Attributes:
        learning_rate: the initial value.
        decay_steps: steps per factor of ``decay_rate``.
        decay_rate: the decay factor.
        use_staircase_decay: floor the exponent (decay in whole periods).
        begin_decay_at: the value is constant before this step.
        min_lr: floor of the result.
    """

    example: ClassVar[dict] = {"learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5}

    learning_rate: float = attrs.field(validator=non_negative())
    decay_steps: int = attrs.field(validator=positive())
    decay_rate: float = attrs.field(validator=positive())
    use_staircase_decay: bool = False
    begin_decay_at: int = attrs.field(default=0, validator=non_negative())
    min_lr: float = attrs.field(default=0.0, validator=non_negative())


def exp_decay(cfg: ExpDecayConfig) -> Any:
    """``max(min_lr, lr * rate^((step - begin) / decay_steps))`` after ``begin_decay_at``."""
    import tensorflow as tf

    def schedule(step: Any) -> Any:
        s = _f(step)
        exponent = (s - cfg.begin_decay_at) / cfg.decay_steps
        if cfg.use_staircase_decay:
            exponent = tf.floor(exponent)
        decayed = cfg.learning_rate * tf.pow(tf.constant(cfg.decay_rate, tf.float32), exponent)
        lr = tf.where(s < cfg.begin_decay_at, tf.ones_like(s) * cfg.learning_rate, decayed)
        return tf.maximum(lr, cfg.min_lr)

    return schedule


@attrs.frozen(kw_only=True)
class PolyDecayConfig:
    """Config of ``poly_decay`` and ``cosine_decay``.

    Attributes:
        learning_rate: the peak value.
        decay_steps: length of the decay.
        power: exponent of the polynomial (unused by ``cosine_decay``, as in the reference).
        begin_decay_at: the decay starts at this step.
        min_lr: the end value of ``poly_decay``; for ``cosine_decay`` a *fraction*
            of ``learning_rate`` (reference), or a value with ``absolute_min_lr``.
        warmup_steps: linear warm-up from 0 over this many steps.
        decay_after_warmup: ``poly_decay`` only: begin the decay after the
            warm-up instead of overlapping them (corrects the reference).
        absolute_min_lr: ``cosine_decay`` only: ``min_lr`` is an absolute floor
            (corrects the reference).
    """

    example: ClassVar[dict] = {"learning_rate": 0.1, "decay_steps": 100, "warmup_steps": 10}

    learning_rate: float = attrs.field(validator=non_negative())
    decay_steps: int = attrs.field(validator=positive())
    power: float = attrs.field(default=1.0, validator=positive())
    begin_decay_at: int = attrs.field(default=0, validator=non_negative())
    min_lr: float = attrs.field(default=0.0, validator=non_negative())
    warmup_steps: int = attrs.field(default=0, validator=non_negative())
    decay_after_warmup: bool = False
    absolute_min_lr: bool = False


def poly_decay(cfg: PolyDecayConfig) -> Any:
    """``(lr_w - min_lr) * (1 - min(t, D)/D)^power + min_lr``, ``t = step - begin``."""
    import tensorflow as tf

    begin = max(cfg.begin_decay_at, cfg.warmup_steps) if cfg.decay_after_warmup \
        else cfg.begin_decay_at

    def schedule(step: Any) -> Any:
        s = _f(step)
        lr_w = _warmup(cfg.learning_rate, s, cfg.warmup_steps)
        t = tf.minimum(tf.maximum(s - begin, 0.0), float(cfg.decay_steps))
        decayed = (lr_w - cfg.min_lr) * tf.pow(1 - t / cfg.decay_steps, cfg.power) + cfg.min_lr
        return tf.where(s < begin, lr_w, decayed)

    return schedule


def cosine_decay(cfg: PolyDecayConfig) -> Any:
    """``lr_w * ((1 - a) * 0.5 * (1 + cos(pi * min(t, D)/D)) + a)`` with ``a = min_lr``."""
    import tensorflow as tf

    def schedule(step: Any) -> Any:
        s = _f(step)
        lr_w = _warmup(cfg.learning_rate, s, cfg.warmup_steps)
        t = tf.minimum(tf.maximum(s - cfg.begin_decay_at, 0.0), float(cfg.decay_steps))
        cosine = 0.5 * (1 + tf.cos(math.pi * t / cfg.decay_steps))
        if cfg.absolute_min_lr:
            decayed = (lr_w - cfg.min_lr) * cosine + cfg.min_lr
        else:
            a = cfg.min_lr
            decayed = lr_w * ((1 - a) * cosine + a)
        return tf.where(s < cfg.begin_decay_at, lr_w, decayed)

    return schedule


@attrs.frozen(kw_only=True)
class TransformerConfig:
    """Config of ``transformer_policy``.

    Attributes:
        learning_rate: overall multiplier.
        d_model: model width.
        warmup_steps: steps of linear increase.
        max_lr: optional ceiling.
        coefficient: an extra multiplier.
    """

    example: ClassVar[dict] = {"learning_rate": 2.0, "d_model": 512, "warmup_steps": 100}

    learning_rate: float = attrs.field(validator=non_negative())
    d_model: int = attrs.field(validator=positive())
    warmup_steps: int = attrs.field(validator=positive())
    max_lr: float | None = attrs.field(default=None, validator=positive())
    coefficient: float = 1.0


def transformer_policy(cfg: TransformerConfig) -> Any:
    """``lr * coef * d^-0.5 * min(s * warmup^-1.5, s^-0.5)``, ``s = step + 1``."""
    import tensorflow as tf

    def schedule(step: Any) -> Any:
        s = _f(step) + 1
        out = (cfg.learning_rate * cfg.coefficient * cfg.d_model ** -0.5
               * tf.minimum(s * cfg.warmup_steps ** -1.5, tf.math.rsqrt(s)))
        return out if cfg.max_lr is None else tf.minimum(cfg.max_lr, out)

    return schedule


@attrs.frozen(kw_only=True)
class InvPolyConfig:
    """Config of ``inv_poly_decay``.

    Attributes:
        learning_rate: the value at step 0.
        decay_steps: the step at which the value reaches ``min_lr``.
        min_lr: the value at ``decay_steps`` (clamped to [1e-8, learning_rate]).
        power: exponent, > 0.
        begin_decay_at: ignored by the reference; used with ``apply_warmup``.
        warmup_steps: ignored by the reference; used with ``apply_warmup``.
        apply_warmup: honour ``warmup_steps`` and ``begin_decay_at`` as
            ``poly_decay`` does (corrects the reference).
    """

    example: ClassVar[dict] = {"learning_rate": 0.1, "decay_steps": 100, "min_lr": 0.001}

    learning_rate: float = attrs.field(validator=positive())
    decay_steps: int = attrs.field(validator=positive())
    min_lr: float = attrs.field(validator=non_negative())
    power: float = attrs.field(default=1.0)
    begin_decay_at: int = attrs.field(default=0, validator=non_negative())
    warmup_steps: int = attrs.field(default=0, validator=non_negative())
    apply_warmup: bool = False

    @power.validator
    def _power(self, attribute: Any, value: float) -> None:
        if value <= 0:
            raise ValueError(f"Inv poly decay requires power > 0, got {value}")


def inv_poly_decay(cfg: InvPolyConfig) -> Any:
    """``lr / (1 + c * step)^power`` with ``c`` chosen so step ``D`` gives ``min_lr``."""
    import tensorflow as tf

    min_lr = min(max(cfg.min_lr, 1e-8), cfg.learning_rate)
    c = ((cfg.learning_rate / min_lr) ** (1 / cfg.power) - 1) / cfg.decay_steps

    def schedule(step: Any) -> Any:
        s = _f(step)
        if not cfg.apply_warmup:
            return cfg.learning_rate / tf.pow(1 + c * s, cfg.power)
        lr_w = _warmup(cfg.learning_rate, s, cfg.warmup_steps)
        begin = max(cfg.begin_decay_at, cfg.warmup_steps)
        t = tf.maximum(s - begin, 0.0)
        return tf.where(s < begin, lr_w, lr_w / tf.pow(1 + c * t, cfg.power))

    return schedule


@hookimpl
def gradpipe_register_schedules(register: Any) -> None:
    register("piecewise_constant", piecewise_constant, PiecewiseConfig)
    register("exp_decay", exp_decay, ExpDecayConfig)
    register("poly_decay", poly_decay, PolyDecayConfig)
    register("cosine_decay", cosine_decay, PolyDecayConfig)
    register("transformer_policy", transformer_policy, TransformerConfig)
    register("inv_poly_decay", inv_poly_decay, InvPolyConfig)
