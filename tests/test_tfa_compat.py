"""TF Addons' decoupled weight decay and ``MultiOptimizer``, proven with TFA's own tests.

TF Addons (tensorflow/addons, last commit d208d752) does not import on TF 2.21, so
its tests are ported here, rewritten against gradpipe's public API with TFA's
hyperparameters, dtypes, step counts and tolerances
(``test_utils.assert_allclose_according_to_type``: rtol = atol = 1e-3 for float16,
1e-6 for float32 and float64). TFA's numpy references are rewritten in float64
from the dtype's own starting values and gradients.

From ``tensorflow_addons/optimizers/tests/weight_decay_optimizers_test.py``
(``SGDW``, ``AdamW``, ``extend_with_decoupled_weight_decay``): an update rule
followed by the ``weight_decay`` transform, whose ``learning_rate`` stays at 1.0
because TFA decays by ``weight_decay * var`` alone. Ported: ``test_basic_*``,
``test_sparse_*``, ``test_basic_callable_params_*`` (schedules instead of
callables), ``test_basic_decay_var_list_*`` (``variables``),
``test_var_list_with_exclude_list_*``, ``test_exclude_weight_decay_*``,
``test_sparse_repeated_indices_*``, ``test_optimizer_basic`` /
``test_optimizer_sparse`` (any rule; compared with Keras 3's classes decayed before
their step, which is what ``extend_with_decoupled_weight_decay`` does),
``test_keras_fit*`` and ``test_weight_decay_with_piecewise_constant_decay_schedule``
(now checked numerically), ``test_serialization*`` (TOML and Keras round trips).

From ``tensorflow_addons/optimizers/tests/discriminative_layer_training_test.py``
(``MultiOptimizer``): several update rules in one chain, each limited by
``variables``. Ported: ``test_fit_layer_optimizer`` (both ``serialize`` cases),
``test_list_of_layers``, ``test_subclass_model``, ``test_pretrained_model`` (a small
convolutional backbone instead of ResNet50), ``test_nested_model``,
``test_serialization``, ``test_serialization_after_training``; and, beyond TFA,
every group's weights against the Keras class applied to that group alone.

Where gradpipe does not do what TFA did, a test here pins gradpipe's behaviour and
its comment gives TFA's numbers: a sparse gradient decays every row (TFA: only the
rows it touches, which ``lazy = true`` gives after a lazy rule), ``variables`` and
``exclude`` intersect (TFA's ``decay_var_list`` overrides
``exclude_from_weight_decay``), two rules that select one variable by pattern are an
error (TFA's ``MultiOptimizer`` adds both steps), and a variable that no rule
selects must be listed in ``[pipeline] freeze``.
"""

from __future__ import annotations

import re
from math import ceil

import keras
import numpy as np
import pytest
import tensorflow as tf
import tomllib

import gradpipe
from conftest import ROOT, assert_close
from gradpipe import ConfigError

WEIGHT_DECAY = 0.01
DTYPES = [tf.float16, tf.float32, tf.float64]
# TFA's assert_allclose_according_to_type
TOLERANCE = {tf.float16: {"rtol": 1e-3, "atol": 1e-3},
             tf.float32: {"rtol": 1e-6, "atol": 1e-6},
             tf.float64: {"rtol": 1e-6, "atol": 1e-6}}

# TFA SGDW(learning_rate=0.001, momentum=0.9, weight_decay=0.01)
SGDW_TOML = """
[[transforms]]
kind = "sgd"
learning_rate = 0.001
momentum = 0.9

[[transforms]]
kind = "weight_decay"
weight_decay = 0.01          # var -= 0.01 * var, not multiplied by the rate
"""

# TFA AdamW(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.01)
ADAMW_TOML = """
[[transforms]]
kind = "adam"
learning_rate = 0.001
beta_1 = 0.9
beta_2 = 0.999
epsilon = 1e-8

[[transforms]]
kind = "weight_decay"
weight_decay = 0.01
"""

# TFA's test_basic_callable_params_*: each callable hyperparameter becomes a schedule
SGDW_SCHEDULED_TOML = """
[[transforms]]
kind = "sgd"
learning_rate = { kind = "constant", value = 0.001 }
momentum = { kind = "constant", value = 0.9 }

[[transforms]]
kind = "weight_decay"
weight_decay = { kind = "constant", value = 0.01 }
"""

ADAMW_SCHEDULED_TOML = """
[[transforms]]
kind = "adam"
learning_rate = { kind = "constant", value = 0.001 }
beta_1 = { kind = "constant", value = 0.9 }
beta_2 = { kind = "constant", value = 0.999 }
epsilon = 1e-8

[[transforms]]
kind = "weight_decay"
weight_decay = { kind = "constant", value = 0.01 }
"""


def adamw_reference(param, grad, slots, learning_rate, beta_1, beta_2, epsilon,
                    weight_decay):
    """One AdamW step as TFA's numpy reference has it: decay by ``weight_decay * param``
    (no learning rate), then Adam's step with its bias correction."""
    t = slots.get("t", 0) + 1
    m = beta_1 * slots.get("m", 0.0) + (1 - beta_1) * grad
    v = beta_2 * slots.get("v", 0.0) + (1 - beta_2) * grad * grad
    rate = learning_rate * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
    slots.update(t=t, m=m, v=v)
    return param - weight_decay * param - rate * m / (np.sqrt(v) + epsilon)


