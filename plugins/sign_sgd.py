"""``sign_sgd`` and ``signum``: optax's ``sign_sgd`` and ``signum`` (Bernstein et
al. 2018, "signSGD: Compressed Optimisation for Non-Convex Problems").

``sign_sgd`` steps by the sign of the gradient, ``lr * sign(g)``; ``signum`` by
the sign of its momentum, ``m = (1 - beta) g + beta m`` (not bias-corrected:
the sign does not need it). A sparse gradient gives ``sign_sgd`` exactly the
step of its dense sum (the rows it does not touch have sign 0).
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
    no_state,
    non_negative,
    rowwise,
)
from gradpipe.plugins.optax_family import moment, moments_rule


@attrs.frozen(kw_only=True)
class SignSGDConfig:
    """Config of ``sign_sgd``.

    Attributes:
        learning_rate: step size (a number or a schedule). optax has no default;
            0.001 is Keras's.
    """

    example: ClassVar[dict] = {"learning_rate": 0.01}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())


@attrs.frozen(kw_only=True)
class SignumConfig(SignSGDConfig):
    """Config of ``signum``, with optax's defaults.

    Attributes:
        beta: decay of the momentum, in [0, 1).
        lazy: with a sparse gradient, update only the rows it touches, of the
            variable and of its momentum (the others' momentum is not decayed).
    """

    beta: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, high_open=True))
    lazy: bool = False


def sign_sgd(cfg: SignSGDConfig) -> Transform:
    """optax ``sign_sgd``: ``lr * sign(g)``."""
    lr = hyper(cfg.learning_rate)

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        def step(g: Any) -> Any:
            return tf.sign(g) * tf.cast(lr(), g.dtype), ()

        # duplicate rows are summed before the sign: the dense sum's step, on its rows
        return [None if g is None else rowwise(step, g, (), lazy=True)[0]
                for g in grads], state

    return Transform(no_state, update)


class SignumState(NamedTuple):
    count: Any
    momentum: list[Any]


def signum(cfg: SignumConfig) -> Transform:
    """optax ``signum``: ``lr * sign(m)``, ``m`` the gradient's moving average."""
    beta = hyper(cfg.beta)

    def advance(g: Any, slots: Any, count: Any) -> Any:
        return (moment(g, slots[0], beta),)

    def direction(g: Any, slots: Any, count: Any) -> Any:
        import tensorflow as tf

        return tf.sign(slots[0])

    return moments_rule(cfg, SignumState, (0.0,), advance, direction)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("sign_sgd", sign_sgd, SignSGDConfig, capabilities=Capabilities(update_rule=True))
    register("signum", signum, SignumConfig, capabilities=Capabilities(update_rule=True))
