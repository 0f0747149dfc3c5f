"""``novograd``: optax's ``novograd`` (Ginsburg et al. 2019, arXiv:1905.11286),
OpenSeq2Seq's optimizer.

Adam with a second moment per variable (layer), not per element: ``v =
(1 - b2) norm(g)^2 + b2 v`` (``norm(g)^2`` on the first step), the gradient
normalised by it before it enters the momentum, with weight decay added
there: ``m = b1 m + g / (sqrt(v + epsilon_root) + epsilon) + weight_decay w``;
the step is ``lr m``. No bias correction. A per-variable rule: a sparse
gradient is made dense first.
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
    non_negative,
    one_minus,
    slot_dtype,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class NovoGradConfig:
    """Config of ``novograd``, with optax's defaults.

    Attributes:
        learning_rate: step size (a number or a schedule). optax has no default;
            0.001 is Keras's.
        beta_1: decay of the momentum (optax's ``b1``), in [0, 1].
        beta_2: decay of the per-variable second moment (``b2``), in [0, 1].
        epsilon: added to the root of the second moment (``eps``).
        epsilon_root: added to the second moment under the root (``eps_root``).
        weight_decay: added to the normalised gradient, times the variable
            (inside the momentum, as in NovoGrad's paper: not decoupled).
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    beta_1: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0))
    beta_2: Any = hyperparameter(default=0.25, validator=in_range(0.0, 1.0))
    epsilon: float = attrs.field(default=1e-6, validator=non_negative())
    epsilon_root: float = attrs.field(default=0.0, validator=non_negative())
    weight_decay: Any = hyperparameter(default=0.0, validator=non_negative())


class NovoGradState(NamedTuple):
    count: Any
    mu: list[Any]
    nu: list[Any]  # one scalar per variable


def novograd(cfg: NovoGradConfig) -> Transform:
    """optax ``novograd``: momentum of the gradient normalised by its layer's norm."""
    lr, beta_1, beta_2 = hyper(cfg.learning_rate), hyper(cfg.beta_1), hyper(cfg.beta_2)
    decay = hyper(cfg.weight_decay)

    def init(variables: list[Any]) -> NovoGradState:
        import tensorflow as tf

        return NovoGradState(tf.constant(0, tf.int64), zeros_like_vars(variables),
                             [tf.zeros([], slot_dtype(v)) for v in variables])

    def update(grads: list[Any], state: NovoGradState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1
        first = tf.equal(count, 1)
        mus, nus = list(state.mu), list(state.nu)
        updates: list[Any] = []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            dtype = mus[i].dtype
            g = tf.cast(dense(g), dtype)
            squared = tf.square(tf.norm(g))  # optax: norm(g) ** 2
            nus[i] = tf.where(first, squared, one_minus(beta_2, dtype) * squared
                              + tf.cast(beta_2(), dtype) * nus[i])
            normalised = g / (tf.sqrt(nus[i] + cfg.epsilon_root) + cfg.epsilon)
            if decay.constant != 0:
                normalised += tf.cast(decay(), dtype) * tf.cast(var, dtype)
            # the first step's momentum is 0, so b1 m + u is u there, as optax's
            mus[i] = tf.cast(beta_1(), dtype) * mus[i] + normalised
            updates.append(mus[i] * tf.cast(lr(), dtype))
        return updates, NovoGradState(count, mus, nus)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("novograd", novograd, NovoGradConfig, capabilities=Capabilities(update_rule=True))
