"""``rprop``: optax's ``rprop``, resilient backpropagation (Riedmiller and Braun
1993, iRprop-).

Each element keeps its own step size, started at ``learning_rate``: where the
gradient keeps its sign the step grows by ``eta_plus``, where it flips it
shrinks by ``eta_minus`` and that element does not move this step (nor counts
as a sign next step); the step sizes stay in ``[min_step_size,
max_step_size]``. The update is ``step_size * sign(g)``: the gradient's size
never enters, so no learning rate scales it afterwards.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import Capabilities, Transform, hookimpl, non_negative, positive
from gradpipe.plugins.optax_family import moments_rule


@attrs.frozen(kw_only=True)
class RpropConfig:
    """Config of ``rprop``, with optax's defaults.

    Attributes:
        learning_rate: every element's first step size (a number: optax's is
            not a schedule either).
        eta_minus: factor of a step size where the gradient's sign flips.
        eta_plus: factor of a step size where it keeps its sign.
        min_step_size: the least step size.
        max_step_size: the largest step size.
        lazy: with a sparse gradient, update only the rows it touches, of the
            variable and of its step sizes.
    """

    example: ClassVar[dict] = {"learning_rate": 0.01}

    learning_rate: float = attrs.field(default=0.001, validator=positive())
    eta_minus: float = attrs.field(default=0.5, validator=non_negative())
    eta_plus: float = attrs.field(default=1.2, validator=non_negative())
    min_step_size: float = attrs.field(default=1e-6, validator=non_negative())
    max_step_size: float = attrs.field(default=50.0, validator=positive())
    lazy: bool = False


class RpropState(NamedTuple):
    count: Any
    step_sizes: list[Any]
    previous_steps: list[Any]


def rprop(cfg: RpropConfig) -> Transform:
    """optax ``rprop``: per-element step sizes that grow while the sign holds."""

    def advance(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        sizes, previous = slots
        agree = g * previous  # the sign of g against the last step's
        factor = tf.where(agree > 0, tf.constant(cfg.eta_plus, g.dtype),
                          tf.constant(cfg.eta_minus, g.dtype))
        sizes = tf.where(agree == 0, sizes, tf.clip_by_value(
            sizes * factor, cfg.min_step_size, cfg.max_step_size))
        return sizes, tf.where(agree < 0, tf.zeros_like(g), sizes * tf.sign(g))

    def direction(g: Any, slots: Any, count: Any) -> Any:
        return slots[1]

    return moments_rule(cfg, RpropState, (cfg.learning_rate, 0.0), advance, direction,
                        scaled=False)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("rprop", rprop, RpropConfig, capabilities=Capabilities(update_rule=True))
