"""OpenSeq2Seq's automatic loss scalers: ``backoff`` and ``logmax``.

Both follow NVIDIA/OpenSeq2Seq ``optimizers/automatic_loss_scaler.py`` at its
current source (defaults ``scale_max = 2**14``). They see unscaled gradients;
a step with NaN or Inf is skipped by the pipeline, as the reference's
``MixedPrecisionOptimizerWrapper`` skips it.
"""

from __future__ import annotations

from typing import Any

import attrs

from gradpipe.plugin import (
    FieldError,
    at_least,
    greater_than,
    hookimpl,
    positive,
)


def _overflow_and_amax(grads: Any) -> tuple[Any, Any]:
    """(has NaN or Inf, max |g|) over all non-None gradients (IndexedSlices: values)."""
    import tensorflow as tf

    values = [tf.cast(g.values if isinstance(g, tf.IndexedSlices) else g, tf.float32)
              for g in tf.nest.flatten(grads) if g is not None]
    if not values:
        return tf.constant(False), tf.constant(0.0)
    has_nan = tf.reduce_any(tf.stack([tf.reduce_any(tf.math.is_nan(v)) for v in values]))
    amax = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(v)) for v in values]))
    return tf.logical_or(has_nan, tf.math.is_inf(amax)), amax


def _check_range(cfg: Any) -> None:
    if cfg.scale_max < cfg.scale_min:
        raise FieldError("scale_max",
                         f"must be >= scale_min ({cfg.scale_min}), got {cfg.scale_max}")


@attrs.frozen(kw_only=True)
class BackoffConfig:
    """Config of ``backoff``.

    Attributes:
        scale_min: smallest scale.
        scale_max: largest scale, and the starting scale.
        step_factor: divide by it on overflow, multiply by it to grow (> 1).
        step_window: grow every ``step_window`` steps since the last overflow.
    """

    scale_min: float = attrs.field(default=1.0, validator=positive())
    scale_max: float = attrs.field(default=2.0**14, validator=positive())
    step_factor: float = attrs.field(default=2.0, validator=greater_than(1.0))
    step_window: int = attrs.field(default=2000, validator=at_least(1))


    def __attrs_post_init__(self) -> None:
        _check_range(self)


def backoff(cfg: BackoffConfig) -> Any:
    """OpenSeq2Seq Backoff: halve on overflow, grow every window since the last overflow."""
    import tensorflow as tf

    class BackoffScaler(tf.Module):
        def __init__(self) -> None:
            super().__init__(name="backoff_loss_scale")
            self.config = cfg
            self.scale = tf.Variable(cfg.scale_max, dtype=tf.float32, trainable=False,
                                     name="scale")
            self.iteration = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="iteration")
            self.last_overflow = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                             name="last_overflow")

        def __call__(self) -> Any:
            return tf.convert_to_tensor(self.scale)

        def update(self, grads: Any) -> Any:
            overflow, _ = _overflow_and_amax(grads)
            k = self.iteration.read_value()  # pre-increment, pinned in our spec
            scale = self.scale.read_value()
            grow = tf.equal((k - self.last_overflow) % cfg.step_window, 0)
            new_scale = tf.where(overflow, scale / cfg.step_factor,
                                 tf.where(grow, scale * cfg.step_factor, scale))
            ops = [self.scale.assign(tf.clip_by_value(new_scale, cfg.scale_min,
                                                      cfg.scale_max)),
                   self.last_overflow.assign(tf.where(overflow, k, self.last_overflow)),
                   self.iteration.assign(k + 1)]
            return tf.group(ops), tf.logical_not(overflow)

        def get_config(self) -> dict[str, Any]:
            return attrs.asdict(cfg)

        @classmethod
        def from_config(cls, config: dict[str, Any]) -> Any:
            return backoff(BackoffConfig(**config))

    return BackoffScaler()


