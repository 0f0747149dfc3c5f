"""Every Keras 3 update rule built in, proven with Keras's own tests.

Three checks per rule, each ported from keras-team/keras 3
(``keras/src/optimizers/*_test.py``):

* Keras's golden values (``test_correctness_with_golden``), reproduced by the
  pipeline and, as a control, by the Keras class itself;
* parity with the Keras class over twelve steps of random gradients;
* Keras's sparse check (``optimizer_sparse_test.py``,
  ``test_sparse_correctness``): IndexedSlices update exactly like the same
  dense gradient.
"""

from __future__ import annotations

import attrs
import keras
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import assert_close
from gradpipe import ConfigError

# -- golden values -------------------------------------------------------------
#
# Each entry: the pipeline's update rule, the Keras optimizer with the same
# arguments, and the expected values of ``x`` (ten elements, starting at ones)
# after the first gradient (0.01 everywhere) and after each of four more steps of
# ``arange(0.1, 1.1, 0.1)``, copied from the named Keras test; ``tile(c)`` is a
# golden array whose ten columns are equal, written by Keras as
# ``np.tile([[..], ..], (1, 10))``. Every case is Keras's
# ``test_correctness_with_golden`` in the file named, with Keras's tolerance
# (rtol 5e-4, atol 5e-4).


def tile(column):
    return np.tile(np.array(column)[:, None], (1, 10))


