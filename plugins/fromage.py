"""``fromage``: optax's ``fromage``, Frobenius matched gradient descent (Bernstein
et al. 2020, "On the distance between two neural networks and the stability
of learning").

Each variable steps by its gradient rescaled to the variable's own norm
(``norm(w) / norm(g)``, both at least ``min_norm``; a ratio of 1 where either
norm is 0), times ``lr``, then shrinks toward 0 so that its norm does not grow:
``w = (w - lr (norm(w) / norm(g)) g) / sqrt(1 + lr^2)``. A per-variable rule:
a sparse gradient is made dense first.
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
    no_state,
    non_negative,
)


@attrs.frozen(kw_only=True)
class FromageConfig:
    """Config of ``fromage``, with optax's defaults.

    Attributes:
        learning_rate: step size relative to each variable's norm (a number or a
            schedule). optax has no default; 0.001 is Keras's.
        min_norm: the least norm of a variable or a gradient in the ratio.
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    min_norm: float = attrs.field(default=1e-6, validator=non_negative())


def fromage(cfg: FromageConfig) -> Transform:
    """optax ``fromage``: the gradient at the variable's scale, then a norm-keeping shrink."""
    lr = hyper(cfg.learning_rate)

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        if lr.constant is not None:  # optax computes these in Python for a number
            mult = 1 / (1 + lr.constant**2) ** 0.5
            rate, shrink = tf.constant(lr.constant * mult), tf.constant(1 - mult)
        else:
            mult = tf.math.rsqrt(1 + tf.square(lr()))
            rate, shrink = lr() * mult, 1 - mult

        def norm(x: Any) -> Any:
            return tf.maximum(tf.norm(x), cfg.min_norm)

        updates: list[Any] = []
        for g, var in zip(grads, variables):
            if g is None:
                updates.append(None)
                continue
            g, w = dense(g), tf.convert_to_tensor(var)
            w_norm, g_norm = norm(w), norm(g)
            ratio = tf.where((w_norm == 0) | (g_norm == 0), tf.ones_like(w_norm),
                             w_norm / g_norm)
            updates.append(tf.cast(rate, g.dtype) * (g * ratio)
                           + tf.cast(shrink, g.dtype) * w)
        return updates, state

    return Transform(no_state, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("fromage", fromage, FromageConfig, capabilities=Capabilities(update_rule=True))
