"""TF Addons' cyclical learning rates (Smith, "Cyclical Learning Rates for
Training Neural Networks", arXiv:1506.01186), configured as TF Addons serializes
them.

``TriangularCyclicalLearningRate``, ``Triangular2CyclicalLearningRate`` and
``ExponentialCyclicalLearningRate`` are named after their
``tfa.optimizers`` classes and take the keys of their ``get_config()`` with TF
Addons' defaults, plus ``name``. With ``s`` the step, ``S`` = ``step_size``,
``lr0`` = ``initial_learning_rate`` and ``lr1`` = ``maximal_learning_rate``,
``tfa.optimizers.CyclicalLearningRate.__call__`` computes::

    cycle = floor(1 + s / (2 S))        # 1 for the first 2 S steps, then 2, ...
    x     = |s / S - 2 cycle + 1|       # 1 at a cycle's start and end, 0 at its peak
    m     = cycle if scale_mode == "cycle" else s
    lr    = lr0 + (lr1 - lr0) * max(0, 1 - x) * scale_fn(m)

a triangle from ``lr0`` up to ``lr1`` in ``S`` steps and back in ``S`` more,
its height scaled by ``scale_fn``: 1 (``Triangular``), ``1 / 2 ^ (m - 1)``
(``Triangular2``: halved every cycle) or ``gamma ^ m`` (``Exponential``),
``m`` being the cycle (1, 2, ...) or the step, as ``scale_mode`` says. Each
computes in float32 with TF Addons' operations in its order, inside
``tf.name_scope(name)``, elementwise over a step tensor of any shape: eagerly,
TF Addons' float32 values bit for bit. (In a ``tf.function`` TensorFlow's
graph optimizer rewrites ``s / S`` as ``s * (1 / S)`` and regroups ``x``, here
as in TF Addons' graph of the same operations: one rounding of ``s / S`` apart.)

The generic ``tfa.optimizers.CyclicalLearningRate`` takes ``scale_fn``, an
arbitrary Python callable, which a TOML file cannot hold: it has no component
here. A ``scale_fn`` equal to one of the three above is that subclass; any other
needs a schedule plugin of its own (``gradpipe_register_schedules``).

Departures from TF Addons, each deliberate:

* In ``"iterations"`` mode TF Addons hands ``scale_fn`` the step as it was
  given, uncast: an int64 step, which Keras's optimizers pass, makes
  ``Triangular2`` and ``Exponential`` raise ``TypeError`` (TF Addons issues
  #2593, #2799; the fix of PR #2756 was never merged). Here ``scale_fn`` gets
  the float32 step, as in that fix, so ``gamma ^ s`` is float32's
  ``pow(float32(gamma), s)``, which is TF Addons' own value for a float32 step.
  (With a Python int step, as in TF Addons' tests, ``gamma ** s`` is a float64
  power: relatively up to ``s * 2^-24`` apart on the scaled part.)
* TF Addons computes in the dtype of ``initial_learning_rate``; a Python int
  there (``0``) makes it fail. Here every number is a float32 constant.
* ``name`` is a key. TF Addons' ``get_config()`` leaves it out, so its own
  round trip loses the name; a pasted ``get_config()`` gets the default name,
  the class's, as TF Addons does.
* ``scale_mode`` must be ``"cycle"`` or ``"iterations"`` (TF Addons reads any
  string but ``"cycle"`` as ``"iterations"``); learning rates and ``gamma``
  must be >= 0 (a negative ``gamma`` puts every other cycle (or step) below
  ``initial_learning_rate``, negative for a large amplitude); learning rates
  are numbers (TF Addons also takes tensors and callables).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import attrs

from gradpipe.plugin import hookimpl, non_negative, one_of
from gradpipe.plugins.keras_schedules import as_float, f32, learning_rate, name_field, steps

ScaleMode = Literal["cycle", "iterations"]


def scale_mode_field(default: ScaleMode) -> Any:
    """``scale_mode``: what ``scale_fn`` is a function of, the cycle or the step."""
    return attrs.field(default=default, validator=one_of("cycle", "iterations"))


@attrs.frozen(kw_only=True)
class TriangularCyclicalLearningRateConfig:
    """Config of ``TriangularCyclicalLearningRate`` (the ``tfa.optimizers`` class).

    Attributes:
        initial_learning_rate: the value at step 0 and at the start of every cycle.
        maximal_learning_rate: the value at the peak of every cycle, ``step_size``
            steps after its start.
        step_size: half a cycle: the steps from ``initial_learning_rate`` to
            ``maximal_learning_rate``, and as many back.
        scale_mode: ``cycle`` or ``iterations``; the scale is 1 in either, so it
            changes nothing (kept as TF Addons keeps it).
        name: TF Addons' name, the name scope of the schedule's ops.
    """

    example: ClassVar[dict] = {"initial_learning_rate": 0.001,
                               "maximal_learning_rate": 0.01, "step_size": 100}

    initial_learning_rate: float = learning_rate()
    maximal_learning_rate: float = learning_rate()
    step_size: int | float = steps()
    scale_mode: ScaleMode = scale_mode_field("cycle")
    name: str = name_field("TriangularCyclicalLearningRate")


@attrs.frozen(kw_only=True)
class Triangular2CyclicalLearningRateConfig:
    """Config of ``Triangular2CyclicalLearningRate`` (the ``tfa.optimizers`` class).

    Attributes:
        initial_learning_rate: the value at step 0 and at the start of every cycle.
        maximal_learning_rate: the value at the peak of the first cycle; each
            later peak is half as far above ``initial_learning_rate``.
        step_size: half a cycle: the steps from the start of a cycle to its peak.
        scale_mode: ``cycle`` halves the height once per cycle; ``iterations``
            once per step (``1 / 2^(step - 1)``), which leaves little but
            ``initial_learning_rate`` after a few steps, as in TF Addons.
        name: TF Addons' name, the name scope of the schedule's ops.
    """

    example: ClassVar[dict] = {"initial_learning_rate": 0.001,
                               "maximal_learning_rate": 0.01, "step_size": 100}

    initial_learning_rate: float = learning_rate()
    maximal_learning_rate: float = learning_rate()
    step_size: int | float = steps()
    scale_mode: ScaleMode = scale_mode_field("cycle")
    name: str = name_field("Triangular2CyclicalLearningRate")


@attrs.frozen(kw_only=True)
class ExponentialCyclicalLearningRateConfig:
    """Config of ``ExponentialCyclicalLearningRate`` (the ``tfa.optimizers`` class).

    Attributes:
        initial_learning_rate: the value at step 0 and at the start of every cycle.
        maximal_learning_rate: the value the first peak would have without the
            decay; the height above ``initial_learning_rate`` is scaled by
            ``gamma ^ step`` (or ``gamma ^ cycle``).
        step_size: half a cycle: the steps from the start of a cycle to its peak.
        scale_mode: ``iterations`` (TF Addons' default here) scales by
            ``gamma ^ step``; ``cycle`` by ``gamma ^ cycle``, cycles counted from 1.
        gamma: the factor of the height per step (or per cycle), >= 0.
        name: TF Addons' name, the name scope of the schedule's ops.
    """

    example: ClassVar[dict] = {"initial_learning_rate": 0.001,
                               "maximal_learning_rate": 0.01, "step_size": 100,
                               "gamma": 0.999}

    initial_learning_rate: float = learning_rate()
    maximal_learning_rate: float = learning_rate()
    step_size: int | float = steps()
    scale_mode: ScaleMode = scale_mode_field("iterations")
    gamma: float = attrs.field(default=1.0, validator=non_negative())
    name: str = name_field("ExponentialCyclicalLearningRate")


AnyConfig = (TriangularCyclicalLearningRateConfig | Triangular2CyclicalLearningRateConfig
             | ExponentialCyclicalLearningRateConfig)


def cyclical(cfg: AnyConfig, scale_fn: Callable[[Any], Any] | None) -> Any:
    """TF Addons' ``CyclicalLearningRate.__call__``; ``scale_fn`` None is a scale of 1."""
    import tensorflow as tf

    def schedule(step: Any) -> Any:
        with tf.name_scope(cfg.name):
            initial = f32(cfg.initial_learning_rate)
            maximal = f32(cfg.maximal_learning_rate)
            step_size = f32(cfg.step_size)
            s = as_float(step)
            cycle = tf.floor(1 + s / (2 * step_size))
            x = tf.abs(s / step_size - 2 * cycle + 1)
            # TF Addons' order: ((lr1 - lr0) * max(0, 1 - x)) * scale, then + lr0.
            lr = (maximal - initial) * tf.maximum(f32(0.0), 1 - x)
            if scale_fn is not None:  # TF Addons' `* 1.0` for Triangular: exact, left out
                # The float32 step, not the step as given (see the module docstring).
                lr = lr * scale_fn(cycle if cfg.scale_mode == "cycle" else s)
            return initial + lr

    return schedule


def triangular_cyclical_learning_rate(cfg: TriangularCyclicalLearningRateConfig) -> Any:
    """A triangle between ``initial_learning_rate`` and ``maximal_learning_rate``."""
    return cyclical(cfg, None)


def triangular2_cyclical_learning_rate(cfg: Triangular2CyclicalLearningRateConfig) -> Any:
    """The triangle, its height halved every cycle (or every step)."""
    import tensorflow as tf

    # TF Addons' `1 / (2.0 ** (m - 1))`: powers of two, exact in float32 (the
    # power overflows to inf from step 129 on in "iterations" mode, and 1 / inf = 0).
    return cyclical(cfg, lambda m: 1.0 / tf.pow(f32(2.0), m - 1))


def exponential_cyclical_learning_rate(cfg: ExponentialCyclicalLearningRateConfig) -> Any:
    """The triangle, its height scaled by ``gamma ^ step`` (or ``gamma ^ cycle``)."""
    import tensorflow as tf

    # TF Addons' `gamma ** m` on a float32 tensor: pow with gamma rounded to float32.
    return cyclical(cfg, lambda m: tf.pow(f32(cfg.gamma), m))


@hookimpl
def gradpipe_register_schedules(register: Any) -> None:
    register("TriangularCyclicalLearningRate", triangular_cyclical_learning_rate,
             TriangularCyclicalLearningRateConfig)
    register("Triangular2CyclicalLearningRate", triangular2_cyclical_learning_rate,
             Triangular2CyclicalLearningRateConfig)
    register("ExponentialCyclicalLearningRate", exponential_cyclical_learning_rate,
             ExponentialCyclicalLearningRateConfig)
