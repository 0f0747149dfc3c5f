"""The rules that follow optax, against optax itself and optax's own tests.

* Golden values: ``references/optax_golden.json`` holds twelve steps of each
  case run by optax (``references/optax_golden.py`` writes it, with optax's
  version and each alias's defaults); a pipeline of the same rule and keys must
  give the same parameters at every step.
* optax's ``alias_test.py`` ``test_optimization``: with the keyword arguments
  optax's suite uses, 10,000 steps reach the parabola's and Rosenbrock's
  minimum within optax's tolerance (rtol = atol = 3e-2); like optax, the sign
  rules are not asked to solve Rosenbrock without a schedule.
* A sparse gradient steps as its dense sum; with ``lazy = true``, the rows it
  does not touch stay as they were.
"""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import ROOT, assert_close
from gradpipe.errors import ConfigError

GOLDEN = json.loads((ROOT / "tests" / "references" / "optax_golden.json").read_text())
RULES = sorted(GOLDEN["defaults"])  # every alias, rprop included
# optax's names -> gradpipe's (Keras's) names
KEYS = {"b1": "beta_1", "b2": "beta_2", "b3": "beta_3", "eps": "epsilon",
        "eps_root": "epsilon_root"}
# no ``lazy``: sign_sgd's sparse step is its dense sum's; the others' maths needs the
# whole variable (its norm, or its axes' maxima)
DENSE_ONLY = {"sign_sgd", "fromage", "novograd", "sm3", "noisy_sgd"}


def transform(alias: str, kwargs: dict) -> dict:
    table = {"kind": alias}
    for key, value in kwargs.items():
        if key == "mask":  # optax: True where decayed; gradpipe: patterns not decayed
            table["exclude_from_weight_decay"] = [f"^{n}$" for n, on in value.items() if not on]
        else:
            table[KEYS.get(key, key)] = value
    return table


# fromage's every step is scaled by a ratio of two norms: sums that XLA and
# TensorFlow add in different orders, whose last bits compound over the steps
TOLERANCE = {"fromage": (1e-5, 1e-6)}


def assert_steps_match(transforms, expected, rtol, atol):
    """Twelve steps of ``transforms`` on the golden problem, each equal to optax's."""
    a = tf.Variable(GOLDEN["a0"], name="a")
    b = tf.Variable(GOLDEN["b0"], name="b")
    target, curvature = tf.constant(GOLDEN["a_target"]), tf.constant(GOLDEN["b_curvature"])
    pipe = gradpipe.build({"transforms": transforms})

    @tf.function
    def step():
        pipe.apply_gradients([(2.0 * (a - target), a), (2.0 * curvature * b, b)])

    for i, params in enumerate(expected):
        step()
        assert_close([a.numpy(), b.numpy()], [params["a"], params["b"]], rtol=rtol,
                     atol=atol)
        assert i or not np.array_equal(a.numpy(), GOLDEN["a0"])


@pytest.mark.parametrize("case", sorted(GOLDEN["cases"]))
def test_twelve_steps_match_optax(case):
    """Every step's parameters equal optax's: rtol 2e-6, and atol 3e-7 (two float32
    roundings at the problem's scale, for the values that pass near 0)."""
    alias, kwargs, expected = (GOLDEN["cases"][case][k] for k in ("alias", "kwargs", "params"))
    assert_steps_match([transform(alias, kwargs)], expected,
                       *TOLERANCE.get(alias, (2e-6, 3e-7)))


@pytest.mark.parametrize("call", sorted(GOLDEN["schedules"]))
def test_the_coming_from_optax_schedules_match_optax(call):
    """Each optax schedule the page lists, as its gradpipe table, gives optax's value at
    every step from 0 to 119 (float32 rounding: rtol 3e-6)."""
    recorded = GOLDEN["schedules"][call]
    schedule = gradpipe.create("schedule", recorded["table"])
    ours = [float(schedule(tf.constant(step, tf.int64))) for step in range(len(
        recorded["values"]))]
    np.testing.assert_allclose(ours, recorded["values"], rtol=3e-6, atol=1e-9)


@pytest.mark.parametrize("case", sorted(GOLDEN["mapped"]))
def test_the_coming_from_optax_chains_match_optax(case):
    """The other aliases as the "Coming from optax" page writes them (another rule, or
    a chain: optax's lion decays, gradpipe's is Keras's and takes a weight_decay table)
    take optax's steps, to the tolerance recorded with each."""
    mapped = GOLDEN["mapped"][case]
    assert_steps_match(mapped["transforms"], mapped["params"], *mapped["tolerance"])


