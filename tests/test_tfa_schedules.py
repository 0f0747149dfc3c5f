"""TF Addons' cyclical learning rates, ported with the cases of TF Addons' own
tests (``optimizers/tests/cyclical_learning_rate_test.py``).

TF Addons does not import on this TensorFlow, so its expectations are written
here: the closed forms its tests use (``np.linspace`` triangles; its formula
with ``scale_fn`` in Python floats, as its tests pass Python int steps), and
``reference``, its ``__call__`` redone in numpy in the dtype given, operation
for operation. Every step range is evaluated as one vector of int64 steps, and
a sample of it one step at a time, eagerly and in a tf.function.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
import tomllib

import gradpipe
from conftest import ROOT
from gradpipe import ConfigError

TRI, TRI2, EXP = ("TriangularCyclicalLearningRate", "Triangular2CyclicalLearningRate",
                  "ExponentialCyclicalLearningRate")

#: One float32 rounding of TF's pow kernels, apart from numpy's and from each
#: other (vector and scalar kernels): measured at most 1.8e-7, 1.5 ulp.
POW_RTOL = 4e-7


def reference(table, steps, python_steps=False):
    """TF Addons' ``CyclicalLearningRate.__call__`` in numpy float32, its order of
    operations. ``scale_fn`` gets the float32 step (gradpipe's fix), or with
    ``python_steps`` the int step, as TF Addons' tests call it: a Python float
    power (float64) then, rounded to float32 when multiplied."""
    f = np.float32
    s = np.asarray(steps).astype(f)
    initial, maximal = f(table["initial_learning_rate"]), f(table["maximal_learning_rate"])
    step_size = f(table["step_size"])
    cycle = np.floor(f(1) + s / (f(2) * step_size))
    x = np.abs(s / step_size - f(2) * cycle + f(1))
    default_mode = "iterations" if table["kind"] == EXP else "cycle"
    if table.get("scale_mode", default_mode) == "cycle":
        m, g = cycle, f
    else:
        m, g = (np.asarray(steps).astype(np.float64), np.float64) if python_steps else (s, f)
    with np.errstate(over="ignore"):  # Triangular2's 2^(m - 1), as in float32 TF
        scale = {TRI: lambda m: g(1),
                 TRI2: lambda m: g(1) / np.power(g(2), m - g(1)),
                 EXP: lambda m: np.power(g(table.get("gamma", 1.0)), m)}[table["kind"]](m)
    return initial + (maximal - initial) * np.maximum(f(0), f(1) - x) * scale.astype(f)


def graph_atol(table, steps):
    """In a tf.function TF's graph optimizer makes ``s / S`` ``s * (1 / S)`` and
    computes ``x`` as ``s / S - (2 cycle - 1)`` (as it would TF Addons' graph, the
    same operations): ``x`` one rounding of ``s / S`` apart, times the height, plus
    one ulp of the peak for the other operations."""
    height = abs(table["maximal_learning_rate"] - table["initial_learning_rate"])
    peak = max(table["maximal_learning_rate"], table["initial_learning_rate"])
    return height * np.spacing(np.float32(max(steps) / table["step_size"])) \
        + 2.0**-23 * peak


def values(table, steps):
    """gradpipe's values at ``steps``, one vector of int64 steps."""
    return gradpipe.create("schedule", table)(tf.constant(steps, tf.int64)).numpy()


def problem(tbl):
    with pytest.raises(ConfigError) as info:
        gradpipe.parse({"schedules": {"s": tbl}, "transforms": [{"kind": "sgd"}]})
    return info.value


# --- TF Addons' test cases -------------------------------------------------------


@pytest.mark.parametrize("scale_mode", ["cycle", "iterations"])
def test_triangular(scale_mode):
    """TF Addons' test_triangular_cyclical_learning_rate: up and down in 40 steps each,
    rtol 1e-6 as there. Both scale modes: the scale is 1 in either."""
    initial, maximal, step_size = 0.1, 1, 40
    table = {"kind": TRI, "initial_learning_rate": initial,
             "maximal_learning_rate": maximal, "step_size": step_size,
             "scale_mode": scale_mode}
    expected = np.concatenate([np.linspace(initial, maximal, num=step_size + 1),
                               np.linspace(maximal, initial, num=step_size + 1)[1:]])
    steps = np.arange(len(expected))
    got = values(table, steps)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # the same float32 operations as TF Addons: equal to the reference bit for bit
    np.testing.assert_array_equal(got, reference(table, steps))


def test_triangular2():
    """TF Addons' test_triangular2_cyclical_learning_rate: the second cycle peaks
    half-way, rtol 1e-6 as there."""
    initial, maximal, step_size = 0.1, 1, 30
    table = {"kind": TRI2, "initial_learning_rate": initial,
             "maximal_learning_rate": maximal, "step_size": step_size}
    middle = (maximal + initial) / 2
    expected = np.concatenate([np.linspace(initial, maximal, num=step_size + 1),
                               np.linspace(maximal, initial, num=step_size + 1)[1:],
                               np.linspace(initial, middle, num=step_size + 1)[1:],
                               np.linspace(middle, initial, num=step_size + 1)[1:]])
    steps = np.arange(len(expected))
    got = values(table, steps)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_array_equal(got, reference(table, steps))  # 2^-k is exact


def test_triangular2_iterations():
    """Not in TF Addons' tests: ``1 / 2^(step - 1)`` per step. Its Python-float power
    raises OverflowError from step 1025 on; in float32 it is inf from step 129
    on and the height 0 (1 / inf), never NaN: the rate is initial_learning_rate."""
    table = {"kind": TRI2, "initial_learning_rate": 0.1, "maximal_learning_rate": 1.0,
             "step_size": 3, "scale_mode": "iterations"}
    steps = np.concatenate([np.arange(200), [1025, 10**6]])
    got = values(table, steps)
    np.testing.assert_array_equal(got, reference(table, steps))
    expected = [0.1 + 0.9 * max(0, 1 - abs(s / 3 - 2 * np.floor(1 + s / 6) + 1))
                / 2.0 ** (s - 1) for s in steps[:200]]
    np.testing.assert_allclose(got[:200], expected, rtol=1e-6)
    assert np.all(got[129:] == np.float32(0.1))


EXPONENTIAL_CASES = {
    # TF Addons' test_exponential_cyclical_learning_rate (default scale_mode)
    "exponential": ({"kind": EXP, "initial_learning_rate": 0.1, "maximal_learning_rate": 1,
                     "step_size": 2000, "gamma": 0.996}, np.arange(0, 8001)),
    # test_custom_cyclical_learning_rate[_with_scale_mode]: scale_fn(x) = 1 / 5^(x / 1e4),
    # which is gamma^x with gamma = 5^-1e-4: an ExponentialCyclicalLearningRate
    "custom_cycle": ({"kind": EXP, "initial_learning_rate": 0.1, "maximal_learning_rate": 1,
                      "step_size": 4000, "gamma": 5 ** -1e-4, "scale_mode": "cycle"},
                     np.arange(1, 8001)),
    "custom_iterations": ({"kind": EXP, "initial_learning_rate": 0.1,
                           "maximal_learning_rate": 1, "step_size": 4000,
                           "gamma": 5 ** -1e-4, "scale_mode": "iterations"},
                          np.arange(1, 8001)),
}


def tfa_test_expectation(table, steps):
    """TF Addons' tests' own formula, in float64 throughout."""
    gamma, step_size = table["gamma"], table["step_size"]
    cycle = np.floor(1 + steps / (2 * step_size))
    triangle = np.maximum(0, 1 - np.abs(steps / step_size - 2 * cycle + 1))
    m = cycle if table.get("scale_mode") == "cycle" else steps
    return 0.1 + 0.9 * triangle * gamma ** m.astype(np.float64)


@pytest.mark.parametrize("name", EXPONENTIAL_CASES)
def test_exponential(name):
    """Against the float32 reference to one pow rounding; against TF Addons' own
    tests' expectation with TF Addons' rtol 1e-6 in "cycle" mode.

    In "iterations" mode TF Addons' tests pass Python int steps, so its scale is a
    float64 power; ours, as TF Addons' with a float32 step, is float32's
    ``pow(float32(gamma), s) = gamma^s (1 + d)^s``, ``d = |float32(gamma) / gamma - 1|``:
    the scaled part relatively ``s d`` apart (bounded below). That is up to 6.7e-6
    of the rate here (measured; 1.1e-6 for "exponential"), over TF Addons' 1e-6."""
    table, steps = EXPONENTIAL_CASES[name]
    got = values(table, steps)
    np.testing.assert_allclose(got, reference(table, steps), rtol=POW_RTOL)
    expected = tfa_test_expectation(table, steps)
    if table.get("scale_mode") == "cycle":
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)  # TF Addons' own
        return
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    tfa = reference(table, steps, python_steps=True)  # TF Addons as its tests call it
    d = abs(float(np.float32(table["gamma"])) / table["gamma"] - 1)
    bound = np.abs(tfa - 0.1) * (steps * d * 1.01 + 2.0**-22) + 2 * np.spacing(tfa)
    assert np.all(np.abs(got - tfa) <= bound)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("name", EXPONENTIAL_CASES)
