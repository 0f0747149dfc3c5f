"""Built-in problems for ``gradpipe run``: ``quadratic`` and ``rosenbrock``.

Each problem has variables, a loss, a known optimum and a target loss, so any
pipeline can be run and judged with no user code.
"""

from __future__ import annotations

from typing import Any

import attrs

from gradpipe.plugin import (
    at_least,
    hookimpl,
    positive,
)


@attrs.frozen(kw_only=True)
class QuadraticConfig:
    """Config of ``quadratic``: ``0.5 * sum(a_i (x_i - x*_i)^2)``.

    Attributes:
        dim: number of coordinates.
        condition: ratio of the largest to the smallest curvature ``a_i``.
        seed: seed of the optimum ``x*``.
        target_loss: the run succeeds once the loss is at most this.
    """

    dim: int = attrs.field(default=10, validator=at_least(1))
    condition: float = attrs.field(default=10.0, validator=at_least(1.0))
    seed: int = 0
    target_loss: float = attrs.field(default=1e-3, validator=positive())


class Quadratic:
    name = "quadratic"
    default_steps = 500

    def __init__(self, cfg: QuadraticConfig) -> None:
        import numpy as np
        import tensorflow as tf

        self.config = cfg
        rng = np.random.default_rng(cfg.seed)
        self.optimum = rng.normal(size=cfg.dim).astype("float32")
        self.curvature = tf.constant(np.geomspace(1.0, cfg.condition, cfg.dim), tf.float32)
        self.x = tf.Variable(tf.zeros([cfg.dim]), name="x")
        self.variables = [self.x]
        self.target_loss = cfg.target_loss

    def loss(self, step: Any = None) -> Any:
        import tensorflow as tf

        return 0.5 * tf.reduce_sum(self.curvature * tf.square(self.x - self.optimum))

    def metrics(self) -> dict[str, float]:
        import numpy as np

        return {"distance_to_optimum": float(np.linalg.norm(self.x.numpy() - self.optimum))}


@attrs.frozen(kw_only=True)
class RosenbrockConfig:
    """Config of ``rosenbrock``: ``sum(b (x_{i+1} - x_i^2)^2 + (1 - x_i)^2)``.

    Attributes:
        dim: number of coordinates (at least 2).
        b: curvature of the valley.
        target_loss: the run succeeds once the loss is at most this.
    """

    dim: int = attrs.field(default=2, validator=at_least(2))
    b: float = attrs.field(default=100.0, validator=positive())
    target_loss: float = attrs.field(default=1e-3, validator=positive())


class Rosenbrock:
    name = "rosenbrock"
    default_steps = 3000

    def __init__(self, cfg: RosenbrockConfig) -> None:
        import numpy as np
        import tensorflow as tf

        self.config = cfg
        start = np.full(cfg.dim, -1.2, "float32")
        start[1::2] = 1.0
        self.x = tf.Variable(start, name="x")
        self.variables = [self.x]
        self.optimum = np.ones(cfg.dim, "float32")
        self.target_loss = cfg.target_loss

    def loss(self, step: Any = None) -> Any:
        import tensorflow as tf

        x, b = self.x, self.config.b
        return tf.reduce_sum(b * tf.square(x[1:] - tf.square(x[:-1]))
                             + tf.square(1.0 - x[:-1]))

    def metrics(self) -> dict[str, float]:
        import numpy as np

        return {"distance_to_optimum": float(np.linalg.norm(self.x.numpy() - self.optimum))}


@attrs.frozen(kw_only=True)
class NoisyQuadraticConfig:
    """Config of ``noisy_quadratic``, the noisy quadratic model (Zhang et al. 2019).

    Attributes:
        dim: number of coordinates.
        condition: ratio of the largest to the smallest curvature.
        noise: standard deviation of the per-step gradient noise at batch size 1.
        batch_size: the noise shrinks as ``1/sqrt(batch_size)``.
        seed: seed of the noise stream.
        target_loss: success threshold on the noise-free loss.
    """

    dim: int = attrs.field(default=10, validator=at_least(1))
    condition: float = attrs.field(default=10.0, validator=at_least(1.0))
    noise: float = attrs.field(default=1.0, validator=at_least(0.0))
    batch_size: int = attrs.field(default=32, validator=at_least(1))
    seed: int = 0
    target_loss: float = attrs.field(default=0.05, validator=positive())


class NoisyQuadratic:
    """``0.5 sum(h_i (x_i - c_i)^2)`` with ``c ~ N(0, noise^2 / (h batch_size))`` per step."""

    name = "noisy_quadratic"
    default_steps = 1000

    def __init__(self, cfg: NoisyQuadraticConfig) -> None:
        import numpy as np
        import tensorflow as tf

        self.config = cfg
        self.curvature = tf.constant(np.geomspace(1.0, cfg.condition, cfg.dim), tf.float32)
        self.x = tf.Variable(tf.ones([cfg.dim]) * 3.0, name="x")
        self.variables = [self.x]
        self.optimum = np.zeros(cfg.dim, "float32")
        self.target_loss = cfg.target_loss

    def loss(self, step: Any = 0) -> Any:
        import tensorflow as tf

        cfg = self.config
        seed = tf.stack([tf.constant(cfg.seed, tf.int64), tf.cast(step, tf.int64)])
        scale = cfg.noise / tf.sqrt(self.curvature * cfg.batch_size)
        center = tf.random.stateless_normal([cfg.dim], seed=seed) * scale
        return 0.5 * tf.reduce_sum(self.curvature * tf.square(self.x - center))

    def evaluation_loss(self) -> float:
        import tensorflow as tf

        return float(0.5 * tf.reduce_sum(self.curvature * tf.square(self.x)))

    def succeeded(self, final_loss: float) -> bool:
        """Judged on the noise-free loss: the noisy one never settles."""
        return self.evaluation_loss() <= self.target_loss

    def metrics(self) -> dict[str, float]:
        import numpy as np

        return {"distance_to_optimum": float(np.linalg.norm(self.x.numpy())),
                "noise_free_loss": self.evaluation_loss()}


@hookimpl
def gradpipe_register_problems(register: Any) -> None:
    register("quadratic", Quadratic, QuadraticConfig)
    register("rosenbrock", Rosenbrock, RosenbrockConfig)
    register("noisy_quadratic", NoisyQuadratic, NoisyQuadraticConfig)
