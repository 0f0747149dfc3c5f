"""Convergence criteria with the TFP ``ConvergenceCriterion`` interface.

``nonfinite`` (treeflow), ``loss_not_decreasing`` (TFP, batched parameters
included), ``successive_gradients_are_uncorrelated`` (TFP, with its
step-0 comparison fixed by default), ``gradient_norm_below`` and
``parameter_change_below``. Inputs may carry leading batch dimensions.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from gradpipe.plugin import (
    Criterion,
    FieldError,
    at_least,
    hookimpl,
    non_negative,
    positive,
)


def _global_sq_norm(tensors: list[Any]) -> Any:
    import tensorflow as tf

    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tensors])


@attrs.frozen(kw_only=True)
class NonfiniteConfig:
    """Config of ``nonfinite`` (no parameters): stop at the first NaN or Inf."""


class Nonfinite(Criterion):
    """treeflow ``NonfiniteConvergenceCriterion``: any NaN/Inf in loss, grads or parameters."""

    def __init__(self, cfg: NonfiniteConfig) -> None:
        super().__init__(min_num_steps=0, name="nonfinite")

    def _bootstrap(self, loss: Any, grads: Any, parameters: Any) -> Any:
        return ()  # treeflow returns None, which TFP's loop cannot carry

    def _one_step(self, step: Any, loss: Any, grads: Any, parameters: Any,
                  state: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        values = [loss, *(grads or []), *parameters]
        bad = [tf.reduce_any(~tf.math.is_finite(v)) for v in values]
        return tf.reduce_any(tf.stack(bad)), ()


@attrs.frozen(kw_only=True)
class LossNotDecreasingConfig:
    """Config of ``loss_not_decreasing`` (TFP ``LossNotDecreasing``).

    Attributes:
        atol: converged when the moving average decrease is below this (or a list,
            one per batch member).
        rtol: ... or below ``rtol`` times the average decrease over the first window.
        window_size: effective window of the moving average (or a list).
        min_num_steps: never converged before this step.
    """

    example: ClassVar[dict] = {"atol": 0.01}

    atol: float | tuple[float, ...] | None = None
    rtol: float | tuple[float, ...] | None = None
    window_size: float | tuple[float, ...] = 10.0
    min_num_steps: int = attrs.field(default=20, validator=non_negative())

    def __attrs_post_init__(self) -> None:
        if self.atol is None and self.rtol is None:
            raise FieldError("atol", "Must specify at least one of `atol` and `rtol`")
        sizes = self.window_size if isinstance(self.window_size, tuple) \
            else (self.window_size,)
        if any(w < 1 for w in sizes):
            raise FieldError("window_size", f"must be >= 1, got {self.window_size!r}")


class LossNotDecreasing(Criterion):
    """TFP: converged when the moving-average loss decrease falls below the tolerance."""

    def __init__(self, cfg: LossNotDecreasingConfig) -> None:
        super().__init__(min_num_steps=cfg.min_num_steps, name="loss_not_decreasing")
        self.config = cfg

    def _bootstrap(self, loss: Any, grads: Any, parameters: Any) -> Any:
        import tensorflow as tf

        return (loss, tf.zeros_like(loss), tf.zeros_like(loss))

    def _one_step(self, step: Any, loss: Any, grads: Any, parameters: Any,
                  state: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        cfg = self.config
        previous, average, initial = state
        atol = tf.constant(cfg.atol if cfg.atol is not None else 0.0, loss.dtype)
        rtol = tf.constant(cfg.rtol if cfg.rtol is not None else 0.0, loss.dtype)
        window = tf.constant(cfg.window_size, loss.dtype)
        decay = 1.0 - 1.0 / window
        decrease = previous - loss
        average = decrease + decay * (average - decrease)
        converged = average < tf.maximum(atol, rtol * initial)
        initial = tf.where(tf.cast(step, loss.dtype) <= window, average, initial)
        return converged, (loss, average, initial)


@attrs.frozen(kw_only=True)
class SuccessiveGradientsConfig:
    """Config of ``successive_gradients_are_uncorrelated``.

    Attributes:
        window_size: effective window of the moving average inner product.
        min_num_steps: never converged before this step.
        compare_with_initial: reproduce TFP 0.25, which compares every step's
            gradients with the step-0 gradients instead of the previous step's.
    """

    window_size: float = attrs.field(default=10.0, validator=at_least(1.0))
    min_num_steps: int = attrs.field(default=20, validator=non_negative())
    compare_with_initial: bool = False


class SuccessiveGradientsAreUncorrelated(Criterion):
    """Converged when the moving average of <g_prev, g> turns negative (Pflug 1990)."""

    def __init__(self, cfg: SuccessiveGradientsConfig) -> None:
        super().__init__(min_num_steps=cfg.min_num_steps,
                         name="successive_gradients_are_uncorrelated")
        self.config = cfg

    def _bootstrap(self, loss: Any, grads: Any, parameters: Any) -> Any:
        import tensorflow as tf

        return (list(grads), tf.zeros([], loss.dtype))

    def _one_step(self, step: Any, loss: Any, grads: Any, parameters: Any,
                  state: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        previous, moving = state
        decay = 1.0 - 1.0 / tf.constant(self.config.window_size, loss.dtype)
        inner = tf.add_n([tf.reduce_sum(tf.cast(a * b, loss.dtype))
                          for a, b in zip(previous, grads)])
        moving = inner + decay * (moving - inner)
        keep = previous if self.config.compare_with_initial else list(grads)
        return moving < 0.0, (keep, moving)


@attrs.frozen(kw_only=True)
class ToleranceConfig:
    """Config of ``gradient_norm_below`` and ``parameter_change_below``.

    Attributes:
        tolerance: converged when the global L2 norm is below this.
        min_num_steps: never converged before this step.
    """

    example: ClassVar[dict] = {"tolerance": 1e-3}

    tolerance: float = attrs.field(validator=positive())
    min_num_steps: int = attrs.field(default=0, validator=non_negative())


class GradientNormBelow(Criterion):
    """Converged when the global gradient norm is below ``tolerance``."""

    def __init__(self, cfg: ToleranceConfig) -> None:
        super().__init__(min_num_steps=cfg.min_num_steps, name="gradient_norm_below")
        self.tolerance = cfg.tolerance

    def _bootstrap(self, loss: Any, grads: Any, parameters: Any) -> Any:
        return ()

    def _one_step(self, step: Any, loss: Any, grads: Any, parameters: Any,
                  state: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        return tf.sqrt(_global_sq_norm(grads)) < self.tolerance, ()


class ParameterChangeBelow(Criterion):
    """Converged when the parameters moved less than ``tolerance`` (global L2) in a step."""

    def __init__(self, cfg: ToleranceConfig) -> None:
        super().__init__(min_num_steps=cfg.min_num_steps, name="parameter_change_below")
        self.tolerance = cfg.tolerance

    def _bootstrap(self, loss: Any, grads: Any, parameters: Any) -> Any:
        return list(parameters)

    def _one_step(self, step: Any, loss: Any, grads: Any, parameters: Any,
                  state: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        change = tf.sqrt(_global_sq_norm([p - q for p, q in zip(parameters, state)]))
        return change < self.tolerance, list(parameters)


@hookimpl
def gradpipe_register_convergence_criteria(register: Any) -> None:
    register("nonfinite", Nonfinite, NonfiniteConfig)
    register("loss_not_decreasing", LossNotDecreasing, LossNotDecreasingConfig)
    register("successive_gradients_are_uncorrelated", SuccessiveGradientsAreUncorrelated,
             SuccessiveGradientsConfig)
    register("gradient_norm_below", GradientNormBelow, ToleranceConfig)
    register("parameter_change_below", ParameterChangeBelow, ToleranceConfig)
