"""Write large checkpoints in a loop; the parent SIGKILLs us mid-write.

Usage: python checkpoint_writer.py DIR. Every variable holds the step number of
the save, so a checkpoint that mixes two saves is detectable.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from gradpipe._lean_import import without_keras_extras  # 3 s less to start, as the CLI

with without_keras_extras():
    import tensorflow as tf

import gradpipe


def main() -> None:
    pipe = gradpipe.build({"transforms": [{"kind": "adam"}]})
    big = [tf.Variable(tf.zeros([2_000_000]), name=f"w{i}") for i in range(4)]
    pipe.build(big)
    ckpt = tf.train.Checkpoint(pipeline=pipe, weights=big)
    manager = tf.train.CheckpointManager(ckpt, sys.argv[1], max_to_keep=2)
    step = 0
    while True:
        step += 1
        for var in big:
            var.assign(tf.fill(var.shape, float(step)))
        for slot in pipe.named_variables().values():
            if slot.dtype == tf.float32 and slot.shape.rank:
                slot.assign(tf.fill(slot.shape, float(step)))
        pipe.iterations.assign(step)
        manager.save(checkpoint_number=step)
        print(step, flush=True)


if __name__ == "__main__":
    main()
