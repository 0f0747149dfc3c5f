"""Keras's six learning-rate schedules, written as Keras serializes them.

Each case builds the Keras schedule with non-default arguments, writes
``{"kind": cls.__name__, **schedule.get_config()}`` as the gradpipe table, and
compares values with Keras's at every step over several periods.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
import tomli_w
import tomllib

import forked
import gradpipe
from gradpipe import ConfigError

S = keras.optimizers.schedules
STEPS = range(121)  # at least three periods of every case below

CASES = {
    "exponential": S.ExponentialDecay(0.3, 17, 0.7, name="exp"),
    "exponential_staircase": S.ExponentialDecay(0.3, 17, 0.7, staircase=True),
    "exponential_float_steps": S.ExponentialDecay(0.3, 1.7e1, 1.3),
    "piecewise": S.PiecewiseConstantDecay([10, 25, 40], [1.0, 0.5, 0.1, 0.01], name="pw"),
    "piecewise_float_boundaries": S.PiecewiseConstantDecay([10.5, 25.0, 39.9],
                                                           [0.3, 0.2, 0.1, 0.05]),
    "polynomial": S.PolynomialDecay(0.3, 20, 0.01, power=1.7, name="poly"),
    "polynomial_cycle": S.PolynomialDecay(0.3, 20, 0.01, power=0.5, cycle=True),
    "inverse_time": S.InverseTimeDecay(0.3, 13, 0.5, name="inv"),
    "inverse_time_staircase": S.InverseTimeDecay(0.3, 13, 2.5, staircase=True),
    "cosine": S.CosineDecay(0.2, 30, alpha=0.1, name="cos"),
    "cosine_warmup": S.CosineDecay(0.01, 30, alpha=0.1, warmup_target=0.2, warmup_steps=11),
    "cosine_warmup_down": S.CosineDecay(0.5, 25, warmup_target=0.2, warmup_steps=7),
    "cosine_warmup_steps_without_target": S.CosineDecay(0.2, 30, warmup_steps=11),
    "cosine_target_without_warmup_steps": S.CosineDecay(0.1, 20, warmup_target=0.3),
    "restarts": S.CosineDecayRestarts(0.2, 10, t_mul=1.5, m_mul=0.8, alpha=0.05,
                                      name="sgdr"),
    "restarts_equal_periods": S.CosineDecayRestarts(0.2, 12, t_mul=1.0, m_mul=0.5),
    "restarts_defaults": S.CosineDecayRestarts(0.1, 9),
}


def table(schedule):
    """What a user pastes: the class name and Keras's get_config()."""
    return {"kind": type(schedule).__name__, **schedule.get_config()}


def keras_values(schedule, graph=False):
    """Keras's value at each step, one int64 step at a time as Keras's optimizer
    evaluates it (CosineDecay's warm-up cannot take a vector of steps); eagerly, or
    in a tf.function as ``model.fit`` runs it."""
    call = tf.function(lambda step: schedule(step), autograph=False) if graph else schedule
    return np.array([float(call(tf.constant(s, tf.int64))) for s in STEPS])


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("name", CASES)
def test_equals_keras_at_every_step(name, graph):
    """One step at a time, eagerly and in a tf.function (as a pipeline's step and
    model.fit evaluate it), each compared with Keras in the same mode: the same
    float32 operations in the same order, so rtol 1e-6.

    Eagerly they are equal bit for bit (atol 0). In a tf.function TF's constant
    folding rewrites ``pi * (t / D)``, in Keras's graph as in ours, except inside
    the tf.cond branches of Keras's CosineDecay warm-up, where our elementwise
    tf.where is folded: up to one float32 ulp of the peak value there (measured
    3e-8 on a 0.3 peak), so atol is one ulp of the peak (2**-23 * peak)."""
    ours = gradpipe.create("schedule", table(CASES[name]))
    if graph:
        ours = tf.function(ours)
    got = np.array([float(ours(tf.constant(s, tf.int64))) for s in STEPS])
    expected = keras_values(CASES[name], graph)
    atol = 2.0**-23 * np.max(np.abs(expected)) if graph else 0.0
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=atol)
    if graph:
        assert ours.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("name", CASES)
