"""pipe.keras_optimizer() under tf-keras (Keras 2) against tf-keras's and TFRS's own
optimizers, in compile()/fit(). Prints one JSON object of measurements.

Runs in its own process with TF_USE_LEGACY_KERAS=1, so that tf.keras is tf-keras.
Usage: python tf_keras_fit.py WORKDIR
"""

import json
import os
import sys
import warnings

assert os.environ.get("TF_USE_LEGACY_KERAS") == "1"
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import tensorflow_recommenders as tfrs  # noqa: E402

import gradpipe  # noqa: E402

keras = tf.keras
WORKDIR = sys.argv[1]
RNG = np.random.default_rng(0)
X = RNG.normal(size=(256, 4)).astype("f4")
Y = (X @ RNG.normal(size=(4, 1))).astype("f4")
CLIP_ADAM = {"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                            {"kind": "adam", "learning_rate": 0.01}]}


def model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1, dtype="float32")])


def fit(m, optimizer, epochs=2, y=Y, **kwargs):
    m.compile(optimizer=optimizer, loss="mse")
    return m.fit(X, y, batch_size=32, epochs=epochs, verbose=0, shuffle=False, **kwargs)


def difference(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a.get_weights(), b.get_weights()))


def adam_parity():
    native, ours = model(), model()
    fit(native, keras.optimizers.Adam(0.01, global_clipnorm=1.0))
    optimizer = gradpipe.build(CLIP_ADAM).keras_optimizer()
    fit(ours, optimizer)
    return {"difference": difference(ours, native), "iterations": int(optimizer.iterations),
            "is_tf_keras_optimizer": isinstance(ours.optimizer, keras.optimizers.Optimizer),
            "compiled_is_ours": ours.optimizer is optimizer}


