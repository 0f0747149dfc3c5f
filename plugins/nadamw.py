"""``nadamw``: optax's ``nadamw``, Adam with Nesterov's momentum (Dozat 2016) and
decoupled weight decay (Loshchilov and Hutter 2019).

This is optax's Nesterov Adam, which differs from ``nadam`` (Keras's, with its
momentum schedule ``beta_1 (1 - 0.5 * 0.96^(0.004 t))``): the first moment is
``b1 m / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t)``, then
``var -= lr * (m_hat / (sqrt(v_hat + epsilon_root) + epsilon) + weight_decay * var)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from gradpipe.plugin import Capabilities, Transform, hookimpl, hyper, non_negative
from gradpipe.plugins.optax_family import (
    DecayedMomentsConfig,
    MomentsState,
    correction,
    debiased,
    first_moment,
    moment,
    moments_rule,
)


@attrs.frozen(kw_only=True)
class NAdamWConfig(DecayedMomentsConfig):
    """Config of ``nadamw``, with optax's defaults.

    Attributes:
        epsilon_root: added to the second moment under the root (``eps_root``).
        nesterov: Nesterov's first moment; ``false`` is optax's ``adamw`` exactly
            (optax's ``nadamw`` is its ``adamw(nesterov=True)``; gradpipe's
            ``adamw`` is Keras's, whose ``epsilon`` comes before the bias correction).
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    epsilon_root: float = attrs.field(default=0.0, validator=non_negative())
    nesterov: bool = True


def nadamw(cfg: NAdamWConfig) -> Transform:
    """optax ``nadamw``: Nesterov Adam with decoupled weight decay."""
    beta_1, beta_2 = hyper(cfg.beta_1), hyper(cfg.beta_2)

    def advance(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        return moment(g, slots[0], beta_1), moment(tf.square(g), slots[1], beta_2)

    def direction(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m_hat = first_moment(slots[0], g, beta_1, count, nesterov=cfg.nesterov)
        v_hat = debiased(slots[1], correction(beta_2, count))
        return m_hat / (tf.sqrt(v_hat + cfg.epsilon_root) + cfg.epsilon)

    return moments_rule(cfg, MomentsState, (0.0, 0.0), advance, direction)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("nadamw", nadamw, NAdamWConfig, capabilities=Capabilities(update_rule=True))
