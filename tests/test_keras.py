"""pipe.keras_optimizer() in compile()/fit(): parity, mixed precision, saving, callbacks."""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import forked
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


def fit(m, optimizer, jit=False, epochs=2, y=Y, **kwargs):
    m.compile(optimizer=optimizer, loss="mse", jit_compile=jit)
    m.fit(X, y, batch_size=32, epochs=epochs, verbose=0, shuffle=False, **kwargs)
    return m


def weights(m):
    return [np.asarray(w) for w in m.get_weights()]


def test_a_loss_scale_optimizer_cannot_wrap_the_pipeline_optimizer():
    """Wrapped, the step would divide each gradient by the wrapper's scale and again by
    the pipeline's (a newcomer measured updates 16,384 times too small): refused when
    the wrapper is made, naming what to write instead."""
    optimizer = gradpipe.build({"transforms": [{"kind": "sgd"}]}).keras_optimizer()
    with pytest.raises(gradpipe.GradpipeError, match="a LossScaleOptimizer cannot wrap "
                       r"gradpipe's Keras optimizer.*\[loss_scale\] table"):
        keras.optimizers.LossScaleOptimizer(optimizer)


def test_compiling_with_the_pipeline_itself_names_keras_optimizer():
    """Keras's error for an optimizer it cannot read shows the object: the pipeline
    says what Keras takes instead."""
    pipe = gradpipe.build(CLIP_ADAM)
    with pytest.raises(ValueError, match=r"<gradpipe pipeline \[clip_by_global_norm, adam\]; "
                                         r"Keras takes pipe\.keras_optimizer\(\)>"):
        model().compile(optimizer=pipe, loss="mse")


@pytest.mark.slow
@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_fit_matches_keras_adam_global_clipnorm(jit):
    """Two epochs of fit: same weights as Adam(global_clipnorm=1) (atol 1e-6)."""
    native = fit(model(), keras.optimizers.Adam(0.01, global_clipnorm=1.0), jit)
    pipe = gradpipe.build(CLIP_ADAM)
    ours = fit(model(), pipe.keras_optimizer(), jit)
    assert_close(weights(ours), weights(native), rtol=0, atol=1e-6)
    assert int(pipe.iterations.numpy()) == 16


class CountedTraces(keras.Sequential):
    """A model whose train step counts the times it is traced."""

    traces = 0

    def train_step(self, data):
        self.traces += 1  # Python: runs once per trace
        return super().train_step(data)


def test_the_train_step_is_traced_once_while_the_pipeline_builds_in_it():
    """The pipeline builds inside fit's first trace, as Keras optimizers do, without
    making TensorFlow trace the step again (it does so for variables a trace creates;
    the pipeline's are made eagerly). A custom loop's first step likewise. Both end
    where a pipeline built beforehand ends."""
    ends = []
    for built_first in (False, True):
        keras.utils.set_random_seed(1)
        counted = CountedTraces([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                 keras.layers.Dense(1)])
        optimizer = gradpipe.build(CLIP_ADAM).keras_optimizer()
        if built_first:
            optimizer.build(counted.trainable_variables)
        fit(counted, optimizer)
        assert counted.traces == 1
        ends.append(weights(counted))
    assert_close(ends[0], ends[1], rtol=0, atol=0)
    pipe, var, traces = gradpipe.build(CLIP_ADAM), tf.Variable([1.0, 2.0]), []

    @tf.function
    def step(g):
        traces.append(1)
        return pipe.apply_gradients([(g, var)])

    for _ in range(2):
        step(tf.constant([1.0, 1.0]))
    assert len(traces) == 1 and int(pipe.iterations) == 2


@pytest.mark.slow
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