def sgdw_reference(param, grad, slots, learning_rate, momentum, weight_decay):
    """One SGDW step as TFA's numpy reference has it: ``accum = momentum accum + g``,
    ``param (1 - wd) - lr accum``."""
    slots["accum"] = momentum * slots.get("accum", 0.0) + grad
    return param - weight_decay * param - learning_rate * slots["accum"]


RULES = {
    "sgdw": (SGDW_TOML, SGDW_SCHEDULED_TOML, sgdw_reference,
             {"learning_rate": 0.001, "momentum": 0.9}),
    "adamw": (ADAMW_TOML, ADAMW_SCHEDULED_TOML, adamw_reference,
              {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-8}),
}


def tables(text, **weight_decay):
    """The pipeline table of a TOML text, with keys added to its weight_decay table."""
    table = tomllib.loads(text)
    table["transforms"][1].update(weight_decay)
    return table


def run_tfa_case(dtype, table, reference, hyper, *, sparse=False, decayed=(True, True)):
    """TFA's do_test: two variables, three steps, every step checked against the
    numpy reference. ``decayed`` says which variables the reference decays."""
    np_dtype = dtype.as_numpy_dtype
    starts = [np.array([1.0, 2.0], np_dtype), np.array([3.0, 4.0], np_dtype)]
    grads_np = [np.array([0.1, 0.1], np_dtype), np.array([0.01, 0.01], np_dtype)]
    variables = [tf.Variable(s, name=f"var{i}_{dtype.name}") for i, s in enumerate(starts)]
    if sparse:
        grads = [tf.IndexedSlices(tf.constant(g), tf.constant([0, 1]), tf.constant([2]))
                 for g in grads_np]
    else:
        grads = [tf.constant(g) for g in grads_np]
    pipe = gradpipe.build(table)
    expected = [s.astype(np.float64) for s in starts]
    slots: list[dict] = [{}, {}]
    for _ in range(3):
        pipe.apply_gradients(zip(grads, variables))
        for i in range(2):
            expected[i] = reference(expected[i], grads_np[i].astype(np.float64), slots[i],
                                    weight_decay=WEIGHT_DECAY if decayed[i] else 0.0,
                                    **hyper)
            assert variables[i].dtype == dtype
            assert_close(variables[i].numpy(), expected[i], **TOLERANCE[dtype])
    assert int(pipe.iterations) == 3


# -- DecoupledWeightDecayExtension: SGDW, AdamW ----------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("variant", ["basic", "sparse", "callable_params", "decay_var_list"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_tfa_weight_decay_optimizer(rule, variant, dtype):
    """TFA's test_basic_*, test_sparse_*, test_basic_callable_params_* and
    test_basic_decay_var_list_* for SGDW and AdamW, with TFA's tolerances."""
    text, scheduled, reference, hyper = RULES[rule]
    if variant == "callable_params":
        table = tables(scheduled)
    elif variant == "decay_var_list":  # decay_var_list=[var0, var1]
        table = tables(text, variables=["^var0_", "^var1_"])
    else:
        table = tables(text)
    run_tfa_case(dtype, table, reference, hyper, sparse=variant == "sparse")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("rule", sorted(RULES))
def test_tfa_var_list_with_exclude_list(rule, dtype):
    """TFA's test_var_list_with_exclude_list_*: decay_var_list=[var0, var1] with
    exclude_from_weight_decay=["var0_*", "var1_*"] decays both, because TFA's list
    overrides the patterns. gradpipe has no such priority: `variables` alone is TFA's
    case, and `exclude` on the same transform removes what it matches (here both)."""
    text, _, reference, hyper = RULES[rule]
    run_tfa_case(dtype, tables(text, variables=["^var0_", "^var1_"]), reference, hyper)
    both = tables(text, variables=["^var0_", "^var1_"], exclude=["var0_*", "var1_*"])
    run_tfa_case(dtype, both, reference, hyper, decayed=(False, False))


@pytest.mark.parametrize("rule", sorted(RULES))
def test_tfa_exclude_from_weight_decay(rule):
    """TFA's test_exclude_weight_decay_*: exclude_from_weight_decay=["var1"] spares
    var1 and var1_weight (a regex searched in the name), not var0. A zero gradient
    leaves only the decay: one step multiplies var0 by 1 - 1e-4."""
    kind = {"sgdw": "sgd", "adamw": "adam"}[rule]
    pipe = gradpipe.build({"transforms": [
        {"kind": kind, "learning_rate": 0.01 if rule == "sgdw" else 1e-4},
        {"kind": "weight_decay", "weight_decay": 1e-4, "exclude": ["var1"]}]})
    variables = [tf.Variable([2.0], name=n) for n in ("var0", "var1", "var1_weight")]
    pipe.apply_gradients((tf.zeros([1]), v) for v in variables)
    assert variables[0].numpy()[0] == np.float32(2.0 - 2.0 * np.float32(1e-4))
    assert variables[1].numpy()[0] == variables[2].numpy()[0] == 2.0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("rule", sorted(RULES))
