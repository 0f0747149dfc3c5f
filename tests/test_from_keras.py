"""gradpipe.from_keras: a Keras 3 optimizer's pipeline trains as the optimizer does.

Each parity case fits the same model from the same (copied) initial weights on
the same batches, once with the Keras optimizer and once with
``gradpipe.build(gradpipe.from_keras(optimizer)).keras_optimizer()``, and
compares every weight with an explicit tolerance.
"""

from __future__ import annotations

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
import tomllib

import gradpipe
from gradpipe.cli import main

K = keras.optimizers
S = keras.optimizers.schedules
ATOL = 1e-5
RNG = np.random.default_rng(0)
X = RNG.normal(size=(128, 4)).astype("f4")
Y = (np.tanh(X @ RNG.normal(size=(4, 1))) + 0.1 * RNG.normal(size=(128, 1))).astype("f4")


def model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.LayerNormalization(), keras.layers.Dense(1)])


START = model().get_weights()


def fit(optimizer, epochs=3):
    m = model()
    m.set_weights(START)  # both runs start from the very same weights
    m.compile(optimizer=optimizer, loss="mse")
    m.fit(X, Y, batch_size=16, epochs=epochs, verbose=0, shuffle=False)
    return [np.asarray(w) for w in m.get_weights()]


def largest_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def excluding(optimizer, *names):
    optimizer.exclude_from_weight_decay(var_names=list(names))
    return optimizer


REPRESENTATIVE = {
    "adam_exponential_decay_global_clipnorm": lambda: K.Adam(
        S.ExponentialDecay(0.05, decay_steps=5, decay_rate=0.8), global_clipnorm=0.5),
    "sgd_momentum_nesterov_clipnorm": lambda: K.SGD(0.05, momentum=0.9, nesterov=True,
                                                    clipnorm=0.3),
    "adamw_exclude_from_weight_decay": lambda: excluding(
        K.AdamW(0.02, weight_decay=0.5), "bias", "gamma"),
    "sgd_weight_decay_exclude": lambda: excluding(
        K.SGD(0.05, momentum=0.5, weight_decay=0.3), "gamma", "LayerNorm"),  # one unused
    "adam_weight_decay_cosine_decay": lambda: K.Adam(
        S.CosineDecay(0.02, 20, warmup_target=0.05, warmup_steps=5), weight_decay=0.2),
    "rmsprop_clipvalue": lambda: K.RMSprop(0.01, clipvalue=0.05),
    "loss_scale_optimizer_adam": lambda: K.LossScaleOptimizer(
        K.Adam(0.02), initial_scale=2.0**10, dynamic_growth_steps=5),
    "adam_gradient_accumulation": lambda: K.Adam(0.02, gradient_accumulation_steps=3),
    "sgd_loss_scale_factor": lambda: K.SGD(0.05, loss_scale_factor=8.0),
    "adam_amsgrad_piecewise": lambda: K.Adam(
        S.PiecewiseConstantDecay([10, 20], [0.03, 0.01, 0.003]), amsgrad=True),
    "muon_exclude_from_weight_decay": lambda: excluding(
        K.Muon(0.02, weight_decay=0.3, adam_weight_decay=0.3), "gamma"),
}
DEFAULTS = {name.lower(): getattr(K, name) for name in (
    "SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Ftrl", "Lamb", "Adamax", "Nadam", "Lion",
    "Adadelta", "Adafactor", "Muon", "ScheduleFreeAdamW")}


def train_loop(optimizer, epochs=3):
    """``fit``'s batches in a custom loop: ``optimizer.apply`` on the tape's gradients."""
    m = model()
    m.set_weights(START)
    for _ in range(epochs):
        for i in range(0, len(X), 16):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(m(X[i:i + 16]) - Y[i:i + 16]))
            optimizer.apply(tape.gradient(loss, m.trainable_variables), m.trainable_variables)
    return [np.asarray(w) for w in m.get_weights()]