class LossScales(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.scales = []

    def on_train_batch_end(self, batch, logs=None):
        self.scales.append(float(self.model.optimizer.dynamic_scale))


def test_mixed_float16_without_a_loss_scale_adds_the_one_compile_would_add():
    """No [loss_scale] under mixed_float16: Keras's dynamic LossScaleOptimizer defaults,
    said once. Gradients scaled by 2**15 overflow float16 at first: the scale backs
    off on the same steps as Keras's, and the weights end the same."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        native, native_scales = model(), LossScales()
        fit(native, keras.optimizers.Adam(0.01), y=Y * 300, callbacks=[native_scales])
        assert isinstance(native.optimizer, keras.optimizers.LossScaleOptimizer)
        pipe = gradpipe.build({"transforms": [{"kind": "adam", "learning_rate": 0.01}]})
        ours, our_scales = model(), LossScales()
        with pytest.warns(UserWarning, match=(
                r'has no \[loss_scale\]; it uses keras\'s default, as compile\(\) would: '
                r'\[loss_scale\] kind = "dynamic", initial_loss_scale = 32768\.0, '
                r"increment_period = 2000, min_loss_scale = 0\.0\. Put a \[loss_scale\] "
                r"table in the pipeline file to choose")) as said:
            fit(ours, pipe.keras_optimizer(), y=Y * 300, callbacks=[our_scales])
        # named at the user's line, not inside gradpipe's or Keras's code
        assert {w.filename for w in said if "loss_scale" in str(w.message)} == {__file__}
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert our_scales.scales == native_scales.scales
    assert our_scales.scales[:8] == [2.0**k for k in range(14, 6, -1)]  # 8 steps skipped
    assert int(pipe.skipped_steps.numpy()) == 8
    assert_close(weights(ours), weights(native), rtol=0, atol=1e-6)
    assert "[loss_scale]" in pipe.to_toml()  # a .keras file rebuilds it with the scaler


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


@pytest.mark.slow
def test_a_new_process_loads_the_model_after_importing_gradpipe_keras(tmp_path):
    """Keras resolves gradpipe>PipelineOptimizer only once it is registered: a script
    that only loads imports gradpipe.keras first, and training continues exactly."""
    import sys

    m = fit(model(), gradpipe.build(CLIP_ADAM).keras_optimizer())
    m.save(tmp_path / "m.keras")
    m.fit(X, Y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    code = f"""
import numpy as np, keras
import gradpipe.keras
m = keras.models.load_model({str(tmp_path / "m.keras")!r})
assert type(m.optimizer).__name__ == "PipelineOptimizer", type(m.optimizer)
m.fit(np.load({str(tmp_path / "x.npy")!r}), np.load({str(tmp_path / "y.npy")!r}),
      batch_size=32, epochs=1, verbose=0, shuffle=False)
np.savez({str(tmp_path / "w.npz")!r}, *m.get_weights())
"""
    result = forked.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = np.load(tmp_path / "w.npz")
    assert_close([loaded[f"arr_{i}"] for i in range(len(loaded.files))], weights(m),
                 rtol=0, atol=0)


@pytest.mark.parametrize("imports", [
    "import keras, gradpipe",
    "import gradpipe; assert 'keras' not in sys.modules; import keras",
], ids=["keras_first", "gradpipe_first"])
@pytest.mark.slow
def test_a_new_process_loads_the_model_after_import_gradpipe_alone(tmp_path, imports):
    """`import gradpipe`, before or after Keras, is enough to load a saved pipeline
    optimizer, and still imports no TensorFlow itself."""
    import subprocess
    import sys

    m = fit(model(), gradpipe.build(CLIP_ADAM).keras_optimizer())
    m.save(tmp_path / "m.keras")
    code = f"""
import sys
{imports}
m = keras.models.load_model({str(tmp_path / "m.keras")!r})
assert type(m.optimizer).__name__ == "PipelineOptimizer", type(m.optimizer)
assert int(m.optimizer.iterations.numpy()) == 16
assert "gradpipe.keras" not in sys.modules
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_fit_under_mirrored_drifts_from_one_device_no_more_than_keras():
    """150 steps of Adam on an embedding model (sparse gradients): on 2 logical CPUs
    the gradients are summed in another order, so float32 rounding makes the weights
    drift from one device's, more the longer the run (3e-8 after 16 steps, 2.7e-7
    after 150, measured), as those of Keras's own Adam under MirroredStrategy do."""
    steps, batch, vocabulary = 150, 32, 1000
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocabulary, size=(steps * batch, 8))
    targets = rng.normal(size=(steps * batch, 1)).astype("f4")
    cpus = ["/cpu:0", "/cpu:1"]

    def trained(optimizer, strategy=None):
        with strategy.scope() if strategy else contextlib.nullcontext():
            keras.utils.set_random_seed(1)
            m = keras.Sequential([keras.Input((8,), dtype="int32"),
                                  keras.layers.Embedding(vocabulary, 16),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
            m.compile(optimizer=optimizer(), loss="mse")
        m.fit(tokens, targets, batch_size=batch, epochs=1, verbose=0, shuffle=False)
        assert int(m.optimizer.iterations.numpy()) == steps
        return weights(m)

    def drift(a, b):
        return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))

    adam = {"transforms": [{"kind": "adam", "learning_rate": 0.01}]}
    mirrored = gradpipe.build({**adam, "placement": {"kind": "mirrored", "devices": cpus}})
    ours = drift(trained(lambda: mirrored.keras_optimizer(), mirrored.strategy),
                 trained(lambda: gradpipe.build(adam).keras_optimizer()))
    # the same MirroredStrategy: a second one over these devices would reuse its
    # collective keys (see plugins/placement.py)
    assert type(mirrored.strategy) is tf.distribute.MirroredStrategy
    theirs = drift(trained(lambda: keras.optimizers.Adam(0.01), mirrored.strategy),
                   trained(lambda: keras.optimizers.Adam(0.01)))
    assert 0 < ours <= 2e-6 and theirs <= 2e-6, (ours, theirs)


