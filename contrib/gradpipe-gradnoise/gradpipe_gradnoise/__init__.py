"""Annealed Gaussian gradient noise (Neelakantan et al. 2015) for gradpipe."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import Transform, hookimpl, non_negative

GRADPIPE_PLUGIN_API = 2


@attrs.frozen(kw_only=True)
class NoiseConfig:
    """Config of ``gradient_noise``.

    Attributes:
        eta: noise variance at step 0.
        gamma: annealing exponent: the variance is ``eta / (1 + t)^gamma``.
        seed: seed of the stateless noise stream.
    """

    example: ClassVar[dict] = {"eta": 0.01}

    eta: float = attrs.field(default=0.01, validator=non_negative())
    gamma: float = attrs.field(default=0.55, validator=non_negative())
    seed: int = 0


class NoiseState(NamedTuple):
    count: Any


def noise_stddev(eta: float, gamma: float, t: Any) -> Any:
    """``sqrt(eta / (1 + t)^gamma)``, the schedule of the paper."""
    import tensorflow as tf

    return tf.sqrt(eta / tf.pow(1.0 + tf.cast(t, tf.float32), gamma))


def gradient_noise(cfg: NoiseConfig) -> Transform:
    """Add N(0, eta / (1 + t)^gamma) to every gradient element."""

    def init(variables: list[Any]) -> NoiseState:
        import tensorflow as tf

        return NoiseState(tf.constant(0, tf.int64))

    def update(grads: list[Any], state: NoiseState, variables: list[Any]) -> Any:
        import tensorflow as tf

        std = noise_stddev(cfg.eta, cfg.gamma, state.count)
        out: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                out.append(None)
                continue
            g = tf.convert_to_tensor(g)
            seed = tf.stack([tf.constant(cfg.seed, tf.int64) * 1_000_003 + i, state.count])
            noise = tf.random.stateless_normal(tf.shape(g), seed=seed, dtype=g.dtype)
            out.append(g + noise * tf.cast(std, g.dtype))
        return out, NoiseState(state.count + 1)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("gradient_noise", gradient_noise, NoiseConfig)