def test_tfa_sparse_repeated_indices(rule, dtype):
    """TFA's test_sparse_repeated_indices_* and test_optimizer_sparse: rows [1, 1]
    with 0.1 each update like row [1] with 0.2, over four steps (TFA's
    np.testing.assert_allclose: rtol 1e-7)."""
    repeated = tf.IndexedSlices(tf.constant([[0.1], [0.1]], dtype), tf.constant([1, 1]),
                                tf.constant([2, 1]))
    summed = tf.IndexedSlices(tf.constant([[0.2]], dtype), tf.constant([1]),
                              tf.constant([2, 1]))
    text = RULES[rule][0]
    var_repeated = tf.Variable(tf.constant([[1.0], [2.0]], dtype))
    var_summed = tf.Variable(tf.constant([[1.0], [2.0]], dtype))
    pipe_repeated, pipe_summed = gradpipe.build(tables(text)), gradpipe.build(tables(text))
    for _ in range(4):
        pipe_repeated.apply_gradients([(repeated, var_repeated)])
        pipe_summed.apply_gradients([(summed, var_summed)])
        np.testing.assert_allclose(var_repeated.numpy(), var_summed.numpy(), rtol=1e-7)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_sparse_gradient_decays_every_row_unlike_tfa(rule):
    """A difference from TFA, on purpose: `weight_decay` decays every row of a variable
    whose gradient is sparse, exactly as for the same gradient made dense (as Keras 3's
    optimizers do). TFA's _decay_weights_sparse_op decays only the rows the gradient
    touches: here row 1 (never touched) stays 2.0 in TFA and is 2 * 0.99**3 = 1.940598
    after three steps in gradpipe. (TFA's SGDW with momentum = 0 decays no row at all
    for a sparse gradient: tf.keras's legacy SGD applies it without calling the
    extension's _resource_apply_sparse.) `lazy = true` decays as TFA: tested below."""
    text = RULES[rule][0]
    sparse = tf.IndexedSlices(tf.constant([[0.1]]), tf.constant([0]), tf.constant([2, 1]))
    var_sparse, var_dense = tf.Variable([[1.0], [2.0]]), tf.Variable([[1.0], [2.0]])
    pipe_sparse, pipe_dense = gradpipe.build(tables(text)), gradpipe.build(tables(text))
    for _ in range(3):
        pipe_sparse.apply_gradients([(sparse, var_sparse)])
        pipe_dense.apply_gradients([(tf.convert_to_tensor(sparse), var_dense)])
    assert_close(var_sparse.numpy(), var_dense.numpy(), rtol=0, atol=1e-7)
    assert var_sparse.numpy()[1, 0] == pytest.approx(2 * 0.99**3, rel=1e-6)


def test_lazy_weight_decay_decays_only_the_touched_rows_as_tfa():
    """`lazy = true` on both tables is TFA's extend_with_decoupled_weight_decay(LazyAdam)
    on a sparse gradient: the touched row decays by `wd * w` once (rows [0, 0] of
    0.05 each as row [0] of 0.1) and takes LazyAdam's step, TFA's numpy reference's
    for that row (float32, rtol 1e-6); the untouched row is never read or written,
    its moments stay 0, and the update stays rows (the plan says so)."""
    table = tables(ADAMW_TOML, lazy=True)
    table["transforms"][0]["lazy"] = True
    repeated = tf.IndexedSlices(tf.constant([[0.05], [0.05]]), tf.constant([0, 0]),
                                tf.constant([2, 1]))
    var = tf.Variable([[1.0], [2.0]])
    pipe = gradpipe.build(table)
    pipe.build([var])
    assert "by rows       yes: for every variable" in str(pipe.plan), pipe.plan
    step = tf.function(lambda: pipe.apply_gradients([(repeated, var)]))
    expected, slots = np.float64(1.0), {}
    for _ in range(3):
        step()
        expected = adamw_reference(expected, 0.1, slots, weight_decay=WEIGHT_DECAY,
                                   **RULES["adamw"][3])
        assert var.numpy()[1, 0] == 2.0
        np.testing.assert_allclose(var.numpy()[0, 0], expected, rtol=1e-6)
    assert all(slot.numpy()[1, 0] == 0.0 for name, slot in
               pipe.transform_state(0).items() if slot.shape.rank), pipe.named_variables()


ANY_RULE = {  # gradpipe's rule, Keras 3's class with the same arguments
    "sgd": ({"kind": "sgd", "learning_rate": 0.05, "momentum": 0.9},
            lambda: keras.optimizers.SGD(0.05, momentum=0.9)),
    "adagrad": ({"kind": "adagrad", "learning_rate": 0.1},
                lambda: keras.optimizers.Adagrad(0.1)),
    "rmsprop": ({"kind": "rmsprop", "learning_rate": 0.01, "momentum": 0.5},
                lambda: keras.optimizers.RMSprop(0.01, momentum=0.5)),
    "adamax": ({"kind": "adamax", "learning_rate": 0.01},
               lambda: keras.optimizers.Adamax(0.01)),
    "nadam": ({"kind": "nadam", "learning_rate": 0.01},
              lambda: keras.optimizers.Nadam(0.01)),
    "lion": ({"kind": "lion", "learning_rate": 0.001},
             lambda: keras.optimizers.Lion(0.001)),
    "adadelta": ({"kind": "adadelta", "learning_rate": 1.0},
                 lambda: keras.optimizers.Adadelta(1.0)),
    "adam_amsgrad": ({"kind": "adam", "learning_rate": 0.01, "amsgrad": True},
                     lambda: keras.optimizers.Adam(0.01, amsgrad=True)),
}