def check_parity(make, train=fit):
    optimizer = make()
    table = gradpipe.from_keras(optimizer)
    native = train(optimizer)
    ours = train(gradpipe.build(table).keras_optimizer())
    diff = largest_difference(ours, native)
    moved = largest_difference(native, START)
    print(f"largest |weight difference| {diff:.3g} (weights moved up to {moved:.3g})")
    # the tolerance, and small against how far the weights moved: the test means something
    assert diff <= min(ATOL, 1e-2 * moved), table
    return table


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REPRESENTATIVE))
def test_from_keras_fit_matches_keras(name):
    check_parity(REPRESENTATIVE[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_from_keras_fit_matches_every_rule_at_its_defaults(name):
    # Keras's ScheduleFreeAdamW in fit() is off by a Keras bug (see the test below):
    # compare it in a custom loop, where Keras computes what it means to.
    train = train_loop if name == "schedulefreeadamw" else fit
    table = check_parity(lambda: DEFAULTS[name](), train)
    assert [t["kind"] for t in table["transforms"]][-1] == name.replace(
        "schedulefreeadamw", "schedule_free_adamw")


def test_keras_schedule_free_adamw_in_fit_starts_z_at_zero():
    """Keras 3.15 on TensorFlow: fit() builds the optimizer inside the traced train
    step, and ScheduleFreeAdamW's copy of the weights into z (in build) is lost, so z
    starts at 0 and the weights collapse towards 0. The pipeline, and Keras's own
    optimizer.apply in a custom loop, start z at the weights. When Keras fixes this,
    this test fails: compare ScheduleFreeAdamW in fit() above again."""
    optimizer = K.ScheduleFreeAdamW()
    in_fit, in_loop = fit(optimizer, epochs=1), train_loop(K.ScheduleFreeAdamW(), epochs=1)
    assert largest_difference(in_fit, in_loop) > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("steps", [None, 2], ids=["plain", "accumulation"])
def test_from_keras_loss_scale_optimizer_under_mixed_float16_matches(steps):
    """float16 gradients overflow at first: skipped steps and back-offs as Keras's, also
    with gradient accumulation inside the LossScaleOptimizer."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        optimizer = K.LossScaleOptimizer(K.Adam(0.02, gradient_accumulation_steps=steps),
                                         dynamic_growth_steps=3)
        pipe = gradpipe.build(gradpipe.from_keras(optimizer))
        native, ours = fit(optimizer), fit(pipe.keras_optimizer())
    finally:
        keras.mixed_precision.set_global_policy("float32")
    print(f"largest |weight difference| {largest_difference(ours, native):.3g}")
    assert largest_difference(ours, native) <= ATOL
    assert int(pipe.skipped_steps) > 0  # measured: 5 of 24 steps overflowed
    assert float(pipe.loss_scale) == float(optimizer.dynamic_scale)
    assert int(pipe.iterations) == int(optimizer.iterations)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "key", "pattern"), [
    ("adamw_exclude_from_weight_decay", "exclude_from_weight_decay", "bias|gamma"),
    ("sgd_weight_decay_exclude", "exclude", "LayerNorm|gamma"),
    ("muon_exclude_from_weight_decay", "exclude_from_weight_decay", "gamma[^/]*$")])
def test_from_keras_exclusions_matter_in_the_parity_test(name, key, pattern):
    """Decaying what Keras excludes would fail the comparison above (measured: the
    weights differ by 0.17 to 0.30)."""
    optimizer = REPRESENTATIVE[name]()
    table = gradpipe.from_keras(optimizer)
    assert table["transforms"][-1][key] == [pattern]
    del table["transforms"][-1][key]
    assert largest_difference(fit(gradpipe.build(table).keras_optimizer()),
                              fit(optimizer)) > 0.1


def test_from_keras_tables():
    """The forms the mapping table of docs/keras.md promises."""
    assert gradpipe.from_keras(K.SGD(0.1, momentum=0.9, clipnorm=1.0))["transforms"] == [
        {"kind": "clip_by_norm", "clip_norm": 1.0},
        {"kind": "sgd", "momentum": 0.9, "nesterov": False, "learning_rate": 0.1}]
    assert gradpipe.from_keras(K.RMSprop(clipvalue=0.5))["transforms"][0] == {
        "kind": "clip_by_value", "clip_value_min": -0.5, "clip_value_max": 0.5}
    table = gradpipe.from_keras(K.LossScaleOptimizer(K.Lion(gradient_accumulation_steps=4)))
    assert table["loss_scale"] == {"kind": "dynamic", "initial_loss_scale": 32768.0,
                                   "increment_period": 2000, "multiplier": 2.0,
                                   "min_loss_scale": 0.0}
    assert table["pipeline"] == {"accumulation_steps": 4}
    table = gradpipe.from_keras(K.Adagrad(weight_decay=0.1))
    assert table["schedules"] == {"lr": {"kind": "fixed_lr", "learning_rate": 0.001}}
    assert table["transforms"][-1] == {"kind": "weight_decay", "weight_decay": 0.1,
                                       "learning_rate": "@lr"}
    # a zero or negative clip value clips nothing in Keras either
    assert len(gradpipe.from_keras(K.Adam(clipnorm=0.0))["transforms"]) == 1
    # the serialized form keras writes into a saved model's compile config
    assert gradpipe.from_keras(K.serialize(K.Nadam(0.01))) == gradpipe.from_keras(
        K.Nadam(0.01))


class CustomSchedule(S.LearningRateSchedule):
    def __call__(self, step):
        return 0.01

    def get_config(self):
        return {}


class CustomAdam(K.Adam):
    pass


def lso_in_lso():
    return K.LossScaleOptimizer(K.LossScaleOptimizer(K.Adam()))


UNSUPPORTED = {
    "use_ema": (lambda: K.Adam(use_ema=True), "use_ema"),
    "loss_scale_factor_below_1": (lambda: K.SGD(loss_scale_factor=0.5), "loss_scale_factor"),
    "lamb_weight_decay": (lambda: K.Lamb(weight_decay=0.01), "weight_decay"),
    "ftrl_weight_decay": (lambda: K.Ftrl(weight_decay=0.01), "weight_decay"),
    "callable_learning_rate": (lambda: K.Adam(learning_rate=lambda: 0.01), "learning_rate"),
    "custom_schedule": (lambda: K.Adam(learning_rate=CustomSchedule()), "learning_rate"),
    "custom_optimizer": (lambda: CustomAdam(), "CustomAdam"),
    "accumulation_with_schedule": (lambda: K.SGD(
        S.InverseTimeDecay(0.1, 10, 0.5), gradient_accumulation_steps=2),
        "gradient_accumulation_steps"),
    "exclude_var_list": (lambda: _exclude_var_list(), "exclude_from_weight_decay"),
    "exclude_pattern_at_the_end": (lambda: excluding(K.AdamW(), "bias$"),
                                   "exclude_from_weight_decay"),
    "muon_exclude_regex": (lambda: excluding(K.Muon(), "b.as"), "exclude_from_weight_decay"),
    "loss_scale_optimizer_twice": (lso_in_lso, "LossScaleOptimizer"),
}


def _exclude_var_list():
    optimizer = K.AdamW()
    optimizer.exclude_from_weight_decay(var_list=[model().layers[0].bias])
    return optimizer


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_from_keras_unsupported_setting_is_named(name):
    make, setting = UNSUPPORTED[name]
    with pytest.raises(gradpipe.ConfigError, match=re.escape(setting)):
        gradpipe.from_keras(make())


def test_from_keras_reports_every_problem_at_once():
    with pytest.raises(gradpipe.ConfigError) as info:
        gradpipe.from_keras(K.Lamb(weight_decay=0.1, use_ema=True, loss_scale_factor=0.25))
    assert {p.path for p in info.value.problems} == {"weight_decay", "use_ema",
                                                     "loss_scale_factor"}


@pytest.mark.parametrize("form", ["optimizer", "compile_config", "keras_file"])
def test_from_keras_cli_writes_what_check_accepts(tmp_path, capsys, form):
    optimizer = K.AdamW(S.PolynomialDecay(0.01, 100, power=2.0), weight_decay=0.01,
                        global_clipnorm=1.0, gradient_accumulation_steps=None)
    if form == "keras_file":
        source = tmp_path / "m.keras"
        m = model()
        m.compile(optimizer=optimizer, loss="mse")
        m.save(source)
    else:
        data = K.serialize(optimizer)
        if form == "compile_config":
            data = {"class_name": "Sequential", "compile_config": {"optimizer": data}}
        source = tmp_path / "optimizer.json"
        source.write_text(json.dumps(data))
    out = tmp_path / "pipe.toml"
    assert main(["from-keras", str(source), "-o", str(out)]) == 0
    assert tomllib.loads(out.read_text()) == gradpipe.from_keras(optimizer)
    # the file cannot say which variables Keras excluded from the decay: a comment does
    assert "add exclude_from_weight_decay = [PATTERN] to the rule" in out.read_text()
    assert main(["check", str(out)]) == 0
    capsys.readouterr()
    assert main(["from-keras", str(source)]) == 0  # no -o: the TOML on stdout
    assert tomllib.loads(capsys.readouterr().out) == gradpipe.from_keras(optimizer)


def test_from_keras_cli_adds_no_decay_note_without_a_decay(tmp_path, capsys):
    source = tmp_path / "optimizer.json"
    source.write_text(json.dumps(K.serialize(K.Adam(0.01))))
    assert main(["from-keras", str(source)]) == 0
    printed = capsys.readouterr().out
    assert tomllib.loads(printed)["transforms"][0]["kind"] == "adam"
    assert "exclude_from_weight_decay" not in printed


def test_from_keras_cli_names_the_unsupported_setting(tmp_path, capsys):
    source = tmp_path / "optimizer.json"
    source.write_text(json.dumps(K.serialize(K.Adam(use_ema=True))))
    assert main(["from-keras", str(source)]) == 1
    assert "use_ema" in capsys.readouterr().err


def test_from_keras_cli_prints_the_pipeline_a_keras_file_holds(tmp_path, capsys):
    """A model compiled with pipe.keras_optimizer() saves its pipeline's TOML: the
    command writes that one (Keras could not rebuild the optimizer by itself)."""
    pipe = gradpipe.build({"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                                          {"kind": "adam", "learning_rate": 0.01}]})
    m = model()
    m.compile(optimizer=pipe.keras_optimizer(), loss="mse")
    m.save(tmp_path / "m.keras")
    out = tmp_path / "pipe.toml"
    assert main(["from-keras", str(tmp_path / "m.keras"), "-o", str(out)]) == 0
    assert gradpipe.parse(out) == pipe.spec
    capsys.readouterr()
    assert main(["from-keras", str(tmp_path / "m.keras")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# The pipeline stored in m.keras (gradpipe from-keras).\n")
    assert gradpipe.parse(tomllib.loads(printed)) == pipe.spec


@pytest.mark.parametrize("given, instead", [
    (keras.optimizers.Adam(1e-3), r"for a Keras optimizer, gradpipe\.build\(gradpipe\."
                                  r"from_keras\(optimizer\)\)"),
    ({"transforms": [{"kind": "adam"}]}, r"gradpipe\.build takes a mapping"),
])
def test_load_given_an_optimizer_or_a_table_says_what_builds_it(given, instead):
    with pytest.raises(gradpipe.GradpipeError, match=r"gradpipe\.load takes a pipeline "
                                                     r"file's path; got a \w+: " + instead):
        gradpipe.load(given)
