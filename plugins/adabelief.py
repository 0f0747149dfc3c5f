"""``adabelief``: optax's ``adabelief`` (Zhuang et al. 2020, arXiv:2010.07468).

Adam whose second moment tracks the squared distance of the gradient from its
own running mean (the "belief" in the gradient) instead of the squared gradient:
``m = (1 - b1) g + b1 m``; ``s = (1 - b2) (g - m)^2 + b2 s + epsilon_root``;
``step = m_hat / (sqrt(s_hat) + epsilon)``, both moments bias-corrected. As in
optax, ``epsilon_root`` is added to the stored second moment every step.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from gradpipe.plugin import Capabilities, Transform, hookimpl, hyper, hyperparameter, non_negative
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
class AdaBeliefConfig(DecayedMomentsConfig):
    """Config of ``adabelief``, with optax's defaults.

    Attributes:
        epsilon: added to the root of the second moment (optax's ``eps``).
        epsilon_root: added to the second moment itself each step (``eps_root``).
        weight_decay: decoupled decay (optax's default: none).
        nesterov: Nesterov's first moment, as optax's ``nesterov = True``.
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    epsilon: float = attrs.field(default=1e-16, validator=non_negative())
    epsilon_root: float = attrs.field(default=1e-16, validator=non_negative())
    weight_decay: Any = hyperparameter(default=0.0, validator=non_negative())
    nesterov: bool = False


def adabelief(cfg: AdaBeliefConfig) -> Transform:
    """optax ``adabelief``: Adam over the variance of the gradient around its mean."""
    beta_1, beta_2 = hyper(cfg.beta_1), hyper(cfg.beta_2)

    def advance(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m = moment(g, slots[0], beta_1)
        error = g - m
        return m, moment(tf.square(error), slots[1], beta_2) + cfg.epsilon_root

    def direction(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m_hat = first_moment(slots[0], g, beta_1, count, cfg.nesterov)
        return m_hat / (tf.sqrt(debiased(slots[1], correction(beta_2, count)))
                        + cfg.epsilon)

    return moments_rule(cfg, MomentsState, (0.0, 0.0), advance, direction)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("adabelief", adabelief, AdaBeliefConfig,
             capabilities=Capabilities(update_rule=True))
