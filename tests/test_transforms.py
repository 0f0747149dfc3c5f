"""Update rules and transforms against Keras 3, and their closed forms."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import assert_close
from gradpipe import ConfigError

STEPS = 12
RNG = np.random.default_rng(3)
SHAPES = [(4, 3), (3,)]
INIT = [RNG.normal(size=s).astype("f4") for s in SHAPES]
DENSE = [[RNG.normal(size=s).astype("f4") for s in SHAPES] for _ in range(STEPS)]
# Sparse rows for the (4, 3) table. Keras 3 mishandles duplicate indices (Adagrad
# raises InvalidArgumentError eagerly and differs in tf.function), so parity uses
# unique rows; duplicates are tested against the dense gradient instead.
SPARSE = [(RNG.normal(size=(2, 3)).astype("f4"), np.array([3, 1])) for _ in range(STEPS)]
DUPLICATES = [(RNG.normal(size=(3, 3)).astype("f4"), np.array([1, 3, 1]))
              for _ in range(STEPS)]


def keras_run(optimizer, sparse=False):
    variables = [tf.Variable(x, name=n) for x, n in zip(INIT, ["kernel", "bias"])]
    optimizer.build(variables)
    for step in range(STEPS):
        optimizer.apply_gradients(zip(grads_for(step, sparse), variables))
    return [v.numpy() for v in variables]


def pipe_run(transforms, sparse=False, **extra):
    variables = [tf.Variable(x, name=n) for x, n in zip(INIT, ["kernel", "bias"])]
    pipe = gradpipe.build({"transforms": transforms, **extra})
    step_fn = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    for step in range(STEPS):
        step_fn(grads_for(step, sparse))
    return [v.numpy() for v in variables], pipe


def grads_for(step, sparse):
    if not sparse:
        return [tf.constant(g) for g in DENSE[step]]
    values, indices = (DUPLICATES if sparse == "duplicates" else SPARSE)[step]
    return [tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([4, 3])),
            tf.constant(DENSE[step][1])]


CASES = {
    "sgd_momentum": (lambda: keras.optimizers.SGD(0.05, momentum=0.9),
                     [{"kind": "sgd", "learning_rate": 0.05, "momentum": 0.9}]),
    "adam_amsgrad": (lambda: keras.optimizers.Adam(0.01, amsgrad=True),
                     [{"kind": "adam", "learning_rate": 0.01, "amsgrad": True}]),
    "adamw": (lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
              [{"kind": "adamw", "learning_rate": 0.01, "weight_decay": 0.1}]),
    "adagrad": (lambda: keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.2),
                [{"kind": "adagrad", "learning_rate": 0.1, "initial_accumulator_value": 0.2}]),
    "rmsprop": (lambda: keras.optimizers.RMSprop(0.01, rho=0.8),
                [{"kind": "rmsprop", "learning_rate": 0.01, "rho": 0.8}]),
    "rmsprop_centered_momentum": (
        lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
        [{"kind": "rmsprop", "learning_rate": 0.01, "momentum": 0.5, "centered": True}]),
    "ftrl": (lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01,
                                           l2_regularization_strength=0.02,
                                           l2_shrinkage_regularization_strength=0.03,
                                           beta=0.1),
             [{"kind": "ftrl", "learning_rate": 0.1, "l1_regularization_strength": 0.01,
               "l2_regularization_strength": 0.02,
               "l2_shrinkage_regularization_strength": 0.03, "beta": 0.1}]),
    "lamb": (lambda: keras.optimizers.Lamb(0.01),
             [{"kind": "lamb", "learning_rate": 0.01}]),
}


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_keras_parity_twelve_steps(case, sparse):
    """Twelve steps equal the Keras optimizer (rtol 1e-6, atol 1e-6), dense and sparse."""
    make_keras, transforms = CASES[case]
    expected = keras_run(make_keras(), sparse)
    actual, pipe = pipe_run(transforms, sparse)
    assert int(pipe.iterations) == STEPS
    assert_close(actual, expected, rtol=1e-6, atol=1e-6)


RULES = [t for _, t in CASES.values()] + [
    [{"kind": "clippy_adagrad", "learning_rate": 0.1}],
    [{"kind": "lars", "learning_rate": 0.1}],
    [{"kind": "clip_by_global_norm", "clip_norm": 1.0}, {"kind": "sgd", "learning_rate": 0.1}],
    [{"kind": "clip_by_value", "clip_value_min": -0.3, "clip_value_max": 0.3},
     {"kind": "sgd", "learning_rate": 0.1}],
    [{"kind": "larc", "eta": 0.01, "learning_rate": 0.1}, {"kind": "sgd", "learning_rate": 0.1}],
]


@pytest.mark.parametrize("transforms", RULES, ids=lambda t: "+".join(x["kind"] for x in t))
def test_duplicate_sparse_indices_equal_dense_gradient(transforms):
    """IndexedSlices with repeated rows update exactly like their dense sum (atol 1e-6)."""
    sparse, _ = pipe_run(transforms, sparse="duplicates")
    densified = [[tf.convert_to_tensor(g) for g in grads_for(s, "duplicates")]
                 for s in range(STEPS)]
    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build({"transforms": transforms})
    for grads in densified:
        pipe.apply_gradients(zip(grads, variables))
    assert_close(sparse, [v.numpy() for v in variables], rtol=1e-5, atol=1e-6)


def test_sparse_rows_untouched_by_adagrad():
    """Sparse adagrad changes only the touched rows of the table and its accumulator."""
    actual, pipe = pipe_run([{"kind": "adagrad", "learning_rate": 0.1}], sparse=True)
    np.testing.assert_array_equal(actual[0][[0, 2]], INIT[0][[0, 2]])
    acc = pipe.transform_state("adagrad")["accumulator/kernel"].numpy()
    np.testing.assert_array_equal(acc[[0, 2]], np.float32(0.1))


def test_weight_decay_exclusion_matches_keras():
    """adam + weight_decay(exclude) equals Keras AdamW with exclude_from_weight_decay."""
    opt = keras.optimizers.AdamW(0.01, weight_decay=0.2)
    opt.exclude_from_weight_decay(var_names=["bias"])
    expected = keras_run(opt)
    actual, _ = pipe_run([
        {"kind": "adam", "learning_rate": "@lr"},
        {"kind": "weight_decay", "weight_decay": 0.2, "learning_rate": "@lr",
         "exclude": ["bias"]}], schedules={"lr": {"kind": "constant", "value": 0.01}})
    assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    # the same through adamw's own option
    actual, _ = pipe_run([{"kind": "adamw", "learning_rate": 0.01, "weight_decay": 0.2,
                           "exclude_from_weight_decay": ["bias"]}])
    assert_close(actual, expected, rtol=1e-6, atol=1e-6)


def test_l2_is_coupled():
    """l2 adds l2 * w to the gradient before the update rule (closed form, one SGD step)."""
    var = tf.Variable([2.0, -1.0])
    pipe = gradpipe.build({"transforms": [{"kind": "l2", "l2": 0.5},
                                          {"kind": "sgd", "learning_rate": 0.1}]})
    pipe.apply_gradients([(tf.constant([1.0, 1.0]), var)])
    assert_close(var.numpy(), [2 - 0.1 * (1 + 1.0), -1 - 0.1 * (1 - 0.5)], rtol=0, atol=1e-7)


class TestLarc:
    """seed-semantics §2d LARC cases: v=[3,4], g=[.6,.8], lr=.1."""

    def factor(self, **params):
        var = tf.Variable([3.0, 4.0])
        pipe = gradpipe.build({"transforms": [{"kind": "larc", **params},
                                              {"kind": "sgd", "learning_rate": 1.0}]})
        pipe.apply_gradients([(tf.constant([0.6, 0.8]), var)])
        return float(np.linalg.norm(np.array([3.0, 4.0]) - var.numpy()))

    def test_clip_mode(self):
        assert self.factor(eta=0.002, learning_rate=0.1) == pytest.approx(0.1, rel=1e-5)

    def test_scale_mode(self):
        assert self.factor(eta=0.002, mode="scale") == pytest.approx(0.01, rel=1e-5)

    def test_clip_caps_at_one(self):
        assert self.factor(eta=1.0, learning_rate=0.1) == pytest.approx(1.0, rel=1e-6)

    def test_clip_at_a_rate_of_zero_passes_the_gradient_whole(self):
        """A warm-up's first rate is 0: OpenSeq2Seq's ratio / lr is +inf there, its
        factor 1, so a rule's moments see the whole gradient (not 1e-7 of it)."""
        var = tf.Variable([3.0, 4.0])
        g = tf.constant([0.6, 0.8])
        pipe = gradpipe.build({"transforms": [
            {"kind": "larc", "eta": 0.002, "learning_rate": "@lr"},
            {"kind": "novograd", "learning_rate": "@lr", "beta_1": 0.95, "beta_2": 0.98}],
            "schedules": {"lr": {"kind": "linear", "start": 0.0, "end": 0.1, "steps": 10}}})
        pipe.apply_gradients([(g, var)])
        # novograd's second moment starts at ||g||^2 of what LARC passed on
        nu = [v for k, v in pipe.named_variables().items() if "nu" in k]
        assert [float(v.numpy().ravel()[0]) for v in nu] == pytest.approx([1.0], rel=1e-6)
        assert var.numpy() == pytest.approx([3.0, 4.0])  # rate 0: nothing moves

    def test_not_with_global_norm_clipping(self):
        with pytest.raises(ConfigError, match="LARC and gradient norm clipping") as info:
            gradpipe.parse({"transforms": [
                {"kind": "clip_by_global_norm", "clip_norm": 1.0},
                {"kind": "larc", "eta": 0.002, "learning_rate": 0.1},
                {"kind": "sgd"}]})
        assert info.value.path == "transforms[1].kind"

    def test_clip_mode_needs_learning_rate(self):
        with pytest.raises(ConfigError, match="required in mode 'clip'"):
            gradpipe.parse({"transforms": [{"kind": "larc", "eta": 0.002}, {"kind": "sgd"}]})


