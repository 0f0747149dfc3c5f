"""tf-keras ``model.fit`` under ParameterServerStrategy: a pipeline against legacy Adam.

Usage: python ps_tf_keras_fit.py -- prints one JSON line. Servers on localhost in
this process (``gradpipe.distribute.local_cluster``); tf-keras runs the steps on
the workers through its own ClusterCoordinator.
"""

from __future__ import annotations

import json
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
import tf_keras as keras

import gradpipe

rng = np.random.default_rng(0)
X = rng.integers(0, 1000, size=(320, 4)).astype("int64")
Y = rng.normal(size=(320, 1)).astype("f4")


def fitted(optimizer: object) -> tuple[keras.Model, list[float]]:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.layers.Input((4,), dtype="int64"),
                              keras.layers.Embedding(1000, 8), keras.layers.Flatten(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16).repeat()
    history = model.fit(data, epochs=2, steps_per_epoch=10, verbose=0)
    return model, history.history["loss"]


def main() -> None:
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(1024, 2)
    strategy = tf.distribute.ParameterServerStrategy(
        gradpipe.distribute.local_cluster(workers=1, ps=2), variable_partitioner=partitioner)
    with strategy.scope():
        pipe = gradpipe.build({"transforms": [{"kind": "adam", "learning_rate": 0.01}]})
        ours, our_losses = fitted(pipe.keras_optimizer())
        theirs, their_losses = fitted(keras.optimizers.legacy.Adam(0.01))
    print(json.dumps({
        "variables": [v.name for v in ours.trainable_variables],
        "iterations": int(pipe.iterations.numpy()),
        "losses": [our_losses, their_losses],
        "max_difference": max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in
                              zip(ours.trainable_variables, theirs.trainable_variables)),
        "plan": str(pipe.plan)}), flush=True)
    os._exit(0)  # the servers in this process would otherwise wait for each other


if __name__ == "__main__":
    main()