def test_one_step_at_a_time_equals_the_vector(name, graph):
    """As an optimizer evaluates it: one int64 step at a time (every 97th; TF Addons'
    tests evaluate every step), eagerly (to one pow rounding: TF's scalar and vector
    kernels) or in a tf.function traced once (see graph_atol)."""
    table, steps = EXPONENTIAL_CASES[name]
    steps = steps[::97]
    schedule = gradpipe.create("schedule", table)
    call = tf.function(schedule) if graph else schedule
    got = np.array([float(call(tf.constant(s, tf.int64))) for s in steps])
    atol = graph_atol(table, steps) if graph else 0.0
    np.testing.assert_allclose(got, values(table, steps), rtol=POW_RTOL, atol=atol)
    if graph:
        assert call.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("kind", [TRI, TRI2])
def test_many_cycles_in_a_tf_function(kind):
    """200 cycles of step_size 20: in a tf.function within graph_atol of the eager
    values (measured: one rounding of s / S, 1.4e-5 at s / S = 400), which equal
    the reference bit for bit."""
    table = {"kind": kind, "initial_learning_rate": 0.1, "maximal_learning_rate": 1.0,
             "step_size": 20}
    steps = np.arange(8001)
    eager = values(table, steps)
    np.testing.assert_array_equal(eager, reference(table, steps))
    graph = tf.function(gradpipe.create("schedule", table))(tf.constant(steps, tf.int64))
    np.testing.assert_allclose(graph.numpy(), eager, rtol=0, atol=graph_atol(table, steps))


