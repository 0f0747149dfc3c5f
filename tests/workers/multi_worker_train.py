"""One worker of a two-process MultiWorkerMirroredStrategy run (TF_CONFIG from the parent).

Usage: python multi_worker_train.py [--lazy] OUT.json   (or --single OUT.json for the
reference). Trains linear regression with a gradpipe pipeline for STEPS steps, each
worker on its own half of every global batch, and writes the final weights as JSON.
With --lazy the pipeline is not built beforehand: its first apply_gradients, inside
strategy.run, builds it.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np

from gradpipe._lean_import import without_keras_extras  # 3 s less to start, as the CLI

with without_keras_extras():
    import tensorflow as tf

import gradpipe

STEPS, GLOBAL_BATCH, FEATURES = 25, 32, 5
TRANSFORMS = [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
              {"kind": "adam", "learning_rate": 0.05}]


def data():
    rng = np.random.default_rng(42)
    x = rng.normal(size=(STEPS, GLOBAL_BATCH, FEATURES)).astype("f4")
    y = x @ rng.normal(size=(FEATURES, 1)).astype("f4") + 0.1
    return x, y


def main() -> None:
    single = sys.argv[1] == "--single"
    lazy = "--lazy" in sys.argv
    out = sys.argv[-1]
    placement = {"kind": "default"} if single else {"kind": "multi_worker"}
    pipe = gradpipe.build({"placement": placement,
                           "loss_scale": {"kind": "dynamic", "initial_loss_scale": 1024.0},
                           "transforms": TRANSFORMS})
    strategy = pipe.strategy
    with strategy.scope():
        w = tf.Variable(tf.zeros([FEATURES, 1]), name="w")
        b = tf.Variable(0.0, name="b")
    if not lazy:
        pipe.build([w, b])
    x, y = data()
    task = 0 if single else json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    shards = 1 if single else 2
    per = GLOBAL_BATCH // shards

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(xb @ w + b - yb))
            scaled = pipe.scale_loss(loss)  # / number of replicas with reduction = mean
        grads = tape.gradient(scaled, [w, b])
        return pipe.apply_gradients(zip(grads, [w, b]))

    run = tf.function(lambda xb, yb: strategy.run(step, (xb, yb)))
    for i in range(STEPS):
        run(tf.constant(x[i, task * per:(task + 1) * per]),
            tf.constant(y[i, task * per:(task + 1) * per]))
    result = {"w": w.numpy().tolist(), "b": float(b.numpy()),
              "iterations": int(pipe.iterations.numpy()),
              "replicas": int(strategy.num_replicas_in_sync)}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
