"""Adaptive gradient clipping (Brock et al. 2021) for gradpipe."""

from __future__ import annotations

from typing import Any

import attrs

from gradpipe.plugin import (
    Transform,
    hookimpl,
    hyper,
    hyperparameter,
    map_grads,
    no_state,
    positive,
)

__version__ = "0.1.0"


@attrs.frozen(kw_only=True)
class AGCConfig:
    """Config of ``agc``.

    Attributes:
        clipping: the largest allowed ratio of unit gradient norm to unit weight norm.
        eps: floor of the weight norm, so zero-initialised weights still move.
    """

    clipping: Any = hyperparameter(default=0.01, validator=positive())
    eps: float = attrs.field(default=1e-3, validator=positive())


def unitwise_norm(x: Any) -> Any:
    """L2 norm per output unit (last axis); whole-tensor norm for rank <= 1."""
    import tensorflow as tf

    if x.shape.rank is not None and x.shape.rank <= 1:
        return tf.norm(x)
    axes = list(range(x.shape.rank - 1))
    return tf.sqrt(tf.reduce_sum(tf.square(x), axis=axes, keepdims=True))


def agc(cfg: AGCConfig) -> Transform:
    clipping = hyper(cfg.clipping)

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        c = clipping()

        def clip(g: Any, w: Any) -> Any:
            g = tf.convert_to_tensor(g)
            w = tf.cast(tf.convert_to_tensor(w), g.dtype)
            w_norm = tf.maximum(unitwise_norm(w), cfg.eps)
            g_norm = unitwise_norm(g)
            max_norm = w_norm * tf.cast(c, g.dtype)
            # g_norm can be 0: divide only where clipping actually happens.
            clipped = g * (max_norm / tf.maximum(g_norm, 1e-6))
            return tf.where(g_norm > max_norm, clipped, g)

        return map_grads(clip, grads, variables), state

    return Transform(no_state, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("agc", agc, AGCConfig)
