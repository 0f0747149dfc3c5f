"""Train with checkpoints every K steps; optionally SIGKILL ourselves at a step.

Usage: python crash_train.py CKPT_DIR TOTAL_STEPS KILL_AT OUT.json
KILL_AT = -1 runs to the end. A rerun with the same CKPT_DIR resumes from the
latest checkpoint. Op determinism makes resumed and uninterrupted runs equal
bit for bit.
"""

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np

from gradpipe._lean_import import without_keras_extras  # 3 s less to start, as the CLI

with without_keras_extras():
    import tensorflow as tf

import gradpipe

K = 3
PIPELINE = {
    "loss_scale": {"kind": "dynamic", "initial_loss_scale": 1024.0, "increment_period": 4},
    "schedules": {"lr": {"kind": "warmup", "warmup_steps": 5,
                         "after": {"kind": "exp_decay", "learning_rate": 0.05,
                                   "decay_steps": 10, "decay_rate": 0.5}}},
    "pipeline": {"accumulation_steps": 2},
    "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                   {"kind": "adam", "learning_rate": "@lr"}],
    "convergence": [{"kind": "loss_not_decreasing", "atol": 1e-9}],
}


def main() -> None:
    ckpt_dir, total, kill_at, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(total, 16, 4)).astype("f4")
    y = (x @ rng.normal(size=(4, 1)) + 0.5).astype("f4")
    bad = rng.random(total) < 0.15  # NaN steps: skipped-step accounting survives too

    pipe = gradpipe.build(PIPELINE)
    w = tf.Variable(rng.normal(size=(4, 8)).astype("f4"), name="w")
    v = tf.Variable(rng.normal(size=(8, 1)).astype("f4"), name="v")
    step = tf.Variable(0, dtype=tf.int64, name="step")
    # The pipeline is never built here: a resumed run restores into it before its
    # state exists, and its first apply_gradients, inside train, builds it restored.
    ckpt = tf.train.Checkpoint(pipeline=pipe, w=w, v=v, step=step)
    manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=2)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint)

    @tf.function
    def train(xb, yb, poison):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.tanh(xb @ w) @ v - yb))
            scaled = pipe.scale_loss(loss)
        grads = tape.gradient(scaled, [w, v])
        grads = [grads[0] + poison, grads[1]]
        return pipe.apply_gradients(zip(grads, [w, v]))

    while int(step.numpy()) < total:
        i = int(step.numpy())
        train(tf.constant(x[i]), tf.constant(y[i]), tf.constant(np.nan if bad[i] else 0.0,
                                                                tf.float32))
        step.assign_add(1)
        if (i + 1) % K == 0:
            manager.save(checkpoint_number=i + 1)
        if i + 1 == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    with open(out, "w") as f:
        json.dump({"w": w.numpy().tolist(), "v": v.numpy().tolist(),
                   "iterations": int(pipe.iterations.numpy()),
                   "skipped": int(pipe.skipped_steps.numpy()),
                   "scale": float(pipe.loss_scale.numpy())}, f)


if __name__ == "__main__":
    main()