# --- what TF Addons gets wrong or leaves open ------------------------------------


@pytest.mark.parametrize("kind", [TRI2, EXP])
def test_an_int64_step_in_iterations_mode(kind):
    """TF Addons hands scale_fn the step uncast: an int64 step (Keras's optimizers'
    ``iterations``) raised TypeError there (TF Addons issues #2593, #2799). Here
    scale_fn gets the float32 step: int64, int32 and float32 steps agree."""
    table = {"kind": kind, "initial_learning_rate": 0.01, "maximal_learning_rate": 0.1,
             "step_size": 5, "scale_mode": "iterations", **({"gamma": 0.9} if kind == EXP
                                                            else {})}
    schedule = gradpipe.create("schedule", table)
    steps = np.arange(30)
    by_dtype = [schedule(tf.constant(steps, dtype)).numpy()
                for dtype in (tf.int64, tf.int32, tf.float32)]
    for got in by_dtype:
        np.testing.assert_array_equal(got, by_dtype[0])
        assert got.dtype == np.float32
    np.testing.assert_allclose(by_dtype[0], reference(table, steps), rtol=POW_RTOL)


def test_steps_of_any_shape_and_the_name_scope():
    """Elementwise over a step tensor of any shape; the ops in ``tf.name_scope(name)``."""
    table = {"kind": EXP, "initial_learning_rate": 0.01, "maximal_learning_rate": 0.1,
             "step_size": 4, "gamma": 0.95, "scale_mode": "cycle", "name": "my_clr"}
    schedule = gradpipe.create("schedule", table)
    steps = np.arange(24).reshape(2, 3, 4)
    got = schedule(tf.constant(steps, tf.int64)).numpy()
    assert got.shape == (2, 3, 4)
    np.testing.assert_allclose(got.ravel(), values(table, steps.ravel()), rtol=POW_RTOL)
    graph = tf.function(schedule).get_concrete_function(
        tf.TensorSpec([], tf.int64)).graph
    ops = [op.name for op in graph.get_operations() if op.type in ("Floor", "Pow")]
    assert len(ops) == 2 and all(op.startswith("my_clr/") for op in ops)