# optax's alias_test.py _OPTIMIZERS_UNDER_TEST, for the rules here
OPTAX_SUITE = {"adabelief": {"learning_rate": 1e-2}, "amsgrad": {"learning_rate": 1e-1},
               "yogi": {"learning_rate": 1e-1}, "radam": {"learning_rate": 5e-3},
               "sign_sgd": {"learning_rate": 1e-1}, "signum": {"learning_rate": 1e-2},
               "nadamw": {"learning_rate": 1e-2}, "adamaxw": {"learning_rate": 1e-1},
               "adan": {"learning_rate": 1e-1}, "fromage": {"learning_rate": 5e-3},
               "novograd": {"learning_rate": 1e-3}, "rprop": {"learning_rate": 1e-1},
               "optimistic_gradient_descent": {"learning_rate": 2e-3, "alpha": 0.7,
                                               "beta": 0.1},
               "sm3": {"learning_rate": 1.0},
               "noisy_sgd": {"learning_rate": 1e-3, "eta": 1e-4, "seed": 0}}


@pytest.mark.slow
@pytest.mark.parametrize("alias", sorted(OPTAX_SUITE))
def test_optax_optimization_suite(alias):
    """optax's parabola and Rosenbrock, 10,000 steps, rtol = atol = 3e-2. The two
    problems are separate variables of one loss: these rules step each variable
    from its own gradient alone, so one run solves both."""
    parabola, parabola_min = tf.Variable([-1.0, 10.0, 1.0]), np.array([1.0, -1.0, 1.0])
    rosen = tf.Variable([0.0, 0.0])
    solve_rosenbrock = alias not in ("sign_sgd", "signum")  # optax skips these too

    def loss():
        value = tf.reduce_sum(tf.square(parabola - parabola_min))
        if solve_rosenbrock:
            value += tf.square(1.0 - rosen[0]) + 100.0 * tf.square(rosen[1] - rosen[0] ** 2)
        return value

    pipe = gradpipe.build({"transforms": [{"kind": alias, **OPTAX_SUITE[alias]}]})
    pipe.minimize(loss, [parabola, rosen], 10_000)
    np.testing.assert_allclose(parabola.numpy(), parabola_min, rtol=3e-2, atol=3e-2)
    if solve_rosenbrock:
        np.testing.assert_allclose(rosen.numpy(), [1.0, 1.0], rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("alias", RULES)
def test_defaults_are_optaxs(alias):
    """Each optax argument with a default is a key with the same default."""
    config = gradpipe.parse({"transforms": [{"kind": alias}]}).transforms[0].config
    fields = {f.name for f in attrs.fields(type(config))}
    for key, default in GOLDEN["defaults"][alias].items():
        name = KEYS.get(key, key)
        assert name in fields, f"{alias}: optax's {key} has no key"
        assert getattr(config, name) == pytest.approx(default), name


@pytest.mark.parametrize("transform_, key", [
    ({"kind": "amsgrad", "beta_1": 1.0}, "beta_1"),
    ({"kind": "radam", "beta_2": 1.0}, "beta_2"),
    ({"kind": "yogi", "epsilon": -1.0}, "epsilon"),
    ({"kind": "signum", "beta": 1.5}, "beta"),
    ({"kind": "nadamw", "weight_decay": -0.1}, "weight_decay"),
    ({"kind": "adabelief", "epsilon_root": "small"}, "epsilon_root"),
    # below 4, optax's rectification is the root of a negative number: NaN steps
    ({"kind": "radam", "threshold": 2.0}, "threshold"),
])
def test_invalid_values_name_the_key(transform_, key):
    with pytest.raises(ConfigError, match=key):
        gradpipe.build({"transforms": [transform_]})


def test_rprop_steps_with_this_steps_sign():
    """optax's ``scale_by_rprop`` returns the previous step's update (its first step
    is 0; optax pull request 1725, open), so its golden values are not used. This
    is iRprop- as the paper and ``torch.optim.Rprop`` step: gradients 1, 1, 1, -1,
    1 from a step size of 0.1 give 0.1, 0.12, 0.144, 0 (the sign flipped: the size
    halves, nothing moves), then 0.072."""
    var = tf.Variable([0.0])
    pipe = gradpipe.build({"transforms": [{"kind": "rprop", "learning_rate": 0.1}]})
    steps = []
    for g in (1.0, 1.0, 1.0, -1.0, 1.0):
        before = var.numpy()[0]
        pipe.apply_gradients([(tf.constant([g]), var)])
        steps.append(before - var.numpy()[0])
    np.testing.assert_allclose(steps, [0.1, 0.12, 0.144, 0.0, 0.072], rtol=1e-6, atol=1e-7)


def test_sm3_is_never_packed():
    """sm3's accumulator per axis is not elementwise: many small variables, which
    the engine would pack into one vector for an elementwise rule, stay apart.
    (Its momentum hid the difference from the engine's first packing probe, whose
    gradients grew a thousandfold each step; the contract suite caught it.)"""
    variables = [tf.Variable(tf.zeros([3, 4])) for _ in range(40)]
    for kind, packed in (("sm3", "no: transform sm3 is not elementwise"),
                         ("adam", "yes")):
        pipe = gradpipe.build({"transforms": [{"kind": kind}]})
        pipe.build(variables)
        assert f"packed state  {packed}" in str(pipe.plan)


def test_noisy_sgd_adds_annealed_gaussian_noise():
    """JAX's random stream cannot be matched, so the noise is checked for what
    optax specifies: at step t it is Gaussian with variance eta / t^gamma (200,000
    draws: the deviation within 1%, the mean within 4 standard errors); the same
    seed draws the same noise, another seed and another variable other noise."""
    eta, gamma = 0.04, 0.55

    def third_step(seed, count=2):
        variables = [tf.Variable(tf.zeros([100_000])) for _ in range(count)]
        pipe = gradpipe.build({"transforms": [{"kind": "noisy_sgd", "learning_rate": 1.0,
                                               "eta": eta, "gamma": gamma, "seed": seed}]})
        for _ in range(3):
            before = [v.numpy() for v in variables]
            pipe.apply_gradients([(tf.zeros([100_000]), v) for v in variables])
        return np.concatenate([b - v.numpy() for b, v in zip(before, variables)])

    noise = third_step(seed=7)
    expected = np.sqrt(eta / 3**gamma)
    assert abs(noise.std() / expected - 1) < 0.01
    assert abs(noise.mean()) < 4 * expected / np.sqrt(noise.size)
    assert not np.array_equal(noise[:100_000], noise[100_000:])
    np.testing.assert_array_equal(third_step(seed=7), noise)
    assert not np.array_equal(third_step(seed=8), noise)


def test_noisy_sgd_without_noise_is_sgd():
    var = tf.Variable([1.0, -2.0])
    pipe = gradpipe.build({"transforms": [{"kind": "noisy_sgd", "learning_rate": 0.1,
                                           "eta": 0.0}]})
    pipe.apply_gradients([(tf.constant([0.5, 1.0]), var)])
    np.testing.assert_allclose(var.numpy(), [0.95, -2.1], rtol=1e-7)


def test_adabelief_decays_weights_as_optax_adamw_does():
    """optax's newer ``adabelief(weight_decay=...)`` (not in the release the golden
    values come from): ``lr * (step + weight_decay * w)``, closed form, one step."""
    start = np.array([[0.5, -2.0], [3.0, 0.25]], np.float32)
    grad = tf.constant([[0.1, 0.2], [-0.3, 0.4]])
    after = {}
    for decay in (0.0, 0.5):
        var = tf.Variable(start)
        gradpipe.build({"transforms": [{"kind": "adabelief", "learning_rate": 0.1,
                                        "weight_decay": decay}]}
                       ).apply_gradients([(grad, var)])
        after[decay] = var.numpy()
    np.testing.assert_allclose(after[0.0] - after[0.5], 0.1 * 0.5 * start, rtol=1e-5)


@pytest.mark.parametrize("optax_key, key", [("b1", "beta_1"), ("eps", "epsilon"),
                                             ("eps_root", "epsilon_root"), ("key", "seed")])
def test_a_key_in_optaxs_name_names_gradpipes(optax_key, key):
    kind = "noisy_sgd" if key == "seed" else "adabelief"
    with pytest.raises(ConfigError, match=f"did you mean '{key}'"):
        gradpipe.build({"transforms": [{"kind": kind, optax_key: 0.5}]})


def _rows(indices):
    values = tf.ones((len(indices), 3, 2)) * tf.constant([[1.0, -2.0]] * 3)
    return tf.IndexedSlices(values, tf.constant(indices), tf.constant([5, 3, 2]))


@pytest.mark.parametrize("indices", [[0, 2, 4], [2, 0, 4, 2]], ids=["unique", "duplicates"])
@pytest.mark.parametrize("alias", RULES)
def test_a_sparse_gradient_steps_as_its_dense_sum(alias, indices):
    """Keras's sparse check (five steps, rtol 1e-6, atol 1e-6), for these rules."""
    sparse_var, dense_var = tf.Variable(tf.ones((5, 3, 2))), tf.Variable(tf.ones((5, 3, 2)))
    sparse_pipe, dense_pipe = (gradpipe.build({"transforms": [{"kind": alias}]})
                               for _ in range(2))
    for _ in range(5):
        grad = _rows(indices)
        sparse_pipe.apply_gradients([(grad, sparse_var)])
        dense_pipe.apply_gradients([(tf.convert_to_tensor(grad), dense_var)])
        assert_close(sparse_var.numpy(), dense_var.numpy(), rtol=1e-6, atol=1e-6)
    assert not np.array_equal(dense_var.numpy(), np.ones((5, 3, 2)))


@pytest.mark.parametrize("alias", [r for r in RULES if r not in DENSE_ONLY])
def test_lazy_leaves_untouched_rows_alone(alias):
    """With ``lazy = true`` the rows no gradient touches keep their values, even
    after they moved (their moments are not decayed)."""
    var = tf.Variable(tf.ones((5, 3, 2)))
    pipe = gradpipe.build({"transforms": [{"kind": alias, "lazy": True,
                                           "learning_rate": 0.1}]})
    pipe.apply_gradients([(_rows([0, 1, 2, 3, 4]), var)])
    moved = var.numpy()
    for _ in range(3):
        pipe.apply_gradients([(_rows([0, 2]), var)])
    after = var.numpy()
    np.testing.assert_array_equal(after[[1, 3, 4]], moved[[1, 3, 4]])
    assert not np.array_equal(after[[0, 2]], moved[[0, 2]])