def test_a_scheduled_learning_rate_is_read_and_cannot_be_set():
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": {
        "kind": "linear", "start": 0.1, "end": 0.0, "steps": 10}}]})
    optimizer = pipe.keras_optimizer()
    assert float(optimizer.learning_rate) == pytest.approx(0.1)
    with pytest.raises(GradpipeError, match=(
            r"cannot be set: transforms\[0\]\.learning_rate follows a schedule; a scheduled "
            r"rate cannot be set \(Keras refuses too, for a LearningRateSchedule\)")):
        optimizer.learning_rate = 0.5
    assert "learning_rate" not in pipe.named_variables()


def test_the_rate_reads_and_assigns_as_keras_rate_variable_does():
    """Code written for Keras's optimizers reads ``optimizer.learning_rate`` as a
    tensor (float, numpy, arithmetic) and sets it with ``.assign(x)``: the same on the
    pipeline's, where the assignment is validated as ``pipe.learning_rate = x``."""
    pipe = gradpipe.build({"transforms": [{"kind": "adam", "learning_rate": 1e-3}]})
    native = keras.optimizers.Adam(1e-3)
    ours = pipe.keras_optimizer()
    for optimizer in (native, ours):
        rate = optimizer.learning_rate
        assert float(rate) == pytest.approx(1e-3) and np.asarray(rate) == np.float32(1e-3)
        assert float(rate * 0.5) == pytest.approx(5e-4) and bool(rate > 1e-4)
        assert float(keras.ops.convert_to_numpy(rate)) == pytest.approx(1e-3)
        optimizer.learning_rate.assign(5e-4)
        assert float(optimizer.learning_rate) == pytest.approx(5e-4)
    assert float(pipe.learning_rate) == pytest.approx(5e-4)
    with pytest.raises(GradpipeError, match="learning_rate"):
        ours.learning_rate.assign(-1.0)
    assert float(pipe.learning_rate) == pytest.approx(5e-4)


def test_a_pipeline_without_a_learning_rate_reports_nan_to_keras():
    """cocob takes no rate: Keras reads NaN, ReduceLROnPlateau sets nothing and logs
    NaN, and LearningRateScheduler, which must set one, is an error saying why."""
    pipe = gradpipe.build({"transforms": [{"kind": "cocob"}]})
    m = model()
    m.compile(optimizer=pipe.keras_optimizer(), loss="mse")
    assert np.isnan(float(m.optimizer.learning_rate))
    history = m.fit(X, Y, batch_size=32, epochs=2, verbose=0, shuffle=False, callbacks=[
        keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=10.0)])
    assert np.isnan(history.history["learning_rate"]).all()
    with pytest.raises(GradpipeError, match="no update rule of this pipeline has a learning_rate"):
        m.fit(X, Y, batch_size=32, epochs=1, verbose=0, callbacks=[
            keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1)])


def lr_callbacks():
    """Halve the rate from the second epoch on; halve it again on every plateau."""
    return [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5 if epoch else lr),
            keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                              min_delta=10.0)]


