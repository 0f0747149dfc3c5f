"""``sgd``: Keras 3 ``SGD`` (keras-team/keras ``optimizers/sgd.py``).

``m = momentum * m - lr * g`` and ``var += m`` (Nesterov: ``var += momentum * m
- lr * g``); without momentum ``var -= lr * g``, which keeps sparse gradients
sparse. The fused kernel below does the same in place.
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
    map_grads,
    map_values,
    non_negative,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class SGDConfig:
    """Config of ``sgd``.

    Attributes:
        learning_rate: step size (a number or a schedule).
        momentum: heavy-ball momentum in [0, 1]; 0 disables the momentum slot.
        nesterov: use Nesterov momentum.
    """

    example: ClassVar[dict] = {"learning_rate": 0.001, "momentum": 0.9}

    learning_rate: Any = hyperparameter(default=0.01, validator=non_negative())
    momentum: Any = hyperparameter(default=0.0, validator=in_range(0.0, 1.0))
    nesterov: bool = False


class SGDState(NamedTuple):
    momentum: list[Any]


def _uses_momentum(cfg: SGDConfig) -> bool:
    return not (isinstance(cfg.momentum, float) and cfg.momentum == 0.0)


def sgd(cfg: SGDConfig) -> Transform:
    lr, momentum = hyper(cfg.learning_rate), hyper(cfg.momentum)

    def init(variables: list[Any]) -> Any:
        return SGDState(zeros_like_vars(variables)) if _uses_momentum(cfg) else ()

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        lr_t = lr()
        if not _uses_momentum(cfg):
            return map_grads(lambda g: map_values(g, lambda x: x * tf.cast(lr_t, x.dtype)),
                             grads), state
        mu = momentum()
        new_m: list[Any] = []
        updates: list[Any] = []
        for g, m in zip(grads, state.momentum):
            if g is None:
                new_m.append(m)
                updates.append(None)
                continue
            g = tf.cast(dense(g), m.dtype)
            lr_c, mu_c = tf.cast(lr_t, m.dtype), tf.cast(mu, m.dtype)
            m = keep_where_skipped(m * mu_c - g * lr_c, m)  # the step from m as written
            new_m.append(m)
            updates.append(-(m * mu_c - g * lr_c) if cfg.nesterov else -m)
        return updates, SGDState(new_m)

    return Transform(init, update)


def sgd_kernel(cfg: SGDConfig) -> Any:
    """``update`` and ``var -= update`` in place, with TF's fused kernels, which compute
    exactly Keras's formulas: ``ResourceApplyKerasMomentum`` (``m = m*mu - g*lr;
    var += m``) or ``ResourceApplyGradientDescent`` (``var -= lr*g``)."""
    lr, momentum = hyper(cfg.learning_rate), hyper(cfg.momentum)

    def apply(grads: list[Any], slots: Any, variables: list[Any]) -> list[Any]:
        import tensorflow as tf

        lr_t, ops = lr(), []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                continue
            dtype = var.dtype
            g = tf.cast(dense(g), dtype)
            if _uses_momentum(cfg):
                ops.append(tf.raw_ops.ResourceApplyKerasMomentum(
                    var=var.handle, accum=slots.momentum[i].handle, lr=tf.cast(lr_t, dtype),
                    grad=g, momentum=tf.cast(momentum(), dtype), use_nesterov=cfg.nesterov))
            else:
                ops.append(tf.raw_ops.ResourceApplyGradientDescent(
                    var=var.handle, alpha=tf.cast(lr_t, dtype), delta=g))
        return ops

    return apply


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("sgd", sgd, SGDConfig, kernel=sgd_kernel,
             capabilities=Capabilities(update_rule=True))