def openseq2seq_novograd(grads, w0, lr, beta1, beta2, eps, wd, as_executed=False):
    """OpenSeq2Seq's NovoGrad in numpy: the layer's squared norm seeds ``v`` (when
    ``v`` is 0), ``g / sqrt(v + eps) + wd w`` feeds TF1's MomentumOptimizer. Its
    source rebinds the ``v`` variable's Python name to the new value instead of
    assigning it, so as its graph executes ``v`` is 0 before every step."""
    w, v, accum = np.array(w0, np.float64), 0.0, 0.0
    for g in grads:
        g = np.asarray(g, np.float64)
        g2 = float(np.sum(g * g))
        v = g2 if v == 0.0 else beta2 * v + (1 - beta2) * g2
        accum = beta1 * accum + g / np.sqrt(v + eps) + wd * w
        w = w - lr * accum
        if as_executed:
            v = 0.0
    return w


@pytest.mark.parametrize("as_executed", [False, True], ids=["as-written", "as-executed"])
def test_openseq2seq_novograd_mapping(as_executed):
    """The mapping the transforms page gives: epsilon inside the root is
    ``epsilon_root``, ``epsilon = 0``; ``beta_2 = 0`` is OpenSeq2Seq as it runs."""
    rng = np.random.default_rng(3)
    grads = [rng.normal(size=(3, 2)).astype("f4") for _ in range(20)]
    w0 = rng.normal(size=(3, 2)).astype("f4")
    var = tf.Variable(w0)
    pipe = gradpipe.build({"transforms": [{
        "kind": "novograd", "learning_rate": 0.05, "beta_1": 0.95,
        "beta_2": 0.0 if as_executed else 0.98, "epsilon": 0.0, "epsilon_root": 1e-8,
        "weight_decay": 0.001}]})
    for g in grads:
        pipe.apply_gradients([(tf.constant(g), var)])
    expected = openseq2seq_novograd(grads, w0, 0.05, 0.95, 0.98, 1e-8, 0.001, as_executed)
    assert_close(var.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_lars_closed_form():
    """One LARS step: lr * tc * ||w|| / ||g + wd w|| * (g + wd w)."""
    var = tf.Variable([3.0, 4.0])
    pipe = gradpipe.build({"transforms": [{"kind": "lars", "learning_rate": 1.0,
                                           "weight_decay": 0.1, "trust_coefficient": 0.5}]})
    pipe.apply_gradients([(tf.constant([0.0, 0.6]), var)])
    g = np.array([0.3, 1.0])  # g + 0.1 * w
    expected = np.array([3.0, 4.0]) - 0.5 * 5.0 / np.linalg.norm(g) * g
    assert_close(var.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_weight_decay_must_follow_update_rule():
    with pytest.raises(ConfigError) as raised:
        gradpipe.parse({"transforms": [{"kind": "weight_decay", "weight_decay": 0.1},
                                       {"kind": "sgd"}]})
    message = str(raised.value)
    assert "transforms[0].kind" in message and "must come after one" in message
    assert "move it below transforms[1] ('sgd')" in message
    assert "use 'l2'" in message  # what a user of the built-in may have meant


@pytest.mark.parametrize("kind, hint", [("l2", "use 'weight_decay'"), ("larc", "")])
def test_a_gradient_transform_after_the_last_rule_is_an_error(kind, hint):
    """l2 and larc change the gradient a rule reads: after the last rule they would
    change the step (l2 would decay the weights by l2 * w, not scaled by the rate).
    Between two groups' rules, with a rule after it, l2 is where it belongs."""
    options = {"l2": {"l2": 0.5}, "larc": {"eta": 0.002, "mode": "scale"}}[kind]
    with pytest.raises(ConfigError) as raised:
        gradpipe.parse({"transforms": [{"kind": "sgd"}, {"kind": kind, **options}]})
    message = str(raised.value)
    assert (f"transforms[1].kind: '{kind}' changes the gradient an update rule reads "
            "(its plugin declares before_update_rule)") in message
    assert "move it above transforms[0] ('sgd')" in message and hint in message
    gradpipe.parse({"transforms": [{"kind": "adam", "variables": ["head"]},
                                   {"kind": kind, "exclude": ["head"], **options},
                                   {"kind": "sgd", "exclude": ["head"]}]})


@pytest.mark.parametrize("tables, others", [
    ([{"kind": "swa", "start_averaging": -1, "bogus": 3}, {"kind": "adam"}],
     ["transforms[0].start_averaging: must be >= 0", "transforms[0].bogus: unknown key"]),
    ([{"kind": "swa"}, {"kind": "adam", "learning_rate": -1.0}],
     ["transforms[1].learning_rate: must be >= 0"]),
], ids=["its-own-values-invalid", "the-rule-after-it-invalid"])
def test_chain_order_is_judged_beside_invalid_values(tables, others):
    """A table with a bad value is still told where it belongs, and a rule with a bad
    value still counts as the rule to move it below, in the same report."""
    with pytest.raises(ConfigError) as raised:
        gradpipe.parse({"transforms": tables})
    message = str(raised.value)
    assert "transforms[0].kind: 'swa' changes the step an update rule computed" in message
    assert "move it below transforms[1] ('adam')" in message
    assert all(other in message for other in others), message
    assert len(raised.value.problems) == len(others) + 1


def test_chain_order_error_is_worded_from_the_rule_broken():
    """A third party's after_update_rule: the rule and the fix, no advice about decay."""
    from conftest import register_transform
    from gradpipe.plugin import Capabilities, Transform, no_state

    register_transform("nudge_after", lambda cfg: Transform(no_state, lambda g, s, v: (g, s)),
                       capabilities=Capabilities(after_update_rule=True))
    with pytest.raises(ConfigError) as raised:
        gradpipe.parse({"transforms": [{"kind": "nudge_after"}]})
    message = str(raised.value)
    assert "'nudge_after' changes the step an update rule computed" in message
    assert "declares after_update_rule" in message
    assert "add an update rule such as 'sgd' or 'adam' before it" in message
    assert "decay" not in message and "l2" not in message


def test_scheduled_weight_decay_under_xla():
    """weight_decay follows its schedule inside a jit-compiled step, with one trace."""
    var = tf.Variable([1.0])
    pipe = gradpipe.build({"transforms": [
        {"kind": "sgd", "learning_rate": 0.0},
        {"kind": "weight_decay", "weight_decay": {"kind": "piecewise_constant",
                                                  "learning_rate": 0.1, "boundaries": [1],
                                                  "decay_rates": [0.0]}}]})
    pipe.build([var])
    step = tf.function(lambda: pipe.apply_gradients([(tf.constant([0.0]), var)]),
                       jit_compile=True)
    values = []
    for _ in range(3):
        step()
        values.append(float(var.numpy()[0]))
    assert values == pytest.approx([0.9, 0.81, 0.81], rel=1e-6)
    assert step.experimental_get_tracing_count() == 1


def test_variables_and_freeze_patterns():
    """`variables` limits a transform; `freeze` leaves variables untouched."""
    actual, _ = pipe_run([{"kind": "sgd", "learning_rate": 0.1, "variables": ["kernel"]}],
                         pipeline={"freeze": ["bias"]})
    np.testing.assert_array_equal(actual[1], INIT[1])  # frozen: no update
    assert not np.array_equal(actual[0], INIT[0])
    actual, _ = pipe_run([{"kind": "sgd", "learning_rate": 0.1}],
                         pipeline={"freeze": ["kernel"]})
    np.testing.assert_array_equal(actual[0], INIT[0])
    assert not np.array_equal(actual[1], INIT[1])


def test_a_variable_no_update_rule_selects_is_an_error_naming_both_fixes(write_toml):
    """Keras's exclude_from_weight_decay still updates biases: `exclude` on adamw
    would freeze them forever, so it is refused at build, with the way to say each."""
    path = write_toml("""
        [[transforms]]
        kind = "clip_by_global_norm"
        clip_norm = 1.0

        [[transforms]]
        kind = "adamw"
        exclude = ["bias"]
    """)
    pipe = gradpipe.load(path)
    kernel, bias = tf.Variable(INIT[0], name="kernel"), tf.Variable(INIT[1], name="bias")
    with pytest.raises(ConfigError) as info:
        pipe.build([kernel, bias])
    assert info.value.path == "transforms[1].exclude" and info.value.line == 7
    assert str(info.value) == (
        f"{path}:7: transforms[1].exclude: no update rule updates bias, so it would never "
        'change: adamw at transforms[1] excludes it (exclude = ["bias"]). To spare it '
        'only the weight decay, write exclude_from_weight_decay = ["bias"] on adamw '
        "instead of exclude; to freeze it on purpose, list it in [pipeline] freeze")
    # both fixes build
    fixed = gradpipe.build({"transforms": [
        {"kind": "adamw", "exclude_from_weight_decay": ["bias"]}]})
    fixed.build([kernel, bias])
    gradpipe.build({"pipeline": {"freeze": ["bias"]}, "transforms": [
        {"kind": "adamw", "exclude": ["bias"]}]}).build([kernel, bias])


def test_variables_selected_by_no_rule_name_each_rule():
    pipe = gradpipe.build({"transforms": [{"kind": "adam", "variables": ["kernel"]},
                                          {"kind": "sgd", "exclude": ["kernel", "bias"]}]})
    with pytest.raises(ConfigError, match=(
            r"no update rule updates bias, so it would never change: adam at transforms\[0\] "
            r'does not include it \(variables = \["kernel"\]\); sgd at transforms\[1\] '
            r'excludes it \(exclude = \["bias"\]\)\. To freeze it on purpose')):
        pipe.build([tf.Variable(INIT[0], name="kernel"), tf.Variable(INIT[1], name="bias")])


@pytest.mark.parametrize("where, extra", [
    ("transforms[0].variables[0]", {"transforms": [{"kind": "sgd", "variables": ["nope"]}]}),
    ("pipeline.freeze[0]", {"pipeline": {"freeze": ["nope"]}, "transforms": [{"kind": "sgd"}]}),
    ("transforms[0].exclude_from_weight_decay[0]",
     {"transforms": [{"kind": "adamw", "exclude_from_weight_decay": ["nope"]}]}),
])
def test_pattern_matching_nothing_is_an_error(where, extra):
    var = tf.Variable([1.0], name="kernel")
    pipe = gradpipe.build(extra)
    with pytest.raises(ConfigError, match="pattern 'nope' matches no variable") as info:
        pipe.build([var])
    assert info.value.path == where


def test_accumulation_equals_one_large_batch():
    """4 micro-batches with accumulation_steps=4 equal one step on the whole batch."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 3)).astype("f4")
    y = rng.normal(size=(32, 1)).astype("f4")

    def train(batches, k):
        w = tf.Variable(np.ones((3, 1), "f4"))
        pipe = gradpipe.build({"pipeline": {"accumulation_steps": k},
                               "transforms": [{"kind": "adam", "learning_rate": 0.1}]})
        for _ in range(3):
            for xb, yb in zip(np.split(x, batches), np.split(y, batches)):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(xb @ w - yb))
                pipe.apply_gradients([(tape.gradient(loss, w), w)])
        return w.numpy(), int(pipe.iterations)

    big, n_big = train(1, 1)
    small, n_small = train(4, 4)
    assert n_big == n_small == 3
    assert_close(small, big, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("table, key", [
    ({"kind": "adagrad", "initial_accumulator_value": -1.0}, "initial_accumulator_value"),
    ({"kind": "rmsprop", "rho": 1.5}, "rho"),
    ({"kind": "ftrl", "learning_rate_power": 0.5}, "learning_rate_power"),
    ({"kind": "lamb", "beta_2": 1.0}, "beta_2"),
    ({"kind": "lars", "trust_coefficient": 0.0}, "trust_coefficient"),
    ({"kind": "larc", "eta": -1.0, "learning_rate": 1.0}, "eta"),
    ({"kind": "larc", "eta": 1.0, "mode": "clipp", "learning_rate": 1.0}, "mode"),
    ({"kind": "adamw", "weight_decay": -0.1}, "weight_decay"),
    ({"kind": "sgd", "momentum": 1.5}, "momentum"),
    ({"kind": "l2", "l2": -1.0}, "l2"),
])
def test_invalid_values_name_the_key(table, key):
    with pytest.raises(ConfigError) as info:
        gradpipe.parse({"transforms": [table, {"kind": "sgd"}]})
    assert info.value.path == f"transforms[0].{key}"


@pytest.mark.parametrize(("clip_norm", "grad_scale"), [(0.5, 1.0), (1.7, 0.1), (1.0, 0.1)],
                         ids=["clipped", "unclipped-factor-above-1", "unclipped"])
def test_global_norm_clipping_is_keras_bit_for_bit(clip_norm, grad_scale):
    """Keras computes ``c * min(1/norm, 1/c)`` in float32 (``1/c`` rounded from
    float64), and so does gradpipe: the clipped gradients equal Keras's exactly
    (rtol 0, atol 0). Unclipped at c = 1.7 that factor is 1 + 2**-23, in Keras too
    (OpenSeq2Seq's ``tf.clip_by_global_norm`` gets 1 - 2**-24 there: Keras wins)."""
    assert np.float32(1.7) * np.float32(1 / 1.7) == np.float32(1 + 2**-23)
    grads = [tf.constant(g * grad_scale) for g in DENSE[0]]
    # from zeros, the variables end as minus the clipped gradients, with no rounding
    keras_vars = [tf.Variable(tf.zeros(s)) for s in SHAPES]
    keras.optimizers.SGD(1.0, global_clipnorm=clip_norm).apply_gradients(
        zip(grads, keras_vars))
    ours = [tf.Variable(tf.zeros(s)) for s in SHAPES]
    pipe = gradpipe.build({"transforms": [
        {"kind": "clip_by_global_norm", "clip_norm": clip_norm},
        {"kind": "sgd", "learning_rate": 1.0}]})
    tf.function(lambda: pipe.apply_gradients(zip(grads, ours)))()
    for mine, theirs in zip(ours, keras_vars):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    if clip_norm == 1.7:  # the decision: OpenSeq2Seq's clipping differs by an ulp here
        reference, _ = tf.clip_by_global_norm(grads, clip_norm)
        assert any(np.any(-mine.numpy() != r.numpy()) for mine, r in zip(ours, reference))