def test_gradpipe_schedule_command_equals_keras(name, tmp_path, capsys):
    """The pasted table in a TOML file, evaluated by ``gradpipe schedule`` over a
    vector of steps. TF's vectorised pow/cos kernels differ from the scalar ones
    by a few ulp (Keras's own vector evaluation differs from its scalar one as
    much), amplified by the cancellation in CosineDecayRestarts: rtol 2e-6
    (measured: at most 1.2e-6, CosineDecayRestarts; 5.3e-7 for the others)."""
    from gradpipe.cli import main

    tbl = {k: v for k, v in table(CASES[name]).items() if v is not None}  # TOML has no null
    path = tmp_path / "pipe.toml"
    path.write_text(tomli_w.dumps({"schedules": {"lr": tbl},
                                   "transforms": [{"kind": "sgd", "learning_rate": "@lr"}]}))
    assert main(["schedule", str(path), "--steps", str(len(STEPS)), "--json"]) in (0, None)
    got = np.array(json.loads(capsys.readouterr().out)["schedules"]["lr"])
    np.testing.assert_allclose(got, keras_values(CASES[name]), rtol=2e-6, atol=0)


TRAINING = {
    "ExponentialDecay": S.ExponentialDecay(0.5, 3, 0.6, staircase=True),
    "PiecewiseConstantDecay": S.PiecewiseConstantDecay([2, 5], [0.5, 0.2, 0.05]),
    "PolynomialDecay": S.PolynomialDecay(0.5, 4, 0.05, power=2.0, cycle=True),
    "InverseTimeDecay": S.InverseTimeDecay(0.5, 3, 1.5),
    "CosineDecay": S.CosineDecay(0.05, 6, alpha=0.2, warmup_target=0.5, warmup_steps=3),
    "CosineDecayRestarts": S.CosineDecayRestarts(0.5, 3, t_mul=2.0, m_mul=0.7, alpha=0.1),
}


@pytest.mark.parametrize("jit", ["auto", True], ids=["auto", "xla"])
@pytest.mark.parametrize("name", TRAINING)
def test_sgd_pipeline_trains_as_keras_sgd(name, jit):
    """``sgd`` with ``learning_rate = "@lr"`` moves a variable as keras.optimizers.SGD
    with the Keras schedule, over 12 steps (several periods), with the step compiled
    by XLA or not. rtol 1e-6, atol 1e-7 (measured: equal bit for bit without XLA;
    with it at most 2.4e-7 on values of about 2, one float32 ulp)."""
    schedule = TRAINING[name]
    init = np.array([1.0, -2.0, 0.5], np.float32)
    ours, theirs = tf.Variable(init), tf.Variable(init)
    pipe = gradpipe.build({"schedules": {"lr": table(schedule)},
                           "pipeline": {"jit_compile": jit},
                           "transforms": [{"kind": "sgd", "learning_rate": "@lr"}]})
    sgd = keras.optimizers.SGD(learning_rate=schedule)
    rng = np.random.default_rng(0)
    for _ in range(12):
        grad = tf.constant(rng.normal(size=3).astype(np.float32))
        pipe.apply_gradients([(grad, ours)])
        sgd.apply_gradients([(grad, theirs)])
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-7)
    assert int(pipe.iterations) == int(sgd.iterations) == 12


@pytest.mark.parametrize("name", CASES)
def test_round_trip_keeps_every_key_and_the_name(name):
    keras_config = CASES[name].get_config()
    spec = gradpipe.parse({"schedules": {"lr": table(CASES[name])},
                           "transforms": [{"kind": "sgd", "learning_rate": "@lr"}]})
    written = tomllib.loads(spec.to_toml())
    again = gradpipe.parse(written)
    assert again == spec
    assert written["schedules"]["lr"] == {
        "kind": type(CASES[name]).__name__,
        **{k: list(v) if isinstance(v, list) else v
           for k, v in keras_config.items() if v is not None}}
    assert again.schedules["lr"].config.name == keras_config["name"]