GOLDEN = {
    # keras/src/optimizers/sgd_test.py, test_correctness_with_golden. Keras's SGD
    # ignores nesterov without momentum (its default, 0), as gradpipe's does.
    "sgd": ({"kind": "sgd", "nesterov": True}, lambda: keras.optimizers.SGD(nesterov=True),
            np.array([
                [0.9999] * 10,
                [0.9989, 0.9979, 0.9969, 0.9959, 0.9949, 0.9939, 0.9929, 0.9919, 0.9909, 0.9899],
                [0.9979, 0.9959, 0.9939, 0.9919, 0.9899, 0.9879, 0.9859, 0.9839, 0.9819, 0.9799],
                [0.9969, 0.9939, 0.9909, 0.9879, 0.9849, 0.9819, 0.9789, 0.9759, 0.9729, 0.9699],
                [0.9959, 0.9919, 0.9879, 0.9839, 0.9799, 0.9759, 0.9719, 0.9679, 0.9639, 0.9599]])),
    # keras/src/optimizers/adam_test.py, test_correctness_with_golden
    "adam": ({"kind": "adam", "amsgrad": True}, lambda: keras.optimizers.Adam(amsgrad=True),
             tile([0.999, 0.9982, 0.9974, 0.9965, 0.9955])),
    # keras/src/optimizers/adamw_test.py, test_correctness_with_golden
    "adamw": ({"kind": "adamw", "learning_rate": 1.0, "weight_decay": 0.5, "epsilon": 2.0},
              lambda: keras.optimizers.AdamW(learning_rate=1.0, weight_decay=0.5, epsilon=2),
              np.array([
                  [0.4998] * 10,
                  [0.2486, 0.2475, 0.2463, 0.2451, 0.244, 0.2428, 0.2417, 0.2405, 0.2394, 0.2382],
                  [0.1223, 0.1198, 0.1174, 0.1149, 0.1124, 0.11, 0.1075, 0.1051, 0.1027, 0.1003],
                  [0.0586, 0.0549, 0.0512, 0.0475, 0.0439, 0.0402, 0.0366, 0.033, 0.0294, 0.0258],
                  [0.0263, 0.0215, 0.0167, 0.012, 0.0073, 0.0026, -0.0021, -0.0067, -0.0113,
                   -0.0159]])),
    # keras/src/optimizers/adagrad_test.py, test_correctness_with_golden
    "adagrad": ({"kind": "adagrad", "learning_rate": 0.2, "initial_accumulator_value": 0.3,
                 "epsilon": 1e-6},
                lambda: keras.optimizers.Adagrad(learning_rate=0.2, initial_accumulator_value=0.3,
                                                 epsilon=1e-6),
                np.array([
                    [0.9963] * 10,
                    [0.9604, 0.9278, 0.9003, 0.8784, 0.8615, 0.8487, 0.8388, 0.8313, 0.8255,
                     0.8209],
                    [0.9251, 0.8629, 0.8137, 0.7768, 0.7497, 0.7298, 0.7151, 0.704, 0.6956,
                     0.6891],
                    [0.8903, 0.8012, 0.7342, 0.6862, 0.6521, 0.6277, 0.6099, 0.5967, 0.5867,
                     0.579],
                    [0.856, 0.7422, 0.6604, 0.6037, 0.5644, 0.5367, 0.5168, 0.5021, 0.491,
                     0.4825]])),
    # keras/src/optimizers/rmsprop_test.py, test_correctness_with_golden
    "rmsprop": ({"kind": "rmsprop", "centered": True},
                lambda: keras.optimizers.RMSprop(centered=True),
                tile([0.9967, 0.9933, 0.9908, 0.9885, 0.9864])),
    # keras/src/optimizers/ftrl_test.py, test_correctness_with_golden
    "ftrl": ({"kind": "ftrl", "learning_rate": 0.05, "learning_rate_power": -0.2,
              "initial_accumulator_value": 0.4, "l1_regularization_strength": 0.05,
              "l2_regularization_strength": 0.15, "l2_shrinkage_regularization_strength": 0.01,
              "beta": 0.3},
             lambda: keras.optimizers.Ftrl(
                 learning_rate=0.05, learning_rate_power=-0.2, initial_accumulator_value=0.4,
                 l1_regularization_strength=0.05, l2_regularization_strength=0.15,
                 l2_shrinkage_regularization_strength=0.01, beta=0.3),
             np.array([
                 [0.0] * 10,
                 [-0.0034, -0.0077, -0.0118, -0.0157, -0.0194, -0.023, -0.0263, -0.0294, -0.0325,
                  -0.0354],
                 [-0.0078, -0.0162, -0.0242, -0.0317, -0.0387, -0.0454, -0.0516, -0.0575,
                  -0.0631, -0.0685],
                 [-0.0121, -0.0246, -0.0363, -0.0472, -0.0573, -0.0668, -0.0757, -0.0842,
                  -0.0922, -0.0999],
                 [-0.0164, -0.0328, -0.0481, -0.0623, -0.0753, -0.0875, -0.099, -0.1098,
                  -0.1201, -0.1299]])),
    # keras/src/optimizers/lamb_test.py, test_correctness_with_golden
    "lamb": ({"kind": "lamb"}, lambda: keras.optimizers.Lamb(),
             tile([0.999, 0.9982, 0.9974, 0.9965, 0.9955])),
    # keras/src/optimizers/adamax_test.py, test_correctness_with_golden
    "adamax": ({"kind": "adamax", "learning_rate": 0.2, "beta_1": 0.85, "beta_2": 0.95,
                "epsilon": 1e-6},
               lambda: keras.optimizers.Adamax(learning_rate=0.2, beta_1=0.85, beta_2=0.95,
                                               epsilon=1e-6),
               np.array([
                   [0.8] * 10,
                   [0.6827, 0.6873, 0.6888, 0.6896, 0.6901, 0.6904, 0.6906, 0.6908, 0.6909, 0.691],
                   [0.5333, 0.5407, 0.5431, 0.5444, 0.5451, 0.5456, 0.546, 0.5462, 0.5464,
                    0.5466],
                   [0.368, 0.3773, 0.3804, 0.382, 0.3829, 0.3835, 0.384, 0.3843, 0.3846, 0.3848],
                   [0.1933, 0.204, 0.2076, 0.2094, 0.2105, 0.2112, 0.2117, 0.2121, 0.2124,
                    0.2126]])),
    # keras/src/optimizers/nadam_test.py, test_correctness_with_golden
    "nadam": ({"kind": "nadam", "learning_rate": 0.5, "beta_1": 0.5, "beta_2": 0.67,
               "epsilon": 1e-5},
              lambda: keras.optimizers.Nadam(learning_rate=0.5, beta_1=0.5, beta_2=0.67,
                                             epsilon=1e-5),
              np.array([
                  [0.4281] * 10,
                  [-0.1738, -0.1731, -0.1726, -0.1723, -0.1721, -0.172, -0.1719, -0.1718,
                   -0.1718, -0.1717],
                  [-0.7115, -0.7103, -0.7096, -0.7092, -0.709, -0.7088, -0.7086, -0.7085,
                   -0.7085, -0.7084],
                  [-1.2335, -1.2322, -1.2313, -1.2309, -1.2306, -1.2304, -1.2302, -1.2301, -1.23,
                   -1.2299],
                  [-1.7492, -1.7478, -1.7469, -1.7464, -1.7461, -1.7459, -1.7457, -1.7456,
                   -1.7455, -1.7454]])),
    # keras/src/optimizers/lion_test.py, test_correctness_with_golden
    "lion": ({"kind": "lion"}, lambda: keras.optimizers.Lion(),
             tile([0.999, 0.998, 0.997, 0.996, 0.995])),
    # keras/src/optimizers/adadelta_test.py, test_correctness_with_golden
    "adadelta": ({"kind": "adadelta", "learning_rate": 1.0, "rho": 0.8, "epsilon": 1e-6},
                 lambda: keras.optimizers.Adadelta(learning_rate=1.0, rho=0.8, epsilon=1e-6),
                 tile([0.9978, 0.9947, 0.9915, 0.9882, 0.9849])),
}


