"""Built-in problems for ``gradpipe run``: ``quadratic`` and ``rosenbrock``.

Each problem has variables, a loss, a known optimum and a target loss, so any
pipeline can be run and judged with no user code.
"""

from __future__ import annotations

from typing import Any

import attrs

from gradpipe import hookimpl
from gradpipe.fields import at_least, positive


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


@hookimpl
def gradpipe_register_problems(register: Any) -> None:
    register("quadratic", Quadratic, QuadraticConfig)
    register("rosenbrock", Rosenbrock, RosenbrockConfig)
