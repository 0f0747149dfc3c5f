"""``adan``: optax's ``adan``, Adaptive Nesterov momentum (Xie et al. 2022,
arXiv:2208.06677).

Three moments: of the gradient ``m``, of its change since the last step ``v``
(``d = g - g_prev``, 0 on the first step), and of ``(g + (1 - b2) d)^2``, ``n``;
the step is ``(m_hat + (1 - b2) v_hat) / (sqrt(n_hat + epsilon_root) + epsilon)``,
each moment bias-corrected, then decoupled weight decay. The previous gradient
is a slot of its own.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    hookimpl,
    hyper,
    hyperparameter,
    in_range,
    non_negative,
    one_minus,
)
from gradpipe.plugins.optax_family import (
    DecayedMomentsConfig,
    correction,
    debiased,
    moment,
    moments_rule,
)


@attrs.frozen(kw_only=True)
class AdanConfig(DecayedMomentsConfig):
    """Config of ``adan``, with optax's defaults.

    Attributes:
        beta_1: decay of the gradient's moment (optax's ``b1``).
        beta_2: decay of the gradient difference's moment (``b2``).
        beta_3: decay of the second moment (``b3``), in [0, 1).
        epsilon_root: added to the second moment under the root (``eps_root``).
        weight_decay: decoupled decay (optax's default: none).
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    beta_1: Any = hyperparameter(default=0.98, validator=in_range(0.0, 1.0, high_open=True))
    beta_2: Any = hyperparameter(default=0.92, validator=in_range(0.0, 1.0, high_open=True))
    beta_3: Any = hyperparameter(default=0.99, validator=in_range(0.0, 1.0, high_open=True))
    epsilon_root: float = attrs.field(default=1e-8, validator=non_negative())
    weight_decay: Any = hyperparameter(default=0.0, validator=non_negative())


class AdanState(NamedTuple):
    count: Any
    m: list[Any]
    v: list[Any]
    n: list[Any]
    previous_gradient: list[Any]


def adan(cfg: AdanConfig) -> Transform:
    """optax ``adan``: Nesterov momentum estimated from gradient differences."""
    beta_1, beta_2, beta_3 = hyper(cfg.beta_1), hyper(cfg.beta_2), hyper(cfg.beta_3)

    def advance(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m, v, n, previous = slots
        diff = tf.where(tf.equal(count, 1), tf.zeros_like(g), g - previous)
        nesterov = g + one_minus(beta_2, g.dtype) * diff
        return (moment(g, m, beta_1), moment(diff, v, beta_2),
                moment(tf.square(nesterov), n, beta_3), g)

    def direction(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m, v, n, _ = slots
        step = (debiased(m, correction(beta_1, count))
                + one_minus(beta_2, m.dtype) * debiased(v, correction(beta_2, count)))
        return step / (tf.sqrt(debiased(n, correction(beta_3, count)) + cfg.epsilon_root)
                       + cfg.epsilon)

    return moments_rule(cfg, AdanState, (0.0, 0.0, 0.0, 0.0), advance, direction)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("adan", adan, AdanConfig, capabilities=Capabilities(update_rule=True))