def golden_steps(apply):
    """Keras's loop: the first gradient, then check and step five times."""
    x = tf.Variable(np.ones([10], dtype="float32"))
    grads = tf.range(0.1, 1.1, 0.1)  # what keras.ops.arange(0.1, 1.1, 0.1) gives
    first_grads = tf.fill([10], 0.01)
    apply(first_grads, x)
    seen = []
    for _ in range(5):
        seen.append(x.numpy())
        apply(grads, x)
    return np.stack(seen)


@pytest.mark.parametrize("implementation", ["gradpipe", "keras"])
@pytest.mark.parametrize("rule", list(GOLDEN))
def test_correctness_with_golden(rule, implementation):
    """Keras's golden values (its rtol 5e-4, atol 5e-4), by the pipeline and, as a
    control that the golden values are Keras's own behaviour, by the Keras class."""
    transform, make_keras, golden = GOLDEN[rule]
    if implementation == "gradpipe":
        pipe = gradpipe.build({"transforms": [transform]})
        seen = golden_steps(lambda g, x: pipe.apply_gradients([(g, x)]))
    else:
        optimizer = make_keras()
        seen = golden_steps(lambda g, x: optimizer.apply_gradients([(g, x)]))
    assert_close(seen, golden, rtol=5e-4, atol=5e-4)


# -- parity with the Keras class -------------------------------------------------
#
# Each case: the rule's arguments, given by the same keys to the pipeline and to
# the Keras class. Non-default values where a rule has options worth exercising.

PARITY_STEPS = 15
PARITY_ATOL = 1e-4
SHAPES = [(5, 3), (3,)]

PARITY = {
    "sgd": ("SGD", {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True}),
    "adam": ("Adam", {"learning_rate": 0.01, "amsgrad": True}),
    "adamw": ("AdamW", {"learning_rate": 0.01, "weight_decay": 0.1}),
    "adagrad": ("Adagrad", {"learning_rate": 0.1, "initial_accumulator_value": 0.2}),
    "rmsprop": ("RMSprop", {"learning_rate": 0.01, "momentum": 0.5, "centered": True}),
    "ftrl": ("Ftrl", {"learning_rate": 0.1, "l1_regularization_strength": 0.01,
                      "l2_regularization_strength": 0.02,
                      "l2_shrinkage_regularization_strength": 0.03, "beta": 0.1}),
    "lamb": ("Lamb", {"learning_rate": 0.01}),
    "adamax": ("Adamax", {"learning_rate": 0.02, "beta_1": 0.8, "beta_2": 0.95}),
    "nadam": ("Nadam", {"learning_rate": 0.02, "beta_1": 0.8, "beta_2": 0.95,
                        "epsilon": 1e-6}),
    "lion": ("Lion", {"learning_rate": 0.01, "beta_1": 0.8, "beta_2": 0.95}),
    "adadelta": ("Adadelta", {"learning_rate": 1.0, "rho": 0.9, "epsilon": 1e-6}),
}

