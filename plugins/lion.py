"""``lion``: Keras 3 ``Lion`` (keras-team/keras ``optimizers/lion.py``; Chen et
al. 2023, arXiv:2302.06675).

The step is the sign of an interpolation of the momentum and the gradient,
``var -= lr * sign(beta_1 * m + (1 - beta_1) * g)``, and only then does the
momentum move: ``m = beta_2 * m + (1 - beta_2) * g``. Keras computes
``1 - beta`` from the beta already cast to the variable's dtype (unlike Adam's
``1 - beta`` in Python), and so does this, so a sign near zero rounds as in
Keras. IndexedSlices are densified, as in Keras: the momentum decays on every
row, so a sparse gradient gives exactly the step of its dense sum.
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
    non_negative,
    rowwise,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class LionConfig:
    """Config of ``lion``. Keras's other arguments (``weight_decay``,
    ``clipnorm``, ``use_ema``, ...) are transforms of their own in a pipeline.

    Attributes:
        learning_rate: step size (a number or a schedule); typically 3-10x
            smaller than AdamW's.
        beta_1: weight of the momentum in the sign, in (0, 1] (Keras raises
            for 0: Lion would degenerate to SignSGD).
        beta_2: decay of the momentum, in [0, 1].
        lazy: with a sparse gradient, update only the rows it touches, of the
            variable and of its slots (TF Addons' LazyAdam, as ``adam``).
    """

    example: ClassVar[dict] = {"learning_rate": 0.01}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    beta_1: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, low_open=True))
    beta_2: Any = hyperparameter(default=0.99, validator=in_range(0.0, 1.0))
    lazy: bool = False


class LionState(NamedTuple):
    momentum: list[Any]


def lion(cfg: LionConfig) -> Transform:
    """Keras ``Lion``: ``lr * sign(beta_1 m + (1 - beta_1) g)``; then ``m`` decays by ``beta_2``."""
    lr, beta_1, beta_2 = hyper(cfg.learning_rate), hyper(cfg.beta_1), hyper(cfg.beta_2)

    def init(variables: list[Any]) -> LionState:
        return LionState(zeros_like_vars(variables))

    def update(grads: list[Any], state: LionState, variables: list[Any]) -> Any:
        import tensorflow as tf


        def step(g: Any, m: Any) -> Any:
            dtype = m.dtype
            g = tf.cast(g, dtype)
            b1, b2 = tf.cast(beta_1(), dtype), tf.cast(beta_2(), dtype)
            # the sign uses the momentum before this step's gradient enters it
            return (tf.cast(lr(), dtype) * tf.sign(m * b1 + g * (1.0 - b1)),
                    (m * b2 + g * (1.0 - b2),))

        ms = list(state.momentum)
        updates: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                updates.append(None)
                continue
            update, (ms[i],) = rowwise(step, g, (ms[i],), lazy=cfg.lazy)
            updates.append(update)
        return updates, LionState(ms)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("lion", lion, LionConfig, capabilities=Capabilities(update_rule=True))
