"""``adamax``: Keras 3 ``Adamax`` (keras-team/keras ``optimizers/adamax.py``).

Adam with the second moment replaced by an exponentially weighted infinity
norm: ``m += (g - m) * (1 - beta_1)``, ``u = max(beta_2 * u, |g|)`` and
``var -= lr * m / ((1 - beta_1 ** t) * (u + epsilon))``, written in Keras's
order of operations so a pipeline and Keras agree to float32 rounding.
Keras densifies IndexedSlices here (``u`` decays on every row), so this does
too: a sparse gradient gives exactly the step of its dense sum.
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
    keep_where_skipped,
    non_negative,
    one_minus,
    rowwise,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class AdamaxConfig:
    """Config of ``adamax``. Keras's other arguments (``weight_decay``,
    ``clipnorm``, ``use_ema``, ...) are transforms of their own in a pipeline.

    Attributes:
        learning_rate: step size (a number or a schedule).
        beta_1: decay of the first moment, in [0, 1) (``1 - beta_1 ** t`` divides).
        beta_2: decay of the infinity norm, in [0, 1].
        epsilon: added to the infinity norm.
        lazy: with a sparse gradient, update only the rows it touches, of the
            variable and of its slots (TF Addons' LazyAdam, as ``adam``).
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    beta_1: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, high_open=True))
    beta_2: Any = hyperparameter(default=0.999, validator=in_range(0.0, 1.0))
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())
    lazy: bool = False


class AdamaxState(NamedTuple):
    count: Any
    momentum: list[Any]
    norm: list[Any]


def adamax(cfg: AdamaxConfig) -> Transform:
    """Keras ``Adamax``: Adam's first moment over a decayed running max of ``|g|``."""
    lr, beta_1, beta_2 = hyper(cfg.learning_rate), hyper(cfg.beta_1), hyper(cfg.beta_2)

    def init(variables: list[Any]) -> AdamaxState:
        import tensorflow as tf

        return AdamaxState(tf.constant(0, tf.int64), zeros_like_vars(variables),
                           zeros_like_vars(variables))

    def update(grads: list[Any], state: AdamaxState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1

        def step(g: Any, m: Any, u: Any) -> Any:
            dtype = m.dtype
            g = tf.cast(g, dtype)
            beta_1_power = tf.pow(tf.cast(beta_1(), dtype), tf.cast(count, dtype))
            new = (m + (g - m) * one_minus(beta_1, dtype),  # Keras: 1 - beta_1 in Python
                   tf.maximum(tf.cast(beta_2(), dtype) * u, tf.abs(g)))
            # the step from the slots as written: the compiled step writes each once
            m, u = keep_where_skipped(new, (m, u))
            return (tf.cast(lr(), dtype) * m
                    / ((1 - beta_1_power) * (u + tf.cast(cfg.epsilon, dtype)))), (m, u)

        ms, us = list(state.momentum), list(state.norm)
        updates: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                updates.append(None)
                continue
            update, (ms[i], us[i]) = rowwise(step, g, (ms[i], us[i]), lazy=cfg.lazy)
            updates.append(update)
        return updates, AdamaxState(count, ms, us)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("adamax", adamax, AdamaxConfig, capabilities=Capabilities(update_rule=True))