@pytest.mark.parametrize("rule", sorted(ANY_RULE))
def test_any_rule_plus_weight_decay_is_extend_with_decoupled_weight_decay(rule):
    """TFA's extend_with_decoupled_weight_decay(OptimizerX) decays `var -= wd * var`
    and then takes OptimizerX's step. Here OptimizerX is Keras 3's class, decayed the
    same way before each of its 12 steps of random gradients; the pipeline is the rule
    then `weight_decay`. Rules whose step does not read the variable (TFA's stated
    condition) give the same maths; float32 rounds the two orders differently, by at
    most one ulp a step (measured: at most 2.4e-7 after 12 steps; tolerance rtol 1e-6,
    atol 2e-6). `check_updates = false` only spares the first step the tracing that
    proves a rule's updates finite (2 s for `nadam` on 2 cores); the maths is the same."""
    table, make_keras = ANY_RULE[rule]
    rng = np.random.default_rng(7)
    starts = [rng.normal(size=s).astype("f4") for s in [(4, 3), (3,)]]
    steps = [[rng.normal(size=s).astype("f4") for s in [(4, 3), (3,)]] for _ in range(12)]
    ours = [tf.Variable(s) for s in starts]
    theirs = [tf.Variable(s) for s in starts]
    pipe = gradpipe.build({"pipeline": {"check_updates": False}, "transforms": [
        table, {"kind": "weight_decay", "weight_decay": WEIGHT_DECAY}]})
    optimizer = make_keras()
    for grads in steps:
        pipe.apply_gradients(zip(map(tf.constant, grads), ours))
        for var in theirs:
            var.assign_sub(np.float32(WEIGHT_DECAY) * var)
        optimizer.apply_gradients(zip(map(tf.constant, grads), theirs))
    assert_close([v.numpy() for v in ours], [v.numpy() for v in theirs], rtol=1e-6, atol=2e-6)


def test_weight_decay_on_the_learning_rate_schedule():
    """TFA's docstring: with a scheduled rate, schedule the decay too (`lr = 0.1 *
    schedule(step)`, `wd = 1e-4 * schedule(step)`). In a pipeline the decay reads the
    rule's schedule: `weight_decay = 1e-3` with `learning_rate = "@lr"`. Four steps,
    the schedule dropping tenfold after step 2 (closed form, rtol 1e-6)."""
    pipe = gradpipe.build(tomllib.loads("""
        [schedules.lr]
        kind = "PiecewiseConstantDecay"
        boundaries = [1]
        values = [0.1, 0.01]

        [[transforms]]
        kind = "sgd"
        learning_rate = "@lr"

        [[transforms]]
        kind = "weight_decay"
        weight_decay = 1e-3
        learning_rate = "@lr"
    """))
    var = tf.Variable([1.0, -2.0])
    grad = np.array([0.5, 0.25])
    expected = np.array([1.0, -2.0])
    for step in range(4):
        pipe.apply_gradients([(tf.constant(grad, tf.float32), var)])
        factor = 1.0 if step <= 1 else 0.1  # PiecewiseConstantDecay at iterations = step
        expected = expected - 1e-4 * factor * expected - 0.1 * factor * grad
        assert_close(var.numpy(), expected, rtol=1e-6, atol=0)


def tfa_reference_fit(model, optimizer, weight_decay, x, y, loss, batch_size):
    """What fit() with a TFA weight-decay optimizer does, with Keras 3's class:
    the gradients, then `var -= weight_decay(iterations) * var`, then the step."""
    optimizer.build(model.trainable_variables)
    for step, start in enumerate(range(0, len(x), batch_size)):
        with tf.GradientTape() as tape:
            value = loss(y[start:start + batch_size], model(x[start:start + batch_size]))
        grads = tape.gradient(value, model.trainable_variables)
        for var in model.trainable_variables:
            var.assign_sub(np.float32(weight_decay(step)) * var)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))


FIT_CASES = {
    # TFA's test_keras_fit: AdamW(learning_rate=1e-4, weight_decay=1e-4)
    "adamw": ("""
        [[transforms]]
        kind = "adam"
        learning_rate = 1e-4

        [[transforms]]
        kind = "weight_decay"
        weight_decay = 1e-4
        """, lambda: keras.optimizers.Adam(1e-4), lambda step: 1e-4, 32),
    # TFA's test_keras_fit_with_schedule: weight_decay=ExponentialDecay(0.01, 10, 0.9)
    "adamw_schedule": ("""
        [schedules.wd]
        kind = "ExponentialDecay"
        initial_learning_rate = 0.01
        decay_steps = 10
        decay_rate = 0.9

        [[transforms]]
        kind = "adam"
        learning_rate = 1e-4

        [[transforms]]
        kind = "weight_decay"
        weight_decay = "@wd"
        """, lambda: keras.optimizers.Adam(1e-4), lambda step: 0.01 * 0.9 ** (step / 10), 32),
    # TFA's test_weight_decay_with_piecewise_constant_decay_schedule:
    # SGDW(learning_rate=1e-2, weight_decay=PiecewiseConstantDecay([2], [1e-4, 1e-5])),
    # batch_size=1: steps 0, 1, 2 decay by 1e-4, step 3 by 1e-5
    "sgdw_piecewise": ("""
        [[transforms]]
        kind = "sgd"
        learning_rate = 1e-2

        [[transforms]]
        kind = "weight_decay"
        weight_decay = { kind = "PiecewiseConstantDecay", boundaries = [2], values = [1e-4, 1e-5] }
        """, lambda: keras.optimizers.SGD(1e-2), lambda step: 1e-4 if step <= 2 else 1e-5, 1),
}


