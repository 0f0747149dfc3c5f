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
    hookimpl,
    hyper,
    hyperparameter,
    map_grads,
    no_state,
    non_negative,
    rowwise,
)


def plus_scaled_weights(values: list[Any], variables: list[Any], coefficient: Any, *,
                        lazy: bool = False) -> list[Any]:
    """``value + coefficient * w`` for each non-None value: sparse values densified,
    or with ``lazy`` kept as their rows, where only those rows of ``w`` are read."""
    import tensorflow as tf

    def add(value: Any, w: Any) -> Any:
        return value + tf.cast(coefficient, value.dtype) * tf.cast(w, value.dtype), []

    return map_grads(lambda value, var: rowwise(add, value, [], lazy=lazy, extra=[var])[0],
                     values, variables)


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
        lazy: where the update is rows (a ``lazy`` rule's, for an embedding's
            sparse gradient), decay only those rows, once each, as TF Addons'
            decoupled decay does on a sparse gradient; otherwise every row is
            decayed, as Keras's ``AdamW`` does, and the update becomes dense.
    """

    example: ClassVar[dict] = {"weight_decay": 0.01}

    weight_decay: Any = hyperparameter(validator=non_negative())
    learning_rate: Any = hyperparameter(default=1.0, validator=non_negative())
    lazy: bool = False


def weight_decay(cfg: WeightDecayConfig) -> Transform:
    """Decoupled decay: ``update + weight_decay * learning_rate * w``.

    With ``lazy``, an update of rows decays only those rows of ``w``."""
    rate, lr = hyper(cfg.weight_decay), hyper(cfg.learning_rate)

    def update(updates: list[Any], state: Any, variables: list[Any]) -> Any:
        return plus_scaled_weights(updates, variables, rate() * lr(), lazy=cfg.lazy), state

    return Transform(no_state, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("l2", l2, L2Config, capabilities=Capabilities(before_update_rule=True))
    register("weight_decay", weight_decay, WeightDecayConfig,
             capabilities=Capabilities(after_update_rule=True))
