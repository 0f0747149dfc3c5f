"""``nadam``: Keras 3 ``Nadam`` (keras-team/keras ``optimizers/nadam.py``; Dozat 2015).

Adam with Nesterov momentum and Dozat's momentum schedule
``u_t = beta_1 (1 - 0.5 * 0.96 ** t)``. The running product of the ``u_t`` is
state, as in Keras (its ``_u_product``, one float32 scalar), updated once per
step before the variables. The step is
``lr * m_hat / (sqrt(v / (1 - beta_2 ** t)) + epsilon)`` with
``m_hat = u_{t+1} m / (1 - prod u_{..t+1}) + (1 - u_t) g / (1 - prod u_{..t})``,
written in Keras's order of operations (``1 - beta`` from the beta cast to the
variable's dtype, as Keras does here) so that a pipeline and Keras agree to
float32 rounding. IndexedSlices are densified, as in Keras, so a sparse
gradient gives exactly the step of its dense sum.
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
    rowwise,
    zeros_like_vars,
)

#: Dozat's momentum-schedule base (Keras hard-codes it too).
_DECAY = 0.96


@attrs.frozen(kw_only=True)
class NadamConfig:
    """Config of ``nadam``. Keras's other arguments (``weight_decay``,
    ``clipnorm``, ``use_ema``, ...) are transforms of their own in a pipeline.

    Attributes:
        learning_rate: step size (a number or a schedule).
        beta_1: decay of the first moment, in [0, 1).
        beta_2: decay of the second moment, in [0, 1) (``1 - beta_2 ** t`` divides).
        epsilon: added to the root of the second moment.
        lazy: with a sparse gradient, update only the rows it touches, of the
            variable and of its slots (TF Addons' LazyAdam, as ``adam``).
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    beta_1: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, high_open=True))
    beta_2: Any = hyperparameter(default=0.999, validator=in_range(0.0, 1.0, high_open=True))
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())
    lazy: bool = False


class NadamState(NamedTuple):
    count: Any
    u_product: Any
    momentum: list[Any]
    velocity: list[Any]


def nadam(cfg: NadamConfig) -> Transform:
    """Keras ``Nadam``: Adam's moments, a Nesterov look-ahead with Dozat's schedule."""
    lr, beta_1, beta_2 = hyper(cfg.learning_rate), hyper(cfg.beta_1), hyper(cfg.beta_2)

    def init(variables: list[Any]) -> NadamState:
        import tensorflow as tf

        return NadamState(tf.constant(0, tf.int64), tf.constant(1.0, tf.float32),
                          zeros_like_vars(variables), zeros_like_vars(variables))

    def update(grads: list[Any], state: NadamState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1
        # Keras updates its _u_product once per step, before any variable, in float32
        u_product = state.u_product * beta_1() * (
            1.0 - 0.5 * tf.pow(tf.constant(_DECAY, tf.float32), tf.cast(count, tf.float32)))

        def step(g: Any, m: Any, v: Any) -> Any:
            dtype = m.dtype
            g = tf.cast(g, dtype)
            local_step, next_step = tf.cast(count, dtype), tf.cast(count + 1, dtype)
            decay = tf.constant(_DECAY, dtype)
            b1, b2 = tf.cast(beta_1(), dtype), tf.cast(beta_2(), dtype)
            u_t = b1 * (1.0 - 0.5 * tf.pow(decay, local_step))
            u_t_1 = b1 * (1.0 - 0.5 * tf.pow(decay, next_step))
            u_product_t = tf.cast(u_product, dtype)
            u_product_t_1 = u_product_t * u_t_1
            new = (m + (g - m) * (1 - b1), v + (tf.square(g) - v) * (1 - b2))
            # the step from the moments as written: the compiled step writes each once
            m, v = keep_where_skipped(new, (m, v))
            m_hat = u_t_1 * m / (1 - u_product_t_1) + (1 - u_t) * g / (1 - u_product_t)
            v_hat = v / (1 - tf.pow(b2, local_step))
            return (m_hat * tf.cast(lr(), dtype)
                    / (tf.sqrt(v_hat) + tf.cast(cfg.epsilon, dtype))), (m, v)

        ms, vs = list(state.momentum), list(state.velocity)
        updates: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                updates.append(None)
                continue
            update, (ms[i], vs[i]) = rowwise(step, g, (ms[i], vs[i]), lazy=cfg.lazy)
            updates.append(update)
        return updates, NadamState(count, u_product, ms, vs)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("nadam", nadam, NadamConfig, capabilities=Capabilities(update_rule=True))