@pytest.mark.parametrize("case", sorted(FIT_CASES))
def test_tfa_keras_fit(case):
    """TFA's fit tests (Dense(2), sparse categorical cross-entropy on 4 samples), now
    checked: the weights after fit() equal TFA's decay-then-step in a loop with Keras 3's
    class (rtol 1e-6, atol 1e-7). fit() runs with shuffle=False so the loop sees the
    same batches."""
    text, make_keras, weight_decay, batch_size = FIT_CASES[case]
    rng = np.random.default_rng(11)
    x = rng.uniform(size=(4, 1)).astype("f4")
    y = (rng.uniform(size=(4, 1)) * 2).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ours = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
    theirs = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
    theirs.set_weights(ours.get_weights())
    pipe = gradpipe.build(tomllib.loads(text))
    ours.compile(optimizer=pipe.keras_optimizer(), loss=loss, metrics=["accuracy"])
    ours.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    tfa_reference_fit(theirs, make_keras(), weight_decay, x, y, loss, batch_size)
    assert int(pipe.iterations) == ceil(4 / batch_size)
    assert_close(ours.get_weights(), theirs.get_weights(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weight_decay", [
    1e-4,
    {"kind": "ExponentialDecay", "initial_learning_rate": WEIGHT_DECAY, "decay_steps": 10,
     "decay_rate": 0.9}], ids=["constant", "schedule"])
def test_tfa_serialization(weight_decay):
    """TFA's test_serialization and test_serialization_with_wd_schedule: the pipeline's
    TOML builds the same pipeline again, and its Keras optimizer survives
    keras.optimizers.serialize / deserialize with an equal config."""
    pipe = gradpipe.build({"transforms": [
        {"kind": "adam", "learning_rate": 1e-4},
        {"kind": "weight_decay", "weight_decay": weight_decay, "exclude": ["var1"]}]})
    text = pipe.to_toml()
    assert 'exclude = ["var1"]' in text
    assert gradpipe.build(tomllib.loads(text)).to_toml() == text
    optimizer = pipe.keras_optimizer()
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(again) is type(optimizer)
    assert again.get_config() == optimizer.get_config()


# -- MultiOptimizer: discriminative layer training --------------------------------

# TFA: MultiOptimizer([(Adam(learning_rate=1e-3), model.layers[0]),
#                      (SGD(learning_rate=0), model.layers[1])])
LAYER_GROUPS_TOML = """
[[transforms]]
kind = "adam"
learning_rate = 1e-3
variables = ["first/"]

[[transforms]]
kind = "sgd"
learning_rate = 0.0
variables = ["second/"]
"""


def two_layer_model():
    return keras.Sequential([keras.Input(shape=[1]), keras.layers.Dense(1, name="first"),
                             keras.layers.Dense(1, name="second")])


def reference_fit(model, groups, x, y, batch_size, epochs):
    """TFA's MultiOptimizer in a loop with Keras 3's classes: each optimizer applies the
    gradients of its own group of variables (paths matching its pattern) and no other."""
    variables = model.trainable_variables
    pairs = []
    for optimizer, pattern in groups:
        chosen = [i for i, v in enumerate(variables) if re.search(pattern, v.path)]
        optimizer.build([variables[i] for i in chosen])
        pairs.append((optimizer, chosen))
    mse = keras.losses.MeanSquaredError()

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = mse(yb, model(xb, training=True))
        grads = tape.gradient(loss, variables)
        for optimizer, chosen in pairs:
            optimizer.apply_gradients([(grads[i], variables[i]) for i in chosen])

    for _ in range(epochs):
        for start in range(0, len(x), batch_size):
            step(x[start:start + batch_size], y[start:start + batch_size])


def layer_weights(layers):
    return [w.numpy() for layer in layers for w in layer.weights]


def assert_changed(before, after):
    for b, a in zip(before, after):
        assert not np.allclose(b, a), "a weight did not move"