#: the new rules also follow a learning-rate schedule as Keras does: the rate of
#: PARITY halved every four steps
SCHEDULED = ["adamax", "nadam", "lion", "adadelta"]


def parity_data():
    rng = np.random.default_rng(7)
    init = [rng.normal(size=s).astype("f4") for s in SHAPES]
    grads = [[rng.normal(size=s).astype("f4") for s in SHAPES] for _ in range(PARITY_STEPS)]
    return init, grads


def run_keras(optimizer):
    init, grads = parity_data()
    variables = [tf.Variable(x, name=n) for x, n in zip(init, ["kernel", "bias"])]
    for step in grads:
        optimizer.apply_gradients(zip([tf.constant(g) for g in step], variables))
    return [v.numpy() for v in variables]


def run_pipe(transform):
    init, grads = parity_data()
    variables = [tf.Variable(x, name=n) for x, n in zip(init, ["kernel", "bias"])]
    pipe = gradpipe.build({"transforms": [transform]})
    step_fn = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    for step in grads:
        step_fn([tf.constant(g) for g in step])
    assert int(pipe.iterations) == PARITY_STEPS
    return [v.numpy() for v in variables]


def largest_difference(actual, expected):
    return max(float(np.max(np.abs(a - e))) for a, e in zip(actual, expected))


@pytest.mark.slow
@pytest.mark.parametrize("rule, scheduled",
                         [pytest.param(rule, False, id=rule) for rule in PARITY]
                         + [pytest.param(rule, True, id=f"{rule}-scheduled_lr")
                            for rule in SCHEDULED])
def test_parity_with_keras(rule, scheduled):
    """Fifteen steps of random gradients on a (5, 3) kernel and a (3,) bias give the
    Keras class's weights within atol 1e-4 (rtol 0), with a constant learning rate
    and, for the new rules, an exponential-decay schedule."""
    class_name, args = PARITY[rule]
    keras_args = dict(args)
    transform = {"kind": rule, **args}
    if scheduled:
        rate = args["learning_rate"]
        keras_args["learning_rate"] = keras.optimizers.schedules.ExponentialDecay(rate, 4, 0.5)
        transform["learning_rate"] = {"kind": "exp_decay", "learning_rate": rate,
                                      "decay_steps": 4, "decay_rate": 0.5}
    expected = run_keras(getattr(keras.optimizers, class_name)(**keras_args))
    actual = run_pipe(transform)
    init, _ = parity_data()
    assert largest_difference(expected, init) > 10 * PARITY_ATOL  # the weights did move
    assert largest_difference(actual, expected) <= PARITY_ATOL


# -- sparse gradients ---------------------------------------------------------------
#
# keras/src/optimizers/optimizer_sparse_test.py, test_sparse_correctness: a (5, 3, 2)
# variable of ones, five steps of IndexedSlices on rows (0, 2, 4) with values
# 10 - step, against the same gradient densified, each rule with Keras's defaults
# (and the same option variants as Keras's TEST_CASES), compared with Keras's
# assertAllClose tolerance (rtol 1e-6, atol 1e-6). Rules Keras does not list (lamb,
# clippy_adagrad) are added; "duplicates" also repeats row 2, which must equal the
# dense sum.