def test_special_values():
    """gamma = 1 is the triangle; maximal < initial is a triangle pointing down, as in
    TF Addons; a float step_size and integer learning rates (TF Addons fails on an
    int initial_learning_rate) are computed in float32."""
    tri = {"kind": TRI, "initial_learning_rate": 0.1, "maximal_learning_rate": 0.5,
           "step_size": 7}
    steps = np.arange(60)
    np.testing.assert_array_equal(values({**tri, "kind": EXP}, steps), values(tri, steps))
    down = values({**tri, "initial_learning_rate": 0.5, "maximal_learning_rate": 0.1}, steps)
    assert down[0] == np.float32(0.5) and down[7] == pytest.approx(0.1, rel=1e-6)
    ints = {"kind": TRI, "initial_learning_rate": 0, "maximal_learning_rate": 2,
            "step_size": 2.5}
    np.testing.assert_allclose(values(ints, steps), reference(ints, steps), rtol=0, atol=0)
    assert values(ints, [5])[0] == 0.0 and values(ints, [2])[0] == pytest.approx(1.6, rel=1e-6)


# --- in a pipeline ---------------------------------------------------------------


@pytest.mark.parametrize("kind", [TRI, TRI2, EXP])
def test_in_a_traced_step_without_retracing(kind):
    """``sgd`` with ``learning_rate = "@lr"`` in one XLA-compiled step: each step moves
    a variable reset to 0 by exactly the rate at pipe.iterations, 12 steps
    (three cycles), one trace."""
    table = {"kind": kind, "initial_learning_rate": 0.1, "maximal_learning_rate": 1.0,
             "step_size": 2, **({"gamma": 0.8} if kind == EXP else {})}
    var = tf.Variable([0.0])
    pipe = gradpipe.build({"schedules": {"lr": table},
                           "transforms": [{"kind": "sgd", "learning_rate": "@lr"}]})
    pipe.build([var])
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]), jit_compile=True)
    moves = []
    for _ in range(12):
        var.assign([0.0])
        step(tf.constant([1.0]))
        moves.append(-float(var.numpy()[0]))
    # XLA may round a float32 operation differently: one ulp of the rate
    np.testing.assert_allclose(moves, values(table, np.arange(12)), rtol=2.0**-23)
    assert len(set(moves)) >= 3 and int(pipe.iterations) == 12
    assert step.experimental_get_tracing_count() == 1


# --- configuration ---------------------------------------------------------------

REQUIRED = {"initial_learning_rate": 0.001, "maximal_learning_rate": 0.01, "step_size": 2000}

#: TF Addons' get_config() of each class given only REQUIRED (its defaults), and the
#: default ``name`` of its __init__, which get_config() leaves out.
TFA_DEFAULTS = {
    TRI: {**REQUIRED, "scale_mode": "cycle", "name": TRI},
    TRI2: {**REQUIRED, "scale_mode": "cycle", "name": TRI2},
    EXP: {**REQUIRED, "scale_mode": "iterations", "gamma": 1.0, "name": EXP},
}


@pytest.mark.parametrize("kind", TFA_DEFAULTS)
def test_defaults_are_tfas(kind):
    spec = gradpipe.parse({"schedules": {"lr": {"kind": kind, **REQUIRED}},
                           "transforms": [{"kind": "sgd"}]})
    assert spec.schedules["lr"].to_mapping() == {"kind": kind, **TFA_DEFAULTS[kind]}