@pytest.mark.slow  # 3 to 4 s on 2 cores: 130 steps of fit, then of the reference
@pytest.mark.parametrize("serialize", [True, False], ids=["serialize", "in_memory"])
def test_tfa_fit_layer_optimizer(serialize, tmp_path):
    """TFA's test_fit_layer_optimizer: Adam on the first Dense, SGD at rate 0 on the
    second, 10 epochs of 100 samples in batches of 8. The first layer moves, the
    second does not, the count is ceil(100 / 8) * 10; and both layers equal Keras 3's
    Adam and SGD, each applied to its layer alone (rtol 1e-6, atol 1e-6)."""
    model = two_layer_model()
    x, y = np.ones([100, 1], "f4"), np.ones([100, 1], "f4")
    reference = two_layer_model()
    reference.set_weights(model.get_weights())
    before = [layer_weights(model.layers[:1]), layer_weights(model.layers[1:])]
    pipe = gradpipe.build(tomllib.loads(LAYER_GROUPS_TOML))
    model.compile(optimizer=pipe.keras_optimizer(), loss=keras.losses.MeanSquaredError())
    if serialize:  # the whole model, optimizer included, saved and loaded before training
        model.save(tmp_path / "model.keras")
        model = keras.models.load_model(tmp_path / "model.keras")
    model.fit(x, y, batch_size=8, epochs=10, verbose=0)
    assert_changed(before[0], layer_weights(model.layers[:1]))
    assert_close(layer_weights(model.layers[1:]), before[1], rtol=0, atol=0)
    assert int(model.optimizer.iterations) == ceil(100 / 8) * 10
    reference_fit(reference, [(keras.optimizers.Adam(1e-3), "first/"),
                              (keras.optimizers.SGD(0.0), "second/")], x, y, 8, 10)
    assert_close(model.get_weights(), reference.get_weights(), rtol=1e-6, atol=1e-6)


def four_layer_model():
    return keras.Sequential([keras.Input(shape=(4,))] + [
        keras.layers.Dense(units, name=f"layer{i}") for i, units in enumerate([16, 16, 32, 32])])


@pytest.mark.slow  # 3.5 to 5 s on 2 cores: fit with three groups, then the reference
def test_tfa_list_of_layers():
    """TFA's test_list_of_layers: SGD at rate 0 on layer 0, Adam on layer 1, another Adam
    on layers 2 and 3 (a list of layers: a list of patterns). 10 epochs of 4 batches;
    layer 0 keeps its weights, the others move, each group as Keras 3's class on that
    group alone (rtol 1e-5, atol 1e-6)."""
    model = four_layer_model()
    reference = four_layer_model()
    reference.set_weights(model.get_weights())
    before = [layer_weights([layer]) for layer in model.layers]
    pipe = gradpipe.build(tomllib.loads("""
        [[transforms]]
        kind = "sgd"
        learning_rate = 0.0
        variables = ["layer0/"]

        [[transforms]]
        kind = "adam"
        variables = ["layer1/"]

        [[transforms]]
        kind = "adam"
        variables = ["layer2/", "layer3/"]
    """))
    model.compile(pipe.keras_optimizer(), loss="mse")
    x, y = np.ones((128, 4), "f4"), np.ones((128, 32), "f4")
    model.fit(x, y, batch_size=32, epochs=10, verbose=0)
    assert_close(layer_weights(model.layers[:1]), before[0], rtol=0, atol=0)
    for layer, weights in zip(model.layers[1:], before[1:]):
        assert_changed(weights, layer_weights([layer]))
    assert int(model.optimizer.iterations) == ceil(128 / 32) * 10
    reference_fit(reference, [(keras.optimizers.SGD(0.0), "layer0/"),
                              (keras.optimizers.Adam(), "layer1/"),
                              (keras.optimizers.Adam(), "layer[23]/")], x, y, 32, 10)
    assert_close(model.get_weights(), reference.get_weights(), rtol=1e-5, atol=1e-6)


def test_tfa_model_overlapping_groups_are_an_error_naming_both_rules():
    """TFA's test_model gives Adam the whole model and SGD the last layer as well, and
    MultiOptimizer applies both steps to that layer: from 1.0 with gradient 0.5, Adam's
    first step (-1e-3) plus SGD's (-0.01 * 0.5) gives 0.994. A pipeline has no sum of
    two rules: they would apply in turn (SGD's input Adam's step, 0.99999), which is
    what a pattern that also matches another group's layer silently gives. So a
    variable two update rules select, one of them by pattern, is an error naming the
    variable, both rules and their patterns; a chain over every variable is not."""
    variables = [tf.Variable([1.0], name="body"), tf.Variable([1.0], name="last")]
    pipe = gradpipe.build({"transforms": [
        {"kind": "adam"}, {"kind": "sgd", "learning_rate": 0.01, "variables": ["last"]}]})
    with pytest.raises(ConfigError, match=re.escape(
            'transforms[1].variables: last is selected by two update rules, adam at '
            'transforms[0] and sgd at transforms[1] (variables = ["last"]): the second '
            "would take the first one's step as its gradient. Give each variable one rule: "
            'add exclude = ["last"] to adam at transforms[0], or narrow the patterns')):
        pipe.build(variables)
    assert [v.numpy()[0] for v in variables] == [1.0, 1.0]
    # the natural port of two layers' groups: "dense" also matches dense_1
    dense = [tf.Variable([1.0], name="dense/kernel"), tf.Variable([1.0], name="dense_1/kernel")]
    with pytest.raises(ConfigError, match=re.escape(
            'transforms[0].variables: dense_1/kernel is selected by two update rules, adam '
            'at transforms[0] (variables = ["dense"]) and sgd at transforms[1] (variables = '
            '["dense_1"]): the second would take the first one\'s step as its gradient. '
            "Give each variable one rule: narrow the patterns")):
        gradpipe.build({"transforms": [{"kind": "adam", "variables": ["dense"]},
                                       {"kind": "sgd", "variables": ["dense_1"]}]}
                       ).build(dense)
    for chain in ([{"kind": "adam", "variables": ["dense/"]},
                   {"kind": "sgd", "variables": ["dense_1"]}],  # narrowed: one rule each
                  [{"kind": "adam"}, {"kind": "sgd", "learning_rate": 0.5}]):  # on purpose
        pipe = gradpipe.build({"transforms": chain})
        pipe.apply_gradients([(tf.constant([0.5]), v) for v in dense])
    assert dense[0].numpy()[0] == pytest.approx(1.0 - 1e-3 - 0.5 * 1e-3, rel=1e-6)


