"""``amsgrad``: optax's ``amsgrad`` (Reddi et al. 2018, "On the Convergence of
Adam and Beyond").

Adam whose denominator never shrinks: the running maximum of the bias-corrected
second moment. This is optax's maths, which differs from ``adam`` with
``amsgrad = true`` (Keras's): Keras keeps the maximum of the second moment
before bias correction and corrects it afterwards; optax corrects first (set
``bias_correction_nu = false`` for the paper's uncorrected maximum).
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import Capabilities, Transform, hookimpl, hyper, non_negative
from gradpipe.plugins.optax_family import (
    MomentsConfig,
    correction,
    debiased,
    moment,
    moments_rule,
)


@attrs.frozen(kw_only=True)
class AmsgradConfig(MomentsConfig):
    """Config of ``amsgrad``, with optax's defaults.

    Attributes:
        epsilon_root: added to the maximum under the root (optax's ``eps_root``).
        bias_correction_mu: bias-correct the first moment.
        bias_correction_nu: bias-correct the second moment before its maximum.
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    epsilon_root: float = attrs.field(default=0.0, validator=non_negative())
    bias_correction_mu: bool = True
    bias_correction_nu: bool = True


class AmsgradState(NamedTuple):
    count: Any
    mu: list[Any]
    nu: list[Any]
    nu_max: list[Any]


def amsgrad(cfg: AmsgradConfig) -> Transform:
    """optax ``amsgrad``: Adam over the running maximum of the corrected second moment."""
    beta_1, beta_2 = hyper(cfg.beta_1), hyper(cfg.beta_2)

    def advance(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m, v, v_max = slots
        v = moment(tf.square(g), v, beta_2)
        seen = debiased(v, correction(beta_2, count)) if cfg.bias_correction_nu else v
        return moment(g, m, beta_1), v, tf.maximum(v_max, seen)

    def direction(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        m, _, v_max = slots
        m_hat = debiased(m, correction(beta_1, count)) if cfg.bias_correction_mu else m
        return m_hat / (tf.sqrt(v_max + cfg.epsilon_root) + cfg.epsilon)

    return moments_rule(cfg, AmsgradState, (0.0, 0.0, 0.0), advance, direction)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("amsgrad", amsgrad, AmsgradConfig, capabilities=Capabilities(update_rule=True))
