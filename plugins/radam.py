"""``radam``: optax's ``radam``, Rectified Adam (Liu et al. 2020, arXiv:1908.03265).

While the second moment has seen too few steps for its variance to be
trusted, the step is the bias-corrected first moment alone (SGD with
momentum); after that, Adam's step times the rectification
``r = sqrt((rho - 4)(rho - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho))``,
where ``rho_inf = 2 / (1 - b2) - 1`` and ``rho = rho_inf - 2 t b2^t / (1 - b2^t)``.
The switch happens once ``rho`` reaches ``threshold`` (the 6th step at optax's
defaults).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from gradpipe.plugin import Capabilities, Transform, at_least, hookimpl, hyper, non_negative
from gradpipe.plugins.optax_family import (
    MomentsConfig,
    MomentsState,
    correction,
    debiased,
    first_moment,
    moment,
    moments_rule,
)


@attrs.frozen(kw_only=True)
class RAdamConfig(MomentsConfig):
    """Config of ``radam``, with optax's defaults.

    Attributes:
        epsilon_root: added to the second moment under the root (``eps_root``).
        threshold: the value of ``rho`` from which the step is rectified Adam's;
            at least 4: below, ``r`` is the root of a negative number (optax's
            steps become NaN there).
        nesterov: Nesterov's first moment, as optax's ``nesterov = True``.
    """

    example: ClassVar[dict] = {"learning_rate": 0.005}

    epsilon_root: float = attrs.field(default=0.0, validator=non_negative())
    threshold: float = attrs.field(default=5.0, validator=at_least(4.0))
    nesterov: bool = False


def radam(cfg: RAdamConfig) -> Transform:
    """optax ``radam``: momentum until the variance is tractable, then rectified Adam."""
    beta_1, beta_2 = hyper(cfg.beta_1), hyper(cfg.beta_2)

    def rectification(count: Any) -> tuple[Any, Any]:
        """Whether this step is rectified, and ``r``: float32 scalars, as optax
        computes them under ``jax.jit``. ``rho`` is the difference of two nearly
        equal numbers (1999 and 1993 at the 6th step of the defaults): one
        rounding of ``b2 ** t`` moves ``r`` by 0.6% there, as eager JAX's
        rounding of it moves optax's own."""
        import tensorflow as tf

        constant = beta_2.constant
        # optax computes rho_inf from its Python float; in float32 it would differ
        rho_inf = (2.0 / (1.0 - constant) - 1.0 if constant is not None
                   else 2.0 / (1.0 - beta_2()) - 1.0)
        t = tf.cast(count, tf.float32)
        power = tf.pow(beta_2(), t)
        rho = rho_inf - 2.0 * t * power / (1.0 - power)
        ratio = (rho - 4.0) * (rho - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0)
                                                       * rho)
        # r is only used from rho >= threshold >= 4; the clamp keeps the others finite
        return rho >= cfg.threshold, tf.sqrt(tf.maximum(ratio, 0.0))

    def advance(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        return moment(g, slots[0], beta_1), moment(tf.square(g), slots[1], beta_2)

    def direction(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m_hat = first_moment(slots[0], g, beta_1, count, cfg.nesterov)
        v_hat = debiased(slots[1], correction(beta_2, count))
        rectified, r = rectification(count)
        adam = tf.cast(r, m_hat.dtype) * m_hat / (tf.sqrt(v_hat + cfg.epsilon_root)
                                                  + cfg.epsilon)
        return tf.where(rectified, adam, m_hat)

    return moments_rule(cfg, MomentsState, (0.0, 0.0), advance, direction)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("radam", radam, RAdamConfig, capabilities=Capabilities(update_rule=True))