@pytest.mark.slow
def test_learning_rate_callbacks_match_keras_adam(tmp_path):
    """LearningRateScheduler and ReduceLROnPlateau set a constant pipeline rate as they set
    Adam's: the same rate every epoch (history["learning_rate"]) and the same weights;
    the rate is optimizer state, so .keras files keep it."""
    native = model()
    native.compile(optimizer=keras.optimizers.Adam(0.01, global_clipnorm=1.0), loss="mse")
    expected = native.fit(X, Y, batch_size=32, epochs=4, verbose=0, shuffle=False,
                          callbacks=lr_callbacks()).history["learning_rate"]
    pipe = gradpipe.build(CLIP_ADAM)
    ours = model()
    ours.compile(optimizer=pipe.keras_optimizer(), loss="mse")
    rates = ours.fit(X, Y, batch_size=32, epochs=4, verbose=0, shuffle=False,
                     callbacks=lr_callbacks()).history["learning_rate"]
    assert rates == expected and rates[-1] < rates[1] < rates[0]  # both callbacks acted
    assert_close(weights(ours), weights(native), rtol=0, atol=1e-6)
    ours.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    # the last plateau halved the rate after the epoch's log: as Keras's Adam holds it
    current = float(native.optimizer.learning_rate)
    assert float(ours.optimizer.learning_rate) == current == rates[-1] / 2
    assert float(loaded.optimizer.learning_rate) == current
    for m in (ours, loaded, native):
        m.fit(X, Y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    assert_close(weights(loaded), weights(ours), rtol=0, atol=0)
    assert_close(weights(ours), weights(native), rtol=0, atol=1e-6)


def test_custom_loop_sets_the_rate_and_checkpoints_keep_it(tmp_path):
    """pipe.learning_rate = x: sgd moves by x * g from the next step on; a checkpoint
    restores the rate that was set, not the file's."""
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 0.5}]})
    var = tf.Variable([1.0, 2.0])
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]))
    step(tf.constant([1.0, 1.0]))
    pipe.learning_rate = 0.25
    step(tf.constant([1.0, 1.0]))
    np.testing.assert_array_equal(var.numpy(), [1.0 - 0.5 - 0.25, 2.0 - 0.5 - 0.25])
    assert step.experimental_get_tracing_count() == 1  # no retrace
    assert float(pipe.learning_rate) == 0.25
    path = tf.train.Checkpoint(pipeline=pipe).save(str(tmp_path / "ck"))
    clone = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 0.5}]})
    tf.train.Checkpoint(pipeline=clone).restore(path)
    assert float(clone.learning_rate) == 0.25


@pytest.mark.parametrize("table, value, message", [
    (CLIP_ADAM, -1.0, r"transforms\[1\]\.learning_rate = -1\.0 is not valid for adam: "
                      r"must be >= 0, got -1\.0"),
    (CLIP_ADAM, 1e30, r"transforms\[1\]\.learning_rate = 1e\+30 is beyond the bound under "
                      r"which gradpipe proves adam's updates finite"),
    ({"transforms": [{"kind": "rmsprop", "learning_rate": 0.1, "momentum": 0.9}]}, 1e37,
     r"transforms\[0\]\.learning_rate = 1e\+37 is beyond the bound under which gradpipe "
     r"proves rmsprop's updates finite"),
    (CLIP_ADAM, float("nan"), "must be finite, got nan"),
    (CLIP_ADAM, keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9),
     "must be set to a number, got ExponentialDecay; a schedule belongs in the pipeline file"),
    ({"transforms": [{"kind": "adam", "learning_rate": 0.1, "variables": ["kernel"]},
                     {"kind": "sgd", "learning_rate": 0.2, "exclude": ["kernel"]}]}, 0.1,
     r"its update rules have different learning rates \(transforms\[0\]\.learning_rate = "
     r"0\.1, transforms\[1\]\.learning_rate = 0\.2\)"),
])
def test_setting_a_rate_it_cannot_take_is_a_clear_error(table, value, message):
    pipe = gradpipe.build(table)
    before = float(pipe.learning_rate)
    with pytest.raises(GradpipeError, match=message):
        pipe.learning_rate = value
    assert float(pipe.learning_rate) == before


def test_tf_keras_callbacks_set_the_rate_through_the_validated_setter():
    """tf-keras's callbacks read optimizer.lr with backend.get_value and assign it with
    backend.set_value: both reach the pipeline, and a bad rate is refused there too."""
    import tf_keras

    pipe = gradpipe.build(CLIP_ADAM)
    optimizer = pipe.keras_optimizer(keras="tf_keras")
    assert tf_keras.backend.get_value(optimizer.lr) == np.float32(0.01)
    tf_keras.backend.set_value(optimizer.lr, 0.005)
    assert float(pipe.learning_rate) == np.float32(0.005)
    with pytest.raises(GradpipeError, match="beyond the bound under which gradpipe proves adam's"):
        tf_keras.backend.set_value(optimizer.lr, 1e30)
    assert float(tf.convert_to_tensor(optimizer.learning_rate)) == np.float32(0.005)