def save_load():
    m = model()
    fit(m, gradpipe.build(CLIP_ADAM).keras_optimizer())
    path = os.path.join(WORKDIR, "m.keras")
    m.save(path)
    loaded = keras.models.load_model(path)
    same_spec = loaded.optimizer.pipeline.spec == m.optimizer.pipeline.spec
    iterations = int(loaded.optimizer.iterations)
    for each in (m, loaded):
        each.fit(X, Y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    return {"difference": difference(loaded, m), "same_spec": same_spec,
            "iterations": iterations}


def checkpoint():
    """tf.train.Checkpoint into a second instance of the model, restored before the
    optimizer is built: the state is matched by name and training continues exactly."""
    reference = model()
    fit(reference, gradpipe.build(CLIP_ADAM).keras_optimizer(), epochs=2)
    first = model()
    fit(first, gradpipe.build(CLIP_ADAM).keras_optimizer(), epochs=1)
    path = tf.train.Checkpoint(model=first, optimizer=first.optimizer).save(
        os.path.join(WORKDIR, "ck"))
    second = model()
    optimizer = gradpipe.build(CLIP_ADAM).keras_optimizer()
    second.compile(optimizer=optimizer, loss="mse")
    tf.train.Checkpoint(model=second, optimizer=optimizer).restore(path)
    second.fit(X, Y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    names = list(optimizer.pipeline.named_variables())
    return {"difference": difference(second, reference), "names": names,
            "iterations": int(optimizer.iterations)}


def lr_callbacks():
    def callbacks():
        return [keras.callbacks.LearningRateScheduler(lambda e, lr: lr * 0.5 if e else lr),
                keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                                  min_delta=10.0)]

    native, ours = model(), model()
    expected = fit(native, keras.optimizers.Adam(0.01, global_clipnorm=1.0), epochs=4,
                   callbacks=callbacks()).history["lr"]
    rates = fit(ours, gradpipe.build(CLIP_ADAM).keras_optimizer(), epochs=4,
                callbacks=callbacks()).history["lr"]
    return {"native": [float(r) for r in expected], "ours": [float(r) for r in rates],
            "difference": difference(ours, native),
            "current": [float(keras.backend.get_value(m.optimizer.lr)) for m in (native, ours)]}


class Scale(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.scales = []

    def on_train_batch_end(self, batch, logs=None):
        self.scales.append(float(self.model.optimizer.loss_scale))


def mixed(y):
    """mixed_float16, no [loss_scale]: the scaler tf-keras's compile would add."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        native, ours = model(), model()
        native_scales, our_scales = Scale(), Scale()
        fit(native, keras.optimizers.Adam(0.01), y=y, callbacks=[native_scales])
        pipe = gradpipe.build({"transforms": [{"kind": "adam", "learning_rate": 0.01}]})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit(ours, pipe.keras_optimizer(), y=y, callbacks=[our_scales])
        return {"native_wrapper": type(native.optimizer).__name__,
                "native_scales": native_scales.scales, "our_scales": our_scales.scales,
                "difference": difference(ours, native),
                "native_iterations": int(native.optimizer.iterations),
                "our_iterations": int(pipe.iterations), "skipped": int(pipe.skipped_steps),
                "warnings": [str(w.message) for w in caught if "gradpipe" in str(w.message)],
                "toml_has_loss_scale": "[loss_scale]" in pipe.to_toml()}
    finally:
        keras.mixed_precision.set_global_policy("float32")


def mirrored():
    single = model()
    fit(single, gradpipe.build(CLIP_ADAM).keras_optimizer())
    pipe = gradpipe.build({**CLIP_ADAM, "placement": {"kind": "mirrored",
                                                      "devices": ["/cpu:0", "/cpu:1"]}})
    with pipe.strategy.scope():
        m = model()
        m.compile(optimizer=pipe.keras_optimizer(), loss="mse")
    m.fit(X, Y, batch_size=32, epochs=2, verbose=0, shuffle=False)
    return {"difference": difference(m, single), "iterations": int(pipe.iterations.numpy())}


class Ranking(tfrs.models.Model):
    """A TFRS ranking model: user and item embeddings (sparse gradients), a scorer."""

    def __init__(self):
        super().__init__()
        keras.utils.set_random_seed(3)
        self.users = keras.layers.Embedding(50, 8)
        self.items = keras.layers.Embedding(40, 8)
        self.scorer = keras.Sequential([keras.layers.Dense(16, activation="relu"),
                                        keras.layers.Dense(1)])
        self.task = tfrs.tasks.Ranking(loss=keras.losses.MeanSquaredError())

    def compute_loss(self, features, training=False):
        embedded = tf.concat([self.users(features["user"]), self.items(features["item"])], 1)
        return self.task(labels=features["rating"], predictions=self.scorer(embedded))


CLIPPY = {"learning_rate": 0.1, "initial_accumulator_value": 0.1,
          "variable_relative_threshold": 0.1, "accumulator_relative_threshold": 0.0,
          "absolute_threshold": 1e-7, "epsilon": 1e-7}


def tfrs_ranking():
    rng = np.random.default_rng(5)
    data = {"user": rng.integers(0, 50, 512), "item": rng.integers(0, 40, 512),
            "rating": rng.integers(1, 6, 512).astype("f4")}
    results = {}
    for name, optimizer in (
            ("tfrs", tfrs.experimental.optimizers.ClippyAdagrad(**CLIPPY)),
            ("gradpipe", gradpipe.build({"transforms": [{"kind": "clippy_adagrad", **CLIPPY}]})
             .keras_optimizer())):
        m = Ranking()
        m.compile(optimizer=optimizer)
        history = m.fit(tf.data.Dataset.from_tensor_slices(data).batch(64), epochs=3,
                        verbose=0)
        results[name] = (m, history.history["loss"])
    (ours, our_loss), (native, native_loss) = results["gradpipe"], results["tfrs"]
    return {"difference": difference(ours, native), "our_loss": our_loss,
            "native_loss": native_loss,
            "largest_weight": max(float(np.abs(w).max()) for w in native.get_weights())}


print(json.dumps({"adam": adam_parity(), "save_load": save_load(),
                  "checkpoint": checkpoint(), "lr_callbacks": lr_callbacks(),
                  "mixed_no_overflow": mixed(Y), "mixed_overflow": mixed(Y * 300),
                  "mirrored": mirrored(), "tfrs": tfrs_ranking()}))
