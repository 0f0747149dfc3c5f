"""Regularization: coupled ``l2`` and decoupled ``weight_decay``.

``l2`` adds ``l2 * w`` to the gradient, as an L2 term in the loss would
(OpenSeq2Seq regularizers), so the update rule sees it. ``weight_decay`` is
decoupled, in the Keras/AdamW order: placed *after* the update rule it adds
``weight_decay * learning_rate * w`` to the update, which equals Keras's
``var -= var * wd * lr`` before ``update_step``. Limit either to some
variables with ``variables``/``exclude`` (Keras ``exclude_from_weight_decay``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    dense,
    hookimpl,
    hyper,
    hyperparameter,
    map_grads,
    no_state,
    non_negative,
    value_of,
)


def plus_scaled_weights(values: list[Any], variables: list[Any], coefficient: Any) -> list[Any]:
    """``value + coefficient * w`` for each non-None value (sparse values densified)."""
    import tensorflow as tf

    def add(value: Any, var: Any) -> Any:
        value = dense(value)
        return value + tf.cast(coefficient, value.dtype) * value_of(var, value.dtype)

    return map_grads(add, values, variables)


@attrs.frozen(kw_only=True)
class L2Config:
    """Config of ``l2``.

    Attributes:
        l2: strength; the gradient becomes ``g + l2 * w``.
    """

    example: ClassVar[dict] = {"l2": 0.01}

    l2: Any = hyperparameter(validator=non_negative())


def l2(cfg: L2Config) -> Transform:
    """Coupled L2: ``g + l2 * w`` (sparse gradients are densified, as a loss term would be)."""
    strength = hyper(cfg.l2)

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        return plus_scaled_weights(grads, variables, strength()), state

    return Transform(no_state, update)


@attrs.frozen(kw_only=True)
class WeightDecayConfig:
    """Config of ``weight_decay``.

    Attributes:
        weight_decay: decay rate.
        learning_rate: multiplies the decay (Keras/AdamW: the update rule's
            learning rate, e.g. ``"@lr"``); 1.0 decays by ``weight_decay`` alone.
    """

    example: ClassVar[dict] = {"weight_decay": 0.01}


    weight_decay: Any = hyperparameter(validator=non_negative())
    learning_rate: Any = hyperparameter(default=1.0, validator=non_negative())


def weight_decay(cfg: WeightDecayConfig) -> Transform:
    """Decoupled decay: ``update + weight_decay * learning_rate * w``."""
    rate, lr = hyper(cfg.weight_decay), hyper(cfg.learning_rate)

    def update(updates: list[Any], state: Any, variables: list[Any]) -> Any:
        return plus_scaled_weights(updates, variables, rate() * lr()), state

    return Transform(no_state, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("l2", l2, L2Config)
    register("weight_decay", weight_decay, WeightDecayConfig,
             capabilities=Capabilities(after_update_rule=True))