def test_tfa_subclass_model():
    """TFA's test_subclass_model: a custom loop over a subclassed model of two blocks,
    SGD at rate 0 on block1, Adam on block2. Patterns match the layers' names in the
    variables' paths (`custom/block1/dense/kernel`), not Python attribute names: the
    blocks are named. block2 equals Keras 3's Adam on block2 alone (rtol 1e-6,
    atol 1e-6)."""

    class Block(keras.Model):
        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.dense1 = keras.layers.Dense(units)
            self.dense2 = keras.layers.Dense(units)

        def call(self, x):
            return self.dense2(self.dense1(x))

    class Custom(keras.Model):
        def __init__(self):
            super().__init__()
            self.block1 = Block(16, name="block1")
            self.block2 = Block(32, name="block2")

        def call(self, x):
            return self.block2(self.block1(x))

    x, y = np.ones((128, 4), "f4"), np.ones((128, 32), "f4")
    model, reference = Custom(), Custom()
    model(x[:1])
    reference(x[:1])
    reference.set_weights(model.get_weights())
    block1_before, block2_before = layer_weights([model.block1]), layer_weights([model.block2])
    pipe = gradpipe.build({"transforms": [
        {"kind": "sgd", "learning_rate": 0.0, "variables": ["block1/"]},
        {"kind": "adam", "variables": ["block2/"]}]})
    mse = keras.losses.MeanSquaredError()

    @tf.function
    def train_step(x_batch, y_batch):
        with tf.GradientTape() as tape:
            loss = mse(y_batch, model(x_batch))
        grads = tape.gradient(loss, model.trainable_variables)
        pipe.apply_gradients(zip(grads, model.trainable_variables))

    for _ in range(10):
        for i in range(0, 128, 32):
            train_step(x[i:i + 32], y[i:i + 32])
    assert_close(layer_weights([model.block1]), block1_before, rtol=0, atol=0)
    assert_changed(block2_before, layer_weights([model.block2]))
    assert int(pipe.iterations) == ceil(128 / 32) * 10
    reference_fit(reference, [(keras.optimizers.SGD(0.0), "block1/"),
                              (keras.optimizers.Adam(), "block2/")], x, y, 32, 10)
    assert_close(model.get_weights(), reference.get_weights(), rtol=1e-6, atol=1e-6)


def test_tfa_pretrained_model():
    """TFA's test_pretrained_model with a small convolutional backbone for ResNet50:
    only the head has an optimizer. TFA leaves the other variables alone silently; a
    pipeline refuses to, naming them, until `[pipeline] freeze` lists them."""
    backbone = keras.Sequential([
        keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv"),
        keras.layers.BatchNormalization(name="bn"), keras.layers.GlobalAveragePooling2D()],
        name="backbone")
    head = keras.layers.Dense(32, name="head")
    model = keras.Sequential([backbone, head])
    backbone_before = [w.numpy() for w in backbone.trainable_weights]
    head_before = layer_weights([head])
    sgd_on_head = {"kind": "sgd", "variables": ["head/"]}
    with pytest.raises(gradpipe.ConfigError, match=(
            r"no update rule updates backbone/conv/kernel, .*backbone/bn/beta, so they "
            r"would never change: .*list them in \[pipeline\] freeze")):
        gradpipe.build({"transforms": [sgd_on_head]}).build(model.trainable_variables)
    pipe = gradpipe.build({"pipeline": {"freeze": ["backbone/"]}, "transforms": [sgd_on_head]})
    model.compile(pipe.keras_optimizer(), loss="mse")
    model.fit(np.ones((128, 8, 8, 3), "f4"), np.ones((128, 32), "f4"), batch_size=32,
              verbose=0)
    assert_close([w.numpy() for w in backbone.trainable_weights], backbone_before,
                 rtol=0, atol=0)
    assert_changed(head_before, layer_weights([head]))
    assert int(model.optimizer.iterations) == ceil(128 / 32)


