"""``yogi``: optax's ``yogi`` (Zaheer et al. 2018, "Adaptive Methods for
Nonconvex Optimization").

Adam whose second moment moves additively, by at most ``(1 - b2) g^2`` a step:
``v -= (1 - b2) sign(v - g^2) g^2``, so one large gradient cannot inflate it.
Both moments start at ``initial_accumulator_value``, as in optax.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from gradpipe.plugin import Capabilities, Transform, hookimpl, hyper, non_negative, one_minus
from gradpipe.plugins.optax_family import (
    MomentsConfig,
    MomentsState,
    correction,
    debiased,
    moment,
    moments_rule,
)


@attrs.frozen(kw_only=True)
class YogiConfig(MomentsConfig):
    """Config of ``yogi``, with optax's defaults.

    Attributes:
        epsilon: added to the root of the second moment (optax's ``eps``).
        initial_accumulator_value: the first and second moments' initial value.
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    epsilon: float = attrs.field(default=1e-3, validator=non_negative())
    initial_accumulator_value: float = attrs.field(default=1e-6, validator=non_negative())


def yogi(cfg: YogiConfig) -> Transform:
    """optax ``yogi``: Adam with an additive, sign-controlled second moment."""
    beta_1, beta_2 = hyper(cfg.beta_1), hyper(cfg.beta_2)

    def advance(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m, v = slots
        g2 = tf.square(g)
        # Never negative: where v > g^2 it loses (1 - b2) g^2 < v, which rounds to at
        # most g^2. The maximum changes no value; it lets the engine prove the root's
        # argument non-negative instead of checking every step again.
        return (moment(g, m, beta_1),
                tf.maximum(v - one_minus(beta_2, v.dtype) * tf.sign(v - g2) * g2, 0))

    def direction(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m, v = slots
        return (debiased(m, correction(beta_1, count))
                / (tf.sqrt(debiased(v, correction(beta_2, count))) + cfg.epsilon))

    fill = cfg.initial_accumulator_value
    return moments_rule(cfg, MomentsState, (fill, fill), advance, direction)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("yogi", yogi, YogiConfig, capabilities=Capabilities(update_rule=True))