@pytest.mark.parametrize("kind", TFA_DEFAULTS)
def test_a_pasted_get_config_round_trips_with_the_name(kind):
    """TF Addons' get_config() (no name) is a valid table; written back, every key
    and a given name are kept."""
    tfa_config = {k: v for k, v in TFA_DEFAULTS[kind].items() if k != "name"}
    tfa_config["maximal_learning_rate"] = 1  # TF Addons' tests give an int
    spec = gradpipe.parse({"schedules": {"lr": {"kind": kind, **tfa_config, "name": "clr"}},
                           "transforms": [{"kind": "sgd", "learning_rate": "@lr"}]})
    written = tomllib.loads(spec.to_toml())
    assert gradpipe.parse(written) == spec
    assert written["schedules"]["lr"] == {"kind": kind, **tfa_config,
                                          "maximal_learning_rate": 1.0, "name": "clr"}


def with_(kind, **changes):
    return {"kind": kind, **REQUIRED, **changes}


@pytest.mark.parametrize("tbl, key, message", [
    (with_(TRI, step_size=0), "step_size", "must be > 0, got 0"),
    (with_(TRI2, step_size=-40), "step_size", "must be > 0"),
    (with_(EXP, step_size=0.0), "step_size", "must be > 0"),
    (with_(TRI, scale_mode="cycles"), "scale_mode",
     "must be one of 'cycle', 'iterations', got 'cycles' (did you mean 'cycle'?)"),
    (with_(EXP, scale_mode="triangular2"), "scale_mode", "must be one of"),
    (with_(TRI2, scale_mode="Cycle"), "scale_mode", "must be one of"),
    (with_(EXP, gamma=-0.5), "gamma", "must be >= 0, got -0.5"),
    (with_(TRI, initial_learning_rate=-0.1), "initial_learning_rate", "must be >= 0"),
    (with_(EXP, maximal_learning_rate=-1.0), "maximal_learning_rate", "must be >= 0"),
    (with_(TRI, name="my clr"), "name", "valid TensorFlow name scope"),
])
def test_values_out_of_range_name_the_key(tbl, key, message):
    error = problem(tbl)
    assert error.path == f"schedules.s.{key}" and message in str(error)


@pytest.mark.parametrize("tbl, key, message", [
    (with_(TRI, step_size="2000"), "step_size", "must be a number, got a string '2000'"),
    (with_(TRI2, initial_learning_rate="0.1"), "initial_learning_rate", "must be a number"),
    (with_(EXP, maximal_learning_rate=True), "maximal_learning_rate",
     "must be a number, got a boolean"),
    (with_(EXP, gamma=[0.9]), "gamma", "must be a number"),
    (with_(TRI, scale_mode=1), "scale_mode", "must be one of"),
    (with_(TRI2, name=3), "name", "must be a string"),
    (with_(TRI, gamma=0.9), "gamma", "unknown key"),  # only the exponential has it
    (with_(EXP, scale_fn="lambda x: 1.0"), "scale_fn", "unknown key"),
])
def test_wrong_types_and_keys_name_the_key(tbl, key, message):
    error = problem(tbl)
    assert error.path == f"schedules.s.{key}" and message in str(error)


@pytest.mark.parametrize("kind", TFA_DEFAULTS)
def test_missing_required_key_names_it(kind):
    for key in REQUIRED:
        error = problem({"kind": kind, **{k: v for k, v in REQUIRED.items() if k != key}})
        assert error.path == f"schedules.s.{key}" and "is required" in str(error)


def test_the_docs_example_parses():
    """The TOML example of docs/schedules.md's cyclical section is a valid pipeline."""
    page = (ROOT / "docs" / "schedules.md").read_text()
    section = page.split("## Cyclical schedules (TF Addons)")[1]
    example = re.search(r"```toml\n(.*?)```", section, re.S)
    assert example is not None
    spec = gradpipe.parse(tomllib.loads(example.group(1)))
    assert {s.name for s in spec.schedules.values()} <= set(TFA_DEFAULTS)