@attrs.frozen(kw_only=True)
class LogMaxConfig:
    """Config of ``logmax``.

    Attributes:
        scale_min: smallest scale.
        scale_max: largest scale.
        log_max: log2 of the largest representable gradient (16 for fp16).
        beta1: decay of the running mean of log2(max |g|).
        beta2: decay of the running variance.
        overflow_std_dev: standard deviations of headroom below overflow.
        corrected: fix the reference's bugs (see the mixed-precision page):
            an overflow counts as ``log_max`` rather than ``2**log_max``, the
            target is ``log_max`` rather than the literal 16, and an all-zero
            gradient leaves the statistics alone instead of poisoning them.
    """

    scale_min: float = attrs.field(default=1.0, validator=positive())
    scale_max: float = attrs.field(default=2.0**14, validator=positive())
    log_max: float = attrs.field(default=16.0, validator=positive())
    beta1: float = attrs.field(default=0.99, validator=greater_than(0.0))
    beta2: float = attrs.field(default=0.999, validator=greater_than(0.0))
    overflow_std_dev: float = attrs.field(default=3.09, validator=positive())
    corrected: bool = False


    def __attrs_post_init__(self) -> None:
        _check_range(self)
        for key in ("beta1", "beta2"):
            if getattr(self, key) >= 1:
                raise FieldError(key, f"must be < 1, got {getattr(self, key)}")


def logmax(cfg: LogMaxConfig) -> Any:
    """OpenSeq2Seq LogMax: scale from running statistics of log2(max |g|)."""
    import tensorflow as tf

    class LogMaxScaler(tf.Module):
        def __init__(self) -> None:
            super().__init__(name="logmax_loss_scale")
            self.config = cfg

            def var(value: float, name: str) -> tf.Variable:
                return tf.Variable(value, dtype=tf.float32, trainable=False, name=name)

            self.scale = var(1.0, "scale")
            self.x_hat = var(0.0, "x_hat")
            self.slow_x_hat = var(0.0, "slow_x_hat")
            self.xsquared_hat = var(0.0, "xsquared_hat")
            self.b1_correction = var(1.0, "b1_correction")
            self.b2_correction = var(1.0, "b2_correction")

        def __call__(self) -> Any:
            return tf.convert_to_tensor(self.scale)

        def update(self, grads: Any) -> Any:
            overflow, amax = _overflow_and_amax(grads)
            if cfg.corrected:
                x = tf.where(overflow, cfg.log_max, tf.math.log(amax) / tf.math.log(2.0))
                target = cfg.log_max
                # log2(0) = -inf would poison every statistic for good: keep them.
                keep = tf.logical_and(tf.logical_not(overflow), tf.equal(amax, 0.0))
            else:
                x = tf.where(overflow, 2.0**cfg.log_max,
                             tf.math.log(amax) / tf.math.log(2.0))
                target = 16.0
                keep = tf.constant(False)
            b1, b2 = cfg.beta1, cfg.beta2
            x_hat = b1 * self.x_hat + (1 - b1) * x
            c1 = self.b1_correction * b1
            slow = b2 * self.slow_x_hat + (1 - b2) * x
            sq = b2 * self.xsquared_hat + (1 - b2) * tf.square(x)
            c2 = self.b2_correction * b2
            mu = x_hat / (1 - c1)
            sigma = tf.sqrt(tf.maximum(sq / (1 - c2) - tf.square(slow / (1 - c2)), 0.0))
            scale = tf.clip_by_value(tf.pow(2.0, target - (mu + cfg.overflow_std_dev * sigma)),
                                     cfg.scale_min, cfg.scale_max)
            pairs = [(self.x_hat, x_hat), (self.b1_correction, c1), (self.slow_x_hat, slow),
                     (self.xsquared_hat, sq), (self.b2_correction, c2), (self.scale, scale)]
            ops = [v.assign(tf.where(keep, v, new)) for v, new in pairs]
            return tf.group(ops), tf.logical_not(overflow)

        def get_config(self) -> dict[str, Any]:
            return attrs.asdict(cfg)

        @classmethod
        def from_config(cls, config: dict[str, Any]) -> Any:
            return logmax(LogMaxConfig(**config))

    return LogMaxScaler()


@hookimpl
def gradpipe_register_loss_scalers(register: Any) -> None:
    register("backoff", backoff, BackoffConfig)
    register("logmax", logmax, LogMaxConfig)
