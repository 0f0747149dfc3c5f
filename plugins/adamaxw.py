"""``adamaxw``: optax's ``adamaxw``, Adamax (Kingma and Ba 2015, section 7) with
decoupled weight decay.

optax's Adamax differs from ``adamax`` (Keras's) in where ``epsilon`` goes: the
infinity norm is ``u = max(|g| + epsilon, b2 u)`` and the step ``m_hat / u``,
where Keras divides by ``u + epsilon``. Then
``var -= lr * (m_hat / u + weight_decay * var)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from gradpipe.plugin import Capabilities, Transform, hookimpl, hyper, hyperparameter, in_range
from gradpipe.plugins.optax_family import (
    DecayedMomentsConfig,
    MomentsState,
    correction,
    debiased,
    moment,
    moments_rule,
)


@attrs.frozen(kw_only=True)
class AdamaxWConfig(DecayedMomentsConfig):
    """Config of ``adamaxw``, with optax's defaults.

    Attributes:
        beta_2: decay of the infinity norm, in [0, 1].
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    beta_2: Any = hyperparameter(default=0.999, validator=in_range(0.0, 1.0))


def adamaxw(cfg: AdamaxWConfig) -> Transform:
    """optax ``adamaxw``: Adamax with ``epsilon`` inside the max, and weight decay."""
    beta_1, beta_2 = hyper(cfg.beta_1), hyper(cfg.beta_2)

    def advance(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m, u = slots
        return (moment(g, m, beta_1),
                tf.maximum(tf.abs(g) + cfg.epsilon, tf.cast(beta_2(), u.dtype) * u))

    def direction(g: Any, slots: Any, count: Any) -> Any:
        # m / u first: it stays within (1 - beta_1) / (1 - beta_1 / beta_2) whatever the
        # gradients were, where optax's m / (1 - beta_1**t) first could overflow
        return debiased(slots[0] / slots[1], correction(beta_1, count))

    return moments_rule(cfg, MomentsState, (0.0, 0.0), advance, direction)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("adamaxw", adamaxw, AdamaxWConfig, capabilities=Capabilities(update_rule=True))