SPARSE_CASES = {
    "sgd": {"kind": "sgd"},
    "sgd_momentum": {"kind": "sgd", "momentum": 0.05},
    "sgd_momentum_nesterov": {"kind": "sgd", "momentum": 0.05, "nesterov": True},
    "adam": {"kind": "adam"},
    "adam_amsgrad": {"kind": "adam", "amsgrad": True},
    "adamw": {"kind": "adamw"},
    "adamw_amsgrad": {"kind": "adamw", "amsgrad": True},
    "adagrad": {"kind": "adagrad"},
    "rmsprop": {"kind": "rmsprop"},
    "rmsprop_momentum": {"kind": "rmsprop", "momentum": 0.05},
    "rmsprop_momentum_centered": {"kind": "rmsprop", "momentum": 0.05, "centered": True},
    "ftrl": {"kind": "ftrl"},
    "lamb": {"kind": "lamb"},
    "adamax": {"kind": "adamax"},
    "nadam": {"kind": "nadam"},
    "lion": {"kind": "lion"},
    "adadelta": {"kind": "adadelta"},
    "clippy_adagrad": {"kind": "clippy_adagrad"},
}


def sparse_grad(step, indices):
    values = tf.ones((len(indices), 3, 2)) * (10.0 - step)
    return tf.IndexedSlices(values, tf.constant(indices), tf.constant([5, 3, 2]))


@pytest.mark.parametrize("indices", [[0, 2, 4], [2, 0, 4, 2]], ids=["unique", "duplicates"])
@pytest.mark.parametrize("case", list(SPARSE_CASES))
def test_sparse_correctness(case, indices):
    """IndexedSlices give the weights of the same dense gradient (rtol 1e-6, atol 1e-6)."""
    var_sparse = tf.Variable(tf.ones((5, 3, 2)))
    var_dense = tf.Variable(tf.ones((5, 3, 2)))
    pipe_sparse = gradpipe.build({"transforms": [SPARSE_CASES[case]]})
    pipe_dense = gradpipe.build({"transforms": [SPARSE_CASES[case]]})
    for step in range(5):
        grad_sparse = sparse_grad(step, indices)
        grad_dense = tf.convert_to_tensor(grad_sparse)
        pipe_sparse.apply_gradients([(grad_sparse, var_sparse)])
        pipe_dense.apply_gradients([(grad_dense, var_dense)])
        assert_close(var_sparse.numpy(), var_dense.numpy(), rtol=1e-6, atol=1e-6)
    assert not np.array_equal(var_dense.numpy(), np.ones((5, 3, 2)))


# -- what the configs accept ---------------------------------------------------------
#
# Keras validates only Lion's beta_1 (in (0, 1], else ValueError); gradpipe checks
# the rest when the file is read instead of dividing by zero while training:
# Adamax's and Nadam's bias corrections divide by 1 - beta_1 ** t and
# 1 - beta_2 ** t (as Adam's do), so a beta of 1 is refused.


@pytest.mark.parametrize("transform, key", [
    ({"kind": "lion", "beta_1": 0.0}, "beta_1"),
    ({"kind": "lion", "beta_2": 1.5}, "beta_2"),
    ({"kind": "adamax", "beta_1": 1.0}, "beta_1"),
    ({"kind": "nadam", "beta_2": 1.0}, "beta_2"),
    ({"kind": "adadelta", "rho": -0.1}, "rho"),
    ({"kind": "adadelta", "epsilon": -1e-7}, "epsilon"),
])
def test_invalid_values_name_the_key(transform, key):
    with pytest.raises(ConfigError, match=key):
        gradpipe.build({"transforms": [transform]})


@pytest.mark.parametrize("rule, keras_class", [
    ("adamax", keras.optimizers.Adamax), ("nadam", keras.optimizers.Nadam),
    ("lion", keras.optimizers.Lion), ("adadelta", keras.optimizers.Adadelta)])
def test_defaults_are_keras_defaults(rule, keras_class):
    """Every key of the new rules is a Keras argument, with Keras's default (but
    ``lazy``, gradpipe's own, off by default: Keras densifies sparse gradients)."""
    config = gradpipe.parse({"transforms": [{"kind": rule}]}).transforms[0].config
    keras_config = keras_class().get_config()
    for field in attrs.fields(type(config)):
        if field.name == "lazy":
            assert config.lazy is False
            continue
        assert keras_config[field.name] == pytest.approx(getattr(config, field.name)), field.name
