"""``adadelta``: Keras 3 ``Adadelta`` (keras-team/keras ``optimizers/adadelta.py``;
Zeiler 2012, arXiv:1212.5701).

Two running averages, of squared gradients and of squared steps:
``acc_g = rho acc_g + (1 - rho) g^2``, ``delta = sqrt(acc_d + eps) g / sqrt(acc_g
+ eps)``, ``acc_d = rho acc_d + (1 - rho) delta^2`` and ``var -= lr * delta``.
Keras scales the step by ``learning_rate`` (default 0.001; 1.0 is the paper's
form), and so does this. IndexedSlices are densified, as in Keras: both
averages decay on every row, so a sparse gradient gives exactly the step of
its dense sum.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    dense,
    hookimpl,
    hyper,
    hyperparameter,
    in_range,
    keep_where_skipped,
    non_negative,
    one_minus,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class AdadeltaConfig:
    """Config of ``adadelta``. Keras's other arguments (``weight_decay``,
    ``clipnorm``, ``use_ema``, ...) are transforms of their own in a pipeline.

    Attributes:
        learning_rate: multiplies the step (a number or a schedule); 1.0 is
            the paper's Adadelta.
        rho: decay of both running averages, in [0, 1].
        epsilon: added inside both square roots.
    """

    example: ClassVar[dict] = {"learning_rate": 1.0}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    rho: Any = hyperparameter(default=0.95, validator=in_range(0.0, 1.0))
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())


class AdadeltaState(NamedTuple):
    accumulated_grad: list[Any]
    accumulated_delta_var: list[Any]


def adadelta(cfg: AdadeltaConfig) -> Transform:
    """Keras ``Adadelta``: the step ``lr sqrt(acc_d + eps) g / sqrt(acc_g + eps)``."""
    lr, rho = hyper(cfg.learning_rate), hyper(cfg.rho)

    def init(variables: list[Any]) -> AdadeltaState:
        return AdadeltaState(zeros_like_vars(variables), zeros_like_vars(variables))

    def update(grads: list[Any], state: AdadeltaState, variables: list[Any]) -> Any:
        import tensorflow as tf

        acc_g, acc_d = list(state.accumulated_grad), list(state.accumulated_delta_var)
        updates: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                updates.append(None)
                continue
            dtype = acc_g[i].dtype
            g = tf.cast(dense(g), dtype)
            r, eps = tf.cast(rho(), dtype), tf.cast(cfg.epsilon, dtype)
            # Keras: 1 - rho in Python, then into the dtype (one_minus does the same)
            acc_g[i] = keep_where_skipped(r * acc_g[i] + one_minus(rho, dtype) * tf.square(g),
                                          acc_g[i])
            # Keras negates delta and adds lr * delta; negation is exact, so the
            # update ``var -= lr * delta`` here rounds the same
            delta = tf.sqrt(acc_d[i] + eps) * g / tf.sqrt(acc_g[i] + eps)
            acc_d[i] = r * acc_d[i] + one_minus(rho, dtype) * tf.square(delta)
            updates.append(tf.cast(lr(), dtype) * delta)
        return updates, AdadeltaState(acc_g, acc_d)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("adadelta", adadelta, AdadeltaConfig, capabilities=Capabilities(update_rule=True))
