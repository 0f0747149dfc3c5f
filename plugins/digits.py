"""``digits``: a real data set for ``gradpipe run``, offline.

scikit-learn's bundled handwritten digits (1,797 images of 8x8 pixels, ten
classes; no download). A fixed share is held out, and the summary reports the
accuracy on it as ``test_accuracy``. Install the data with
``pip install 'gradpipe[digits]'``.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from gradpipe.plugin import (
    GradpipeError,
    at_least,
    hookimpl,
    in_range,
)


@attrs.frozen(kw_only=True)
class DigitsConfig:
    """Config of ``digits``: a softmax classifier (with ``hidden`` tanh layers).

    Attributes:
        hidden: width of each hidden layer (0: no hidden layer, softmax regression).
        layers: number of hidden layers, when ``hidden`` > 0.
        test_fraction: share of the images held out for ``test_accuracy``.
        batch_size: images per step.
        seed: seed of the split, the order of the images and the initial weights.
        target_accuracy: the run succeeds once the test accuracy is at least this.
    """

    hidden: int = attrs.field(default=64, validator=at_least(0))
    layers: int = attrs.field(default=1, validator=at_least(1))
    test_fraction: float = attrs.field(default=0.2, validator=in_range(0.05, 0.5))
    batch_size: int = attrs.field(default=64, validator=at_least(1))
    seed: int = 0
    target_accuracy: float = attrs.field(default=0.9, validator=in_range(0.0, 1.0))


def _load_digits() -> tuple[Any, Any]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise GradpipeError("problem 'digits' needs scikit-learn, which is not installed: "
                            "pip install 'gradpipe[digits]'") from None
    data = load_digits()
    return data.data / 16.0, data.target  # pixels are 0..16


class Digits:
    name = "digits"
    default_steps = 600

    def __init__(self, cfg: DigitsConfig) -> None:
        import numpy as np
        import tensorflow as tf

        x, y = _load_digits()
        rng = np.random.default_rng(cfg.seed)
        order = rng.permutation(len(x))
        held = round(len(x) * cfg.test_fraction)
        test, train = order[:held], order[held:]
        self.train_x = tf.constant(x[train], tf.float32)
        self.train_y = tf.constant(y[train], tf.int32)
        self.test_x = tf.constant(x[test], tf.float32)
        self.test_y = tf.constant(y[test], tf.int32)
        self.batch_size = min(cfg.batch_size, len(train))
        self.target_accuracy = cfg.target_accuracy
        sizes = [x.shape[1]] + ([cfg.hidden] * cfg.layers if cfg.hidden else []) + [10]
        self.layers = []
        for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
            limit = np.sqrt(6.0 / (n_in + n_out))  # Glorot uniform, as Keras's Dense
            self.layers.append((
                tf.Variable(rng.uniform(-limit, limit, (n_in, n_out)).astype("float32"),
                            name=f"dense_{i}/kernel"),
                tf.Variable(tf.zeros([n_out]), name=f"dense_{i}/bias")))
        self.variables = [v for pair in self.layers for v in pair]

    def logits(self, x: Any) -> Any:
        import tensorflow as tf

        h = x
        for i, (kernel, bias) in enumerate(self.layers):
            h = h @ kernel + bias
            if i < len(self.layers) - 1:
                h = tf.tanh(h)
        return h

    def loss(self, step: Any = 0) -> Any:
        """Mean cross-entropy of mini-batch ``step`` of the training images (the batches
        walk through the shuffled training set, the same order for every pipeline)."""
        import tensorflow as tf

        n = tf.shape(self.train_x)[0]
        start = (tf.cast(step, tf.int32) * self.batch_size) % n
        index = (start + tf.range(self.batch_size)) % n
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            tf.gather(self.train_y, index), self.logits(tf.gather(self.train_x, index))))

    def _accuracy(self, x: Any, y: Any) -> float:
        import tensorflow as tf

        predicted = tf.argmax(self.logits(x), axis=-1, output_type=tf.int32)
        return float(tf.reduce_mean(tf.cast(predicted == y, tf.float32)))

    def succeeded(self, final_loss: float) -> bool:
        return self._accuracy(self.test_x, self.test_y) >= self.target_accuracy

    def metrics(self) -> dict[str, float]:
        # test_accuracy first: the headline metric of a comparison table.
        return {"test_accuracy": self._accuracy(self.test_x, self.test_y),
                "accuracy": self._accuracy(self.train_x, self.train_y),
                "target_accuracy": self.target_accuracy}


@hookimpl
def gradpipe_register_problems(register: Any) -> None:
    register("digits", Digits, DigitsConfig)