def test_tfa_nested_model():
    """TFA's test_nested_model: three sub-models averaged; SGD on the first and third,
    SGD at rate 0 on the second. The variables of a nested functional model carry its
    layers' names, not the model's (`m1_dense/kernel`), so the layers are named. Each
    group equals Keras 3's SGD on it alone (rtol 1e-6, atol 1e-7)."""

    def get_model(name):
        inputs = keras.Input(shape=(4,))
        return keras.Model(inputs, keras.layers.Dense(1, name=f"{name}_dense")(inputs),
                           name=name)

    def averaged():
        parts = [get_model(name) for name in ("m1", "m2", "m3")]
        inputs = keras.Input(shape=(4,))
        outputs = keras.layers.Average()([part(inputs) for part in parts])
        return keras.Model(inputs, outputs), parts

    (model, parts), (reference, _) = averaged(), averaged()
    reference.set_weights(model.get_weights())
    before = [layer_weights([part]) for part in parts]
    pipe = gradpipe.build({"transforms": [
        {"kind": "sgd", "variables": ["m1_", "m3_"]},
        {"kind": "sgd", "learning_rate": 0.0, "variables": ["m2_"]}]})
    model.compile(pipe.keras_optimizer(), loss="mse")
    x, y = np.ones((128, 4), "f4"), np.ones((128, 32), "f4")
    model.fit(x, y, verbose=0)
    assert_changed(before[0], layer_weights([parts[0]]))
    assert_close(layer_weights([parts[1]]), before[1], rtol=0, atol=0)
    assert_changed(before[2], layer_weights([parts[2]]))
    assert int(model.optimizer.iterations) == ceil(128 / 32)
    reference_fit(reference, [(keras.optimizers.SGD(), "m[13]_"),
                              (keras.optimizers.SGD(0.0), "m2_")], x, y, 32, 1)
    assert_close(model.get_weights(), reference.get_weights(), rtol=1e-6, atol=1e-7)


def test_tfa_multi_optimizer_serialization():
    """TFA's test_serialization: the groups are the TOML, which builds the same pipeline
    again; keras.optimizers.serialize / deserialize keeps the config."""
    pipe = gradpipe.build(tomllib.loads(LAYER_GROUPS_TOML))
    text = pipe.to_toml()
    assert gradpipe.build(tomllib.loads(text)).to_toml() == text
    optimizer = pipe.keras_optimizer()
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert again.get_config() == optimizer.get_config()


def test_tfa_serialization_after_training(tmp_path):
    """TFA's test_serialization_after_training (with an MSE loss: TFA's categorical
    cross-entropy of one unit has zero gradients): fit, save, load; the loaded optimizer
    has the same config, count and state. (That training then continues bit for bit is
    tests/test_keras.py's test_save_load_and_continue_identically.)"""
    x, y = np.ones([100, 1], "f4"), np.ones([100, 1], "f4")
    model = two_layer_model()
    model.compile(loss="mse", optimizer=gradpipe.build(
        tomllib.loads(LAYER_GROUPS_TOML)).keras_optimizer())
    model.fit(x, y, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == ceil(100 / 32)
    assert_close([v.numpy() for v in loaded.optimizer.variables],
                 [v.numpy() for v in model.optimizer.variables], rtol=0, atol=0)
    assert_close(loaded.get_weights(), model.get_weights(), rtol=0, atol=0)


def test_the_tfa_sections_of_the_docs_build():
    """The TOML of docs/transforms.md's TF Addons paragraphs is valid as written."""
    text = (ROOT / "docs" / "transforms.md").read_text()
    sections = [re.split(r"\n#{2,3} ", text.split(heading, 1)[1])[0] for heading in (
        "`weight_decay` after any rule is TF Addons'",
        "### Different rules per variable group (TF Addons `MultiOptimizer`)")]
    blocks = [b for s in sections for b in re.findall(r"```toml\n(.*?)```", s, re.S)]
    assert len(blocks) == 2
    for block in blocks:
        gradpipe.parse(tomllib.loads(block))


def test_each_rule_keeps_state_for_its_group_only(tmp_path):
    """As each of MultiOptimizer's optimizers has slots for its own layers only, a
    rule limited by ``variables`` keeps an empty slot for every other variable (the
    layout shows it); the groups still train as their rules alone, a sparse
    embedding gradient included, and the state survives a checkpoint."""
    def start():
        return [tf.Variable(tf.ones([1000, 8]), name="embedding"),
                tf.Variable(tf.fill([8, 1], 0.5), name="head")]

    table = {"transforms": [{"kind": "adagrad", "learning_rate": 0.1,
                             "variables": ["embedding"]},
                            {"kind": "adam", "learning_rate": 0.1, "variables": ["head"]}]}
    grads = [tf.IndexedSlices(tf.fill([2, 8], 0.5), tf.constant([3, 7]), tf.constant([1000, 8])),
             tf.fill([8, 1], 0.25)]
    variables, pipe = start(), gradpipe.build(table)
    for _ in range(3):
        pipe.apply_gradients(zip(grads, variables))
    slots = {name: shape for name, shape in pipe.layout().items() if name.startswith("slots/")}
    assert slots and all(shape == ([0] if ("adam" in name) == ("embedding" in name) else
                                   ([1000, 8] if "embedding" in name else [8, 1]))
                         for name, shape in slots.items() if "/count" not in name), slots

    alone = start()
    for rule, var, g in ((table["transforms"][0], alone[0], grads[0]),
                         (table["transforms"][1], alone[1], grads[1])):
        single = gradpipe.build({"transforms": [{k: v for k, v in rule.items()
                                                  if k != "variables"}]})
        for _ in range(3):
            single.apply_gradients([(g, var)])
    for a, b in zip(variables, alone):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    tf.train.Checkpoint(optimizer=pipe).write(str(tmp_path / "ckpt"))
    restored = gradpipe.build(table)
    restored.build(start())
    tf.train.Checkpoint(optimizer=restored).read(str(tmp_path / "ckpt")).assert_consumed()
    assert restored.layout() == pipe.layout()
