"""Train a two-tower rating model with its tables on parameter servers.

Run `gradpipe serve examples/parameter_server/pipeline.toml` in another terminal
first, then `python examples/parameter_server/train.py [STEPS [CHECKPOINT_DIR]]`.
This program is the coordinator: it builds the model and the pipeline, and
schedules steps that the two workers run asynchronously. It saves a checkpoint
every 200 steps and, started again, goes on from the latest one (also the way
back after a parameter server fails: restart the server, then this program).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np
import tensorflow as tf

import gradpipe

HERE = Path(__file__).parent
USERS, ITEMS, DIM, BATCH = 200_000, 50_000, 32, 256
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
CHECKPOINTS = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "checkpoints"

pipe = gradpipe.load(HERE / "pipeline.toml")
strategy = pipe.strategy
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)


def ratings() -> tf.data.Dataset:
    """Endless synthetic ratings: a hidden taste of each user and a hidden quality of each item, the
    popular users and items far more often than the rest, as in real traffic. Each
    worker draws its own stream; a restarted run does not replay the old one."""
    def sample(draws: tf.Tensor) -> tuple:
        u = (tf.cast(draws % 1_000_003, tf.float32) / 1_000_003.0) ** 4
        user = tf.cast(u[0] * USERS, tf.int64)
        item = tf.cast(u[1] * ITEMS, tf.int64)
        taste, quality = tf.cast(user % 2, tf.float32), tf.cast(item % 2, tf.float32)
        rating = 1.0 + 2.0 * taste + 2.0 * quality
        return (user, item), rating
    return tf.data.Dataset.random().batch(2).map(sample).batch(BATCH).prefetch(2)


class RowLookup(keras.layers.Embedding):
    """An Embedding that asks each shard for its own rows only. Keras 3's Embedding
    converts its table to one tensor at every call: sharded, the whole table would
    travel to the worker each step."""

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        return tf.nn.embedding_lookup(self.embeddings.value, ids)


with strategy.scope():
    user, item = keras.Input((), dtype="int64"), keras.Input((), dtype="int64")
    u = RowLookup(USERS, DIM, name="users")(user)
    v = RowLookup(ITEMS, DIM, name="items")(item)
    score = keras.layers.Dense(1, name="score")(keras.layers.Concatenate()([u, v, u * v]))
    model = keras.Model([user, item], score)

pipe.build(model.trainable_variables)
print(pipe.plan)
sources = gradpipe.distribute.gradient_sources(model.trainable_variables)
checkpoint = tf.train.Checkpoint(model=gradpipe.distribute.weights_by_path(model),
                                 pipeline=pipe)
manager = tf.train.CheckpointManager(checkpoint, CHECKPOINTS, max_to_keep=2)
if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint).assert_consumed()
    print(f"restored {manager.latest_checkpoint} at step {int(pipe.iterations.numpy())}")

dataset = coordinator.create_per_worker_dataset(ratings)
batches = iter(dataset)


@tf.function
def step(batches: tf.distribute.DistributedIterator) -> tf.Tensor:
    def replica(features: tuple, rating: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(features)[:, 0] - rating) ** 2)
        grads = tape.gradient(pipe.scale_loss(loss), sources)
        pipe.apply_gradients(zip(grads, sources))
        return loss
    return strategy.run(replica, args=next(batches))


losses = []
while int(pipe.iterations.numpy()) < STEPS:
    losses = [coordinator.schedule(step, args=(batches,)) for _ in range(200)]
    coordinator.join()
    done = int(pipe.iterations.numpy())
    recent = np.mean([loss.fetch() for loss in losses[-50:]])
    print(f"step {done}: loss {recent:.4f}", flush=True)
    manager.save(checkpoint_number=done)
