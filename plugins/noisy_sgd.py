"""``noisy_sgd``: optax's ``noisy_sgd`` (Neelakantan et al. 2015, "Adding Gradient
Noise Improves Learning for Very Deep Networks").

``lr (g + n)``, with ``n`` Gaussian of variance ``eta / t^gamma`` at step ``t``:
annealed noise. The noise is TensorFlow's stateless normal stream, keyed by
``seed``, the step and the variable's place in the list, so a run and its
resume from a checkpoint draw the same noise; it is not JAX's stream, so the
numbers differ from optax's while their distribution is the same. A sparse
gradient is made dense first: every element gets noise.
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
    non_negative,
)


@attrs.frozen(kw_only=True)
class NoisySGDConfig:
    """Config of ``noisy_sgd``, with optax's defaults.

    Attributes:
        learning_rate: step size (a number or a schedule). optax has no default;
            0.001 is Keras's.
        eta: the noise's variance at the first step.
        gamma: how fast the variance decays, ``eta / t^gamma``.
        seed: the noise stream's seed (optax's ``key``).
    """

    example: ClassVar[dict] = {"learning_rate": 0.002, "eta": 1e-4}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    eta: Any = hyperparameter(default=0.01, validator=non_negative())
    gamma: Any = hyperparameter(default=0.55, validator=non_negative())
    seed: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))


class NoisySGDState(NamedTuple):
    count: Any


def noisy_sgd(cfg: NoisySGDConfig) -> Transform:
    """optax ``noisy_sgd``: SGD plus Gaussian noise of variance ``eta / t^gamma``."""
    lr, eta, gamma = hyper(cfg.learning_rate), hyper(cfg.eta), hyper(cfg.gamma)

    def init(variables: list[Any]) -> NoisySGDState:
        import tensorflow as tf

        return NoisySGDState(tf.constant(0, tf.int64))

    def update(grads: list[Any], state: NoisySGDState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1
        deviation = tf.sqrt(eta() / tf.pow(tf.cast(count, tf.float32), gamma()))
        key = tf.stack([tf.constant(cfg.seed, tf.int64), count])
        updates: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                updates.append(None)
                continue
            g = dense(g)
            noise = tf.random.stateless_normal(
                tf.shape(g), tf.random.experimental.stateless_fold_in(key, i), dtype=g.dtype)
            updates.append((g + tf.cast(deviation, g.dtype) * noise) * tf.cast(lr(), g.dtype))
        return updates, NoisySGDState(count)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("noisy_sgd", noisy_sgd, NoisySGDConfig, capabilities=Capabilities(update_rule=True))