REQUIRED = {
    "ExponentialDecay": {"initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5},
    "PiecewiseConstantDecay": {"boundaries": [10], "values": [0.1, 0.01]},
    "PolynomialDecay": {"initial_learning_rate": 0.1, "decay_steps": 10},
    "InverseTimeDecay": {"initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5},
    "CosineDecay": {"initial_learning_rate": 0.1, "decay_steps": 10},
    "CosineDecayRestarts": {"initial_learning_rate": 0.1, "first_decay_steps": 10},
}


@pytest.mark.parametrize("kind", REQUIRED)
def test_keras_defaults(kind):
    """Given only the required keys, every other key takes Keras's default, the
    ``name`` included: what gradpipe writes back is Keras's get_config()."""
    expected = getattr(S, kind)(**REQUIRED[kind]).get_config()
    spec = gradpipe.parse({"schedules": {"lr": {"kind": kind, **REQUIRED[kind]}},
                           "transforms": [{"kind": "sgd"}]})
    written = spec.schedules["lr"].to_mapping()
    assert written == {"kind": kind, **{k: v for k, v in expected.items() if v is not None}}


def problem(tbl):
    with pytest.raises(ConfigError) as info:
        gradpipe.parse({"schedules": {"s": tbl}, "transforms": [{"kind": "sgd"}]})
    return info.value


EXP = REQUIRED["ExponentialDecay"]


@pytest.mark.parametrize("tbl, key, message", [
    ({"kind": "ExponentialDecay", **EXP, "decay_steps": "100"}, "decay_steps",
     "must be an integer, got a string '100' or must be a number"),
    ({"kind": "ExponentialDecay", **EXP, "staircase": 1}, "staircase", "must be true or false"),
    ({"kind": "ExponentialDecay", **EXP, "name": 3}, "name", "must be a string"),
    ({"kind": "PiecewiseConstantDecay", "boundaries": [1, "2"], "values": [1.0, 0.5, 0.1]},
     "boundaries", "item 1"),
    ({"kind": "CosineDecay", "initial_learning_rate": 0.1, "decay_steps": 10,
      "warmup_target": [0.5]}, "warmup_target", "must be a number"),
], ids=["decay_steps", "staircase", "name", "boundaries", "warmup_target"])
def test_wrong_type_names_the_key(tbl, key, message):
    error = problem(tbl)
    assert error.path == f"schedules.s.{key}" and message in str(error)


@pytest.mark.parametrize("kind", REQUIRED)
def test_missing_required_key_names_it(kind):
    for key in REQUIRED[kind]:
        error = problem({"kind": kind, **{k: v for k, v in REQUIRED[kind].items() if k != key}})
        assert error.path == f"schedules.s.{key}" and "is required" in str(error)


KERAS_ERRORS = [
    # (Keras class, arguments, key, gradpipe's message)
    ("PiecewiseConstantDecay", {"boundaries": [10, 20], "values": [1.0, 0.5]}, "values",
     "the length of boundaries should be 1 less than the length of values (Keras); got 2 "
     "boundaries and 2 values"),
    ("PiecewiseConstantDecay", {"boundaries": [10], "values": [1.0, 0.5, 0.1]}, "values",
     "should be 1 less"),
    ("ExponentialDecay", {**EXP, "decay_steps": 0}, "decay_steps", "must be > 0, got 0"),
    ("PolynomialDecay", {"initial_learning_rate": 0.1, "decay_steps": -5}, "decay_steps",
     "must be > 0"),
    ("InverseTimeDecay", {**EXP, "decay_steps": 0.0}, "decay_steps", "must be > 0"),
    ("CosineDecay", {"initial_learning_rate": 0.1, "decay_steps": 0}, "decay_steps",
     "must be > 0"),
    ("CosineDecayRestarts", {"initial_learning_rate": 0.1, "first_decay_steps": 0},
     "first_decay_steps", "must be > 0"),
]


@pytest.mark.parametrize("kind, args, key, message", KERAS_ERRORS)
def test_keras_errors_are_config_errors_naming_the_key(kind, args, key, message):
    with pytest.raises(ValueError):
        getattr(S, kind)(**args)  # Keras refuses it too
    error = problem({"kind": kind, **args})
    assert error.path == f"schedules.s.{key}" and message in str(error)


@pytest.mark.parametrize("kind, args, key, message", [
    # accepted by Keras, but a negative, infinite or NaN rate, or a failure later
    ("PiecewiseConstantDecay", {"boundaries": [], "values": [0.1]}, "boundaries",
     "needs at least one boundary"),
    ("PiecewiseConstantDecay", {"boundaries": [20, 10], "values": [1.0, 0.5, 0.1]},
     "boundaries", "strictly increasing"),
    ("PiecewiseConstantDecay", {"boundaries": [10], "values": [1.0, -0.5]}, "values",
     "item 1: must be >= 0"),
    ("ExponentialDecay", {**EXP, "initial_learning_rate": -0.1}, "initial_learning_rate",
     "must be >= 0"),
    ("ExponentialDecay", {**EXP, "decay_rate": 0.0}, "decay_rate", "must be > 0"),
    ("PolynomialDecay", {"initial_learning_rate": 0.1, "decay_steps": 5, "power": -1.0},
     "power", "must be >= 0"),
    ("CosineDecay", {"initial_learning_rate": 0.1, "decay_steps": 5, "alpha": 1.5}, "alpha",
     "must be in [0.0, 1.0]"),
    ("CosineDecay", {"initial_learning_rate": 0.1, "decay_steps": 5, "warmup_steps": -1},
     "warmup_steps", "must be >= 0"),
    ("CosineDecayRestarts", {"initial_learning_rate": 0.1, "first_decay_steps": 5,
                             "t_mul": 0.5}, "t_mul", "must be >= 1.0"),
    ("CosineDecayRestarts", {"initial_learning_rate": 0.1, "first_decay_steps": 5,
                             "m_mul": -1.0}, "m_mul", "must be >= 0"),
    ("CosineDecay", {"initial_learning_rate": 0.1, "decay_steps": 5, "name": "my cosine"},
     "name", "valid TensorFlow name scope"),
])
def test_values_out_of_range_name_the_key(kind, args, key, message):
    error = problem({"kind": kind, **args})
    assert error.path == f"schedules.s.{key}" and message in str(error)


@pytest.mark.slow
def test_an_invalid_name_fails_keras_in_graph_too():
    """Why ``name`` is checked: Keras opens tf.name_scope(name) in every call. In a
    subprocess: the failing call leaves Keras's name scope open, and every Keras
    variable made after it in this process would be named under it."""
    import sys

    code = ("import keras, tensorflow as tf\n"
            "s = keras.optimizers.schedules.CosineDecay(0.1, 5, name='my cosine')\n"
            "tf.function(s)(tf.constant(1, tf.int64))\n")
    result = forked.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300)
    assert result.returncode != 0
    assert "not a valid root scope name" in result.stderr


def test_openseq2seq_cosine_decay_keeps_its_meaning():
    """``cosine_decay`` (OpenSeq2Seq, min_lr a fraction) and ``CosineDecay`` (Keras)
    are two components; neither takes the other's keys."""
    seq2seq = {"kind": "cosine_decay", "learning_rate": 0.5, "decay_steps": 100,
               "min_lr": 0.1, "warmup_steps": 10}
    steps = np.array([0, 5, 10, 60, 100, 150])
    got = gradpipe.create("schedule", seq2seq)(tf.constant(steps, tf.int64)).numpy()
    warm = 0.5 * np.minimum(steps / 10, 1)  # warm-up and decay overlap, as in OpenSeq2Seq
    cosine = 0.5 * (1 + np.cos(np.pi * np.minimum(steps, 100) / 100))
    np.testing.assert_allclose(got, warm * (0.9 * cosine + 0.1), rtol=1e-6)
    assert got[-1] == pytest.approx(0.05, rel=1e-6)  # the floor is lr * min_lr
    error = problem({"kind": "CosineDecay", "learning_rate": 0.5, "decay_steps": 100})
    assert error.path == "schedules.s.learning_rate" and "unknown key" in str(error)
    error = problem({**seq2seq, "alpha": 0.1})
    assert error.path == "schedules.s.alpha" and "unknown key" in str(error)
