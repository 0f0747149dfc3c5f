"""pipe.keras_optimizer() in compile()/fit(): parity, mixed precision, saving, callbacks."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import gradpipe
from conftest import assert_close
from gradpipe import GradpipeError

RNG = np.random.default_rng(0)
X = RNG.normal(size=(256, 4)).astype("f4")
Y = (X @ RNG.normal(size=(4, 1))).astype("f4")
CLIP_ADAM = {"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                            {"kind": "adam", "learning_rate": 0.01}]}


def model(dtype=None):
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)),
                             keras.layers.Dense(8, activation="relu", dtype=dtype),
                             keras.layers.Dense(1, dtype="float32")])


def fit(m, optimizer, jit=False, epochs=2, **kwargs):
    m.compile(optimizer=optimizer, loss="mse", jit_compile=jit)
    m.fit(X, Y, batch_size=32, epochs=epochs, verbose=0, shuffle=False, **kwargs)
    return m


def weights(m):
    return [np.asarray(w) for w in m.get_weights()]


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_fit_matches_keras_adam_global_clipnorm(jit):
    """Two epochs of fit: same weights as Adam(global_clipnorm=1) (atol 1e-6)."""
    native = fit(model(), keras.optimizers.Adam(0.01, global_clipnorm=1.0), jit)
    pipe = gradpipe.build(CLIP_ADAM)
    ours = fit(model(), pipe.keras_optimizer(), jit)
    assert_close(weights(ours), weights(native), rtol=0, atol=1e-6)
    assert int(pipe.iterations.numpy()) == 16


def test_fit_matches_loss_scale_optimizer_under_mixed_float16():
    """mixed_float16: Keras wraps Adam in LossScaleOptimizer; ours is not wrapped again."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        native = fit(model(), keras.optimizers.Adam(0.01))
        assert isinstance(native.optimizer, keras.optimizers.LossScaleOptimizer)
        pipe = gradpipe.build({"loss_scale": {"kind": "dynamic", "min_loss_scale": 0.0,
                                              "increment_period": 5},
                               "transforms": [{"kind": "adam", "learning_rate": 0.01}]})
        # growth every 5 steps on both sides: compare the scale trajectories too
        native = fit(model(), keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Adam(0.01), dynamic_growth_steps=5))
        optimizer = pipe.keras_optimizer()
        ours = fit(model(), optimizer)
        assert ours.optimizer is optimizer  # compile did not wrap it
        assert float(pipe.loss_scale) == float(native.optimizer.dynamic_scale)
        assert_close(weights(ours), weights(native), rtol=0, atol=1e-6)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_save_load_and_continue_identically(tmp_path):
    """.keras round trip: the resolved TOML and the state by name; training continues."""
    pipe = gradpipe.build(CLIP_ADAM)
    m = fit(model(), pipe.keras_optimizer())
    m.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert loaded.optimizer.pipeline.spec == pipe.spec
    assert int(loaded.optimizer.iterations.numpy()) == 16
    m.fit(X, Y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    loaded.fit(X, Y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    assert_close(weights(loaded), weights(m), rtol=0, atol=0)


def test_loading_a_different_layout_names_the_difference():
    pipe = gradpipe.build(CLIP_ADAM)
    optimizer = pipe.keras_optimizer()
    m = fit(model(), optimizer, epochs=1)
    store = {}
    optimizer.save_own_variables(store)
    del store["slots|1_adam|mu|sequential.dense.kernel" if
              "slots|1_adam|mu|sequential.dense.kernel" in store else
              next(k for k in store if k.startswith("slots|1_adam|mu|"))]
    other = gradpipe.build(CLIP_ADAM).keras_optimizer()
    other.build(m.trainable_variables)
    with pytest.raises(GradpipeError, match="missing from the saved state: slots/1_adam/mu/"):
        other.load_own_variables(store)


def test_backup_and_restore_resumes_identically(tmp_path):
    """An interrupted fit resumed by BackupAndRestore ends where an uninterrupted one does."""
    reference = fit(model(), gradpipe.build(CLIP_ADAM).keras_optimizer(), epochs=4)

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("interrupted")

    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    m = model()
    m.compile(optimizer=gradpipe.build(CLIP_ADAM).keras_optimizer(), loss="mse")
    with pytest.raises(RuntimeError, match="interrupted"):
        m.fit(X, Y, batch_size=32, epochs=4, verbose=0, shuffle=False,
              callbacks=[backup, Interrupt()])
    resumed = model()
    resumed.compile(optimizer=gradpipe.build(CLIP_ADAM).keras_optimizer(), loss="mse")
    resumed.fit(X, Y, batch_size=32, epochs=4, verbose=0, shuffle=False, callbacks=[backup])
    assert int(resumed.optimizer.iterations.numpy()) == 32
    assert_close(weights(resumed), weights(reference), rtol=0, atol=1e-7)


def test_fit_under_mirrored_equals_one_device():
    """fit on 2 logical CPUs: no second reduction or clipping (same weights, atol 1e-5)."""
    single = fit(model(), gradpipe.build(CLIP_ADAM).keras_optimizer())
    pipe = gradpipe.build({**CLIP_ADAM, "placement": {"kind": "mirrored",
                                                      "devices": ["/cpu:0", "/cpu:1"]}})
    with pipe.strategy.scope():
        m = model()
        m.compile(optimizer=pipe.keras_optimizer(), loss="mse")
    m.fit(X, Y, batch_size=32, epochs=2, verbose=0, shuffle=False)
    assert_close(weights(m), weights(single), rtol=1e-5, atol=1e-5)


def test_learning_rate_is_read_from_the_pipeline():
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": {
        "kind": "linear", "start": 0.1, "end": 0.0, "steps": 10}}]})
    optimizer = pipe.keras_optimizer()
    assert float(optimizer.learning_rate) == pytest.approx(0.1)
    with pytest.raises(GradpipeError, match="use a schedule there"):
        optimizer.learning_rate = 0.5
