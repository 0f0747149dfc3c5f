"""Classification problems for ``gradpipe run`` on deterministic generated data.

``logistic_regression`` (two Gaussian classes) and ``mlp_classifier`` (two
interleaved spirals). Both stream mini-batches by step from a fixed shuffled
data set and judge success by accuracy on the whole set.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from gradpipe.plugin import (
    at_least,
    hookimpl,
    in_range,
)


class _Classifier:
    """Shared data stream, loss and accuracy for binary classifiers."""

    name = "classifier"
    variables: list[Any]

    def _setup(self, x: Any, y: Any, batch_size: int, target_accuracy: float) -> None:
        import tensorflow as tf

        self.features = tf.constant(x, tf.float32)
        self.labels = tf.constant(y, tf.float32)
        self.batch_size = min(batch_size, len(x))
        self.target_accuracy = target_accuracy

    def logits(self, x: Any) -> Any:
        raise NotImplementedError

    def loss(self, step: Any = 0) -> Any:
        import tensorflow as tf

        n = tf.shape(self.features)[0]
        start = (tf.cast(step, tf.int32) * self.batch_size) % n
        index = (start + tf.range(self.batch_size)) % n
        logits = self.logits(tf.gather(self.features, index))
        labels = tf.gather(self.labels, index)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))

    def accuracy(self) -> float:
        import tensorflow as tf

        predicted = tf.cast(self.logits(self.features) > 0, tf.float32)
        return float(tf.reduce_mean(tf.cast(predicted == self.labels, tf.float32)))

    def succeeded(self, final_loss: float) -> bool:
        return self.accuracy() >= self.target_accuracy

    def metrics(self) -> dict[str, float]:
        return {"accuracy": self.accuracy(), "target_accuracy": self.target_accuracy}


@attrs.frozen(kw_only=True)
class LogisticConfig:
    """Config of ``logistic_regression``.

    Attributes:
        samples: number of points.
        features: input dimension.
        separation: distance between the two class means.
        batch_size: points per step.
        seed: seed of the data.
        target_accuracy: success threshold on the whole data set.
    """

    samples: int = attrs.field(default=1024, validator=at_least(2))
    features: int = attrs.field(default=10, validator=at_least(1))
    separation: float = attrs.field(default=3.0, validator=at_least(0.0))
    batch_size: int = attrs.field(default=64, validator=at_least(1))
    seed: int = 0
    target_accuracy: float = attrs.field(default=0.9, validator=in_range(0.0, 1.0))


class LogisticRegression(_Classifier):
    name = "logistic_regression"
    default_steps = 1000

    def __init__(self, cfg: LogisticConfig) -> None:
        import numpy as np
        import tensorflow as tf

        rng = np.random.default_rng(cfg.seed)
        direction = rng.normal(size=cfg.features)
        direction /= np.linalg.norm(direction)
        y = rng.integers(0, 2, size=cfg.samples).astype("float32")
        x = rng.normal(size=(cfg.samples, cfg.features)) + np.outer(
            (y - 0.5) * cfg.separation, direction)
        self._setup(x.astype("float32"), y, cfg.batch_size, cfg.target_accuracy)
        self.w = tf.Variable(tf.zeros([cfg.features]), name="w")
        self.b = tf.Variable(0.0, name="b")
        self.variables = [self.w, self.b]

    def logits(self, x: Any) -> Any:
        import tensorflow as tf

        return tf.linalg.matvec(x, self.w) + self.b


@attrs.frozen(kw_only=True)
class MLPConfig:
    """Config of ``mlp_classifier``: a tanh MLP on two interleaved spirals.

    Attributes:
        samples: number of points.
        turns: how many times each spiral winds.
        noise: standard deviation of the point jitter.
        hidden: width of each hidden layer.
        layers: number of hidden layers.
        batch_size: points per step.
        seed: seed of the data and the initial weights.
        target_accuracy: success threshold on the whole data set.
    """

    samples: int = attrs.field(default=512, validator=at_least(4))
    turns: float = attrs.field(default=1.5, validator=at_least(0.25))
    noise: float = attrs.field(default=0.05, validator=at_least(0.0))
    hidden: int = attrs.field(default=32, validator=at_least(1))
    layers: int = attrs.field(default=2, validator=at_least(1))
    batch_size: int = attrs.field(default=128, validator=at_least(1))
    seed: int = 0
    target_accuracy: float = attrs.field(default=0.95, validator=in_range(0.0, 1.0))


class MLPClassifier(_Classifier):
    name = "mlp_classifier"
    default_steps = 2000

    def __init__(self, cfg: MLPConfig) -> None:
        import numpy as np
        import tensorflow as tf

        rng = np.random.default_rng(cfg.seed)
        half = cfg.samples // 2
        t = np.sqrt(rng.random(half)) * cfg.turns * 2 * np.pi
        arm = np.stack([t * np.cos(t), t * np.sin(t)], axis=1) / (cfg.turns * 2 * np.pi)
        x = np.concatenate([arm, -arm]) + rng.normal(scale=cfg.noise, size=(2 * half, 2))
        y = np.concatenate([np.zeros(half), np.ones(half)]).astype("float32")
        order = rng.permutation(2 * half)
        self._setup(x[order].astype("float32"), y[order], cfg.batch_size,
                    cfg.target_accuracy)
        sizes = [2] + [cfg.hidden] * cfg.layers + [1]
        self.weights = []
        for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
            limit = np.sqrt(6.0 / (n_in + n_out))  # Glorot uniform
            self.weights.append((
                tf.Variable(rng.uniform(-limit, limit, (n_in, n_out)).astype("float32"),
                            name=f"dense_{i}/kernel"),
                tf.Variable(tf.zeros([n_out]), name=f"dense_{i}/bias")))
        self.variables = [v for pair in self.weights for v in pair]

    def logits(self, x: Any) -> Any:
        import tensorflow as tf

        h = x
        for i, (kernel, bias) in enumerate(self.weights):
            h = h @ kernel + bias
            if i < len(self.weights) - 1:
                h = tf.tanh(h)
        return tf.squeeze(h, -1)


@hookimpl
def gradpipe_register_problems(register: Any) -> None:
    register("logistic_regression", LogisticRegression, LogisticConfig)
    register("mlp_classifier", MLPClassifier, MLPConfig)
