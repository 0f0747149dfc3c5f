"""``optimistic_gradient_descent``: optax's ``optimistic_gradient_descent``
(Mokhtari et al. 2019, "A Unified Analysis of Extra-gradient and Optimistic
Gradient Methods for Saddle Point Problems").

The step extrapolates from the previous gradient,
``lr ((alpha + beta) g - beta g_prev)``; on the first step ``g_prev`` is ``g``
(so the step is ``lr alpha g``). For min-max games, where it damps the
rotation plain gradient descent falls into.
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
    non_negative,
    rowwise,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class OptimisticConfig:
    """Config of ``optimistic_gradient_descent``, with optax's defaults.

    Attributes:
        learning_rate: step size (a number or a schedule). optax has no default;
            0.001 is Keras's.
        alpha: weight of the current gradient.
        beta: weight of the extrapolation from the previous gradient.
        lazy: with a sparse gradient, update only the rows it touches, of the
            variable and of the previous gradient it keeps.
    """

    example: ClassVar[dict] = {"learning_rate": 0.001}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    alpha: Any = hyperparameter(default=1.0, validator=non_negative())
    beta: Any = hyperparameter(default=1.0, validator=non_negative())
    lazy: bool = False


class OptimisticState(NamedTuple):
    count: Any
    previous_gradient: list[Any]


def optimistic_gradient_descent(cfg: OptimisticConfig) -> Transform:
    """optax ``optimistic_gradient_descent``: ``lr ((alpha + beta) g - beta g_prev)``."""
    lr, alpha, beta = hyper(cfg.learning_rate), hyper(cfg.alpha), hyper(cfg.beta)

    def init(variables: list[Any]) -> OptimisticState:
        import tensorflow as tf

        return OptimisticState(tf.constant(0, tf.int64), zeros_like_vars(variables))

    def update(grads: list[Any], state: OptimisticState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1
        both = (alpha.constant + beta.constant  # as optax adds Python floats
                if alpha.constant is not None and beta.constant is not None else None)

        def step(g: Any, previous: Any) -> Any:
            dtype = previous.dtype
            g = tf.cast(g, dtype)
            previous = tf.where(tf.equal(count, 1), g, previous)
            weight = tf.cast(alpha() + beta() if both is None else both, dtype)
            return ((weight * g - tf.cast(beta(), dtype) * previous)
                    * tf.cast(lr(), dtype)), (g,)

        previous = list(state.previous_gradient)
        updates: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                updates.append(None)
                continue
            update, (previous[i],) = rowwise(step, g, (previous[i],), lazy=cfg.lazy)
            updates.append(update)
        return updates, OptimisticState(count, previous)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("optimistic_gradient_descent", optimistic_gradient_descent, OptimisticConfig,
             capabilities=Capabilities(update_rule=True))
