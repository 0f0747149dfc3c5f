"""``adafactor``, ``muon`` and ``schedule_free_adamw`` against Keras 3.

Three kinds of evidence for each rule: Keras's own golden values, ported from
``keras/src/optimizers/{adafactor,muon,schedule_free_adamw}_test.py`` (through
the public API only); twelve steps of random gradients against the Keras class;
and IndexedSlices gradients (with repeated rows) against their dense sum.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import assert_close
from gradpipe.plugins.schedule_free_adamw import averaged_values, averaged_weights

STEPS = 12
RNG = np.random.default_rng(11)
# path -> shape. For muon: a matrix (Muon), a bias (AdamW: rank 1), an embedding
# (AdamW: "embedding" in its path), an output layer (AdamW with exclude_layers=["head"])
# and a rank-3 kernel (AdamW: rank != 2; adafactor factors its last two axes).
SHAPES = {"dense/kernel": (4, 3), "dense/bias": (3,), "embedding/embeddings": (5, 3),
          "head/kernel": (3, 2), "conv/kernel": (2, 3, 4)}
INIT = {p: RNG.normal(size=s).astype("f4") for p, s in SHAPES.items()}
GRADS = [{p: RNG.normal(size=s).astype("f4") for p, s in SHAPES.items()}
         for _ in range(STEPS)]


def keras_variables(paths=SHAPES):
    """Keras variables whose ``path`` is ``layer/weight`` (what a layer's weights get)."""
    out = []
    for path in paths:
        layer, weight = path.split("/")
        with keras.name_scope(layer):
            out.append(keras.Variable(INIT[path], name=weight))
    assert [v.path for v in out] == list(paths)
    return out


def keras_run(optimizer, paths=SHAPES):
    variables = keras_variables(paths)
    for grads in GRADS:
        optimizer.apply_gradients(zip([tf.constant(grads[p]) for p in paths], variables))
    return [v.numpy() for v in variables]


def pipe_run(table, paths=SHAPES, schedules=None):
    variables = keras_variables(paths)
    pipe = gradpipe.build({"transforms": [table], "schedules": schedules or {}})
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    for grads in GRADS:
        step([tf.constant(grads[p]) for p in paths])
    return [v.numpy() for v in variables], pipe


def apply_once(table, values, grads, name="w"):
    """One step of ``table`` on a fresh ``tf.Variable``; the new value."""
    var = tf.Variable(np.asarray(values, "f4"), name=name)
    gradpipe.build({"transforms": [table]}).apply_gradients(
        [(tf.constant(np.asarray(grads, "f4")), var)])
    return var.numpy()


# -- a. Keras's golden values ---------------------------------------------------------


class TestAdafactorGolden:
    """Ported from keras/src/optimizers/adafactor_test.py (Keras 3.15)."""

    def test_correctness_with_golden(self):
        """``test_correctness_with_golden``: its table, its tolerance (rtol = atol = 5e-4)."""
        table = {"kind": "adafactor", "learning_rate": 0.5, "beta_2_decay": -0.65,
                 "epsilon_1": 1e-15, "epsilon_2": 1e-4, "clip_threshold": 0.9,
                 "relative_step": False}
        x = tf.Variable(np.ones([10], "f4"))
        grads = tf.constant(np.arange(0.1, 1.1, 0.1), tf.float32)
        first_grads = tf.constant(np.full((10,), 0.01), tf.float32)
        golden = np.array(
            [[0.55] * 10,
             [0.3031, 0.3026, 0.3025, 0.3024, 0.3024, 0.3024, 0.3024, 0.3024, 0.3024, 0.3024],
             [0.1671, 0.1665, 0.1663, 0.1663, 0.1663, 0.1663, 0.1663, 0.1663, 0.1663, 0.1663],
             [0.0923, 0.0916, 0.0915, 0.0914, 0.0914, 0.0914, 0.0914, 0.0914, 0.0914, 0.0914],
             [0.0554, 0.0548, 0.0546, 0.0546, 0.0546, 0.0546, 0.0546, 0.0545, 0.0545, 0.0545]])
        pipe = gradpipe.build({"transforms": [table]})
        pipe.apply_gradients([(first_grads, x)])
        for i in range(5):
            np.testing.assert_allclose(x.numpy(), golden[i], rtol=5e-4, atol=5e-4)
            pipe.apply_gradients([(grads, x)])

    def test_single_step_1d(self):
        """``test_single_step_1d`` (rtol = atol = 1e-4): a vector keeps a full second moment."""
        new = apply_once({"kind": "adafactor", "learning_rate": 0.5},
                         [1.0, 2.0, 3.0, 4.0], [1.0, 6.0, 7.0, 2.0])
        np.testing.assert_allclose(new, [-0.3693, 0.6307, 1.6307, 2.6307],
                                   rtol=1e-4, atol=1e-4)

    def test_single_step_2d(self):
        """``test_single_step_2d`` (rtol = atol = 1e-4): a matrix's moment is factored."""
        new = apply_once({"kind": "adafactor", "learning_rate": 0.5},
                         [[1.0, 2.0], [3.0, 4.0]], [[1.0, 6.0], [7.0, 2.0]])
        np.testing.assert_allclose(new, [[0.7007, -0.0081], [1.2492, 3.4407]],
                                   rtol=1e-4, atol=1e-4)

    def test_weight_decay(self):
        """``test_weight_decay``: three decayed steps of a zero gradient give 1.9760959
        (6 decimals, as Keras checks); an excluded variable stays 2.0."""
        table = {"kind": "adafactor", "learning_rate": 1.0, "weight_decay": 0.004}
        var1 = tf.Variable(2.0, name="var1")
        for _ in range(3):  # Keras applies optimizer_1, _2 and _3 to var1 in turn
            gradpipe.build({"transforms": [table]}).apply_gradients([(tf.zeros(()), var1)])
        var2 = tf.Variable(2.0, name="exclude")
        gradpipe.build({"transforms": [{**table, "exclude_from_weight_decay": ["exclude"]}]}
                       ).apply_gradients([(tf.zeros(()), var2)])
        assert float(var1.numpy()) == pytest.approx(1.9760959, abs=1e-6)
        assert float(var2.numpy()) == pytest.approx(2.0, abs=1e-6)


class TestMuonGolden:
    """Ported from keras/src/optimizers/muon_test.py (Keras 3.15), which has no
    multi-step golden test: its single steps and Newton-Schulz values instead."""

    def test_newton_schulz(self):
        """``test_Newton_Schulz`` (rtol = atol = 1e-3). With momentum 0, learning
        rate 1 and no RMS scaling, one Muon step from zeros is minus the iteration's
        output (Keras calls ``zeropower_via_newtonschulz5`` directly)."""
        table = {"kind": "muon", "learning_rate": 1.0, "momentum": 0.0, "rms_rate": 0.0,
                 "weight_decay": 0.0}
        new = apply_once(table, np.zeros((2, 2)), [[0.2499, 0.9105], [0.2655, 0.8824]])
        np.testing.assert_allclose(-new, [[-0.4422, 0.6457], [0.7285, 0.2968]],
                                   rtol=1e-3, atol=1e-3)

    def test_muon_single_step(self):
        """``test_muon_single_step`` (rtol = atol = 1e-2, Keras's tolerance)."""
        table = {"kind": "muon", "learning_rate": 0.5, "weight_decay": 0.0}
        new = apply_once(table, [[1.0, 2.0], [3.0, 4.0]], [[1.0, 6.0], [7.0, 2.0]])
        np.testing.assert_allclose(new, [[0.988775, 1.887053], [2.873428, 3.97035]],
                                   rtol=1e-2, atol=1e-2)

    def test_adamw_single_step(self):
        """``test_adamw_single_step`` (rtol = atol = 1e-4). Keras calls ``update_step``,
        which skips the weight decay, so ``adam_weight_decay`` is 0 here."""
        table = {"kind": "muon", "learning_rate": 0.5, "adam_weight_decay": 0.0}
        new = apply_once(table, [1.0, 2.0, 3.0, 4.0], [1.0, 6.0, 7.0, 2.0], "test_vars")
        np.testing.assert_allclose(new, [0.5, 1.5, 2.5, 3.5], rtol=1e-4, atol=1e-4)

    @pytest.mark.parametrize("shape, key", [((2, 2), "weight_decay"),
                                            ((), "adam_weight_decay")])
    def test_weight_decay(self, shape, key):
        """``test_muon_weight_decay`` and ``test_adamw_weight_decay`` (rtol = atol =
        1e-4): ``var - var * 0.01`` at rate 1, ``weight_decay`` for a matrix,
        ``adam_weight_decay`` for a scalar (a zero gradient steps by 0 in both)."""
        value = np.arange(1.0, 5.0).reshape(shape) if shape else np.float32(2.0)
        table = {"kind": "muon", "learning_rate": 1.0, "weight_decay": 0.0,
                 "adam_weight_decay": 0.0, key: 0.01}
        new = apply_once(table, value, np.zeros(shape))
        np.testing.assert_allclose(new, value - value * 0.01, rtol=1e-4, atol=1e-4)

    def test_should_use_adamw(self):
        """``test_should_use_adamw``: ``exclude_layers`` and an ``Embedding`` layer's
        weight take AdamW, a ``Dense`` kernel Muon; which step a variable took shows in
        its AdamW velocity (a scalar placeholder for Muon variables)."""
        embedding = keras.layers.Embedding(2, 2)
        embedding.build()
        dense = keras.layers.Dense(2)
        dense.build([None, 2])
        var = keras.Variable([[1.0, 2.0], [3.0, 4.0]], name="var")
        variables = [var, embedding.weights[0], dense.weights[0]]

        def velocity_shapes(**options):
            pipe = gradpipe.build({"transforms": [{"kind": "muon", **options}]})
            pipe.build(variables)
            slots = pipe.transform_state("muon")
            return [tuple(v.shape) for k, v in slots.items() if k.startswith("velocity/")]

        assert velocity_shapes(exclude_layers=["var"]) == [(2, 2), (2, 2), ()]
        assert velocity_shapes() == [(), (2, 2), ()]
        assert velocity_shapes(exclude_embeddings=False) == [(), (), ()]

    def test_lr_adjust(self):
        """``test_lr_adjust_2d`` / ``test_lr_adjust_none``: a (4, 2) step is scaled by
        ``rms_rate * sqrt(max(4, 2))``; ``rms_rate = 0`` (Keras's None) leaves it
        (rtol 1e-6)."""
        grads = RNG.normal(size=(4, 2))
        plain, scaled = (-apply_once({"kind": "muon", "learning_rate": 1.0,
                                      "weight_decay": 0.0, "rms_rate": r},
                                     np.zeros((4, 2)), grads) for r in (0.0, 0.2))
        np.testing.assert_allclose(scaled, plain * 0.2 * 2, rtol=1e-6)


def schedule_free_reference(y0, grads, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-8):
    """Defazio et al. 2024 (Algorithm 1, Adam-normalised, c_t = 1/t), in float64,
    tracking x itself rather than recovering it: (y, x) after ``grads``."""
    y, z, x, v = (np.asarray(y0, "f8"),) * 3 + (0.0,)
    for t, g in enumerate(grads, 1):
        v = beta_2 * v + (1 - beta_2) * np.square(g)
        z = z - lr * g / (np.sqrt(v / (1 - beta_2 ** t)) + epsilon)
        x = (1 - 1 / t) * x + z / t
        y = (1 - beta_1) * z + beta_1 * x
    return y, x


class TestScheduleFreeGolden:
    """Ported from keras/src/optimizers/schedule_free_adamw_test.py (Keras 3.15), whose
    tests check directions, not values; golden values from the paper's algorithm."""

    def test_single_step(self):
        """``test_single_step``, with the value it must take: at t = 1, x = z, so
        ``y = y0 - lr * g / (|g| + epsilon)`` (rtol = atol = 1e-6)."""
        new = apply_once({"kind": "schedule_free_adamw", "learning_rate": 0.5},
                         [1.0, 2.0, 3.0, 4.0], [1.0, 6.0, 7.0, 2.0])
        np.testing.assert_allclose(new, [0.5, 1.5, 2.5, 3.5], rtol=1e-6, atol=1e-6)

    def test_twelve_steps_follow_the_paper(self):
        """Twelve steps equal the paper's algorithm in float64 (rtol 1e-5, atol 1e-6)."""
        y0, grads = INIT["dense/kernel"], [g["dense/kernel"] for g in GRADS]
        var = tf.Variable(y0)
        pipe = gradpipe.build({"transforms": [{"kind": "schedule_free_adamw",
                                               "learning_rate": 0.05}]})
        for g in grads:
            pipe.apply_gradients([(tf.constant(g), var)])
        y, x = schedule_free_reference(y0, grads, 0.05)
        np.testing.assert_allclose(var.numpy(), y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(averaged_values(pipe)[0].numpy(), x, rtol=1e-5, atol=1e-6)

    def test_warmup(self):
        """``test_warmup``: with ``warmup_steps = 10`` the first step is smaller; it is
        the step at rate ``0.5 * 1 / 10`` exactly (rtol = atol = 1e-6)."""
        table = {"kind": "schedule_free_adamw", "learning_rate": 0.5}
        start, grads = [1.0, 2.0, 3.0], [1.0, 1.0, 1.0]
        plain = apply_once(table, start, grads)
        warm = apply_once({**table, "warmup_steps": 10}, start, grads)
        assert np.all(np.abs(warm - start) < np.abs(plain - start))
        np.testing.assert_allclose(warm, apply_once({**table, "learning_rate": 0.05},
                                                    start, grads), rtol=1e-6, atol=1e-6)

    def test_multiple_steps(self):
        """``test_multiple_steps``: ten steps of a positive gradient lower every weight."""
        var = tf.Variable([1.0, 2.0, 3.0])
        pipe = gradpipe.build({"transforms": [{"kind": "schedule_free_adamw",
                                               "learning_rate": 0.01}]})
        for _ in range(10):
            pipe.apply_gradients([(tf.constant([0.1, 0.1, 0.1]), var)])
        assert np.all(var.numpy() < [1.0, 2.0, 3.0])

    def test_weight_decay(self):
        """``test_weight_decay``: an excluded variable keeps 2.0 under a zero gradient
        (6 decimals). One not excluded: Keras decays ``y`` only, and at t = 1 the
        average ``x`` is ``z``, so the first step undoes the decay; the values of three
        steps, 2.0, 1.9959999, 1.9920105, are the Keras class's (atol 1e-6)."""
        table = {"kind": "schedule_free_adamw", "learning_rate": 1.0, "weight_decay": 0.004}
        var1, var2 = tf.Variable(2.0, name="var1"), tf.Variable(2.0, name="exclude")
        pipe = gradpipe.build({"transforms": [{**table,
                                               "exclude_from_weight_decay": ["exclude"]}]})
        for expected in (2.0, 1.9959999, 1.9920105):
            pipe.apply_gradients([(tf.zeros(()), var1), (tf.zeros(()), var2)])
            assert float(var1.numpy()) == pytest.approx(expected, abs=1e-6)
            assert float(var2.numpy()) == pytest.approx(2.0, abs=1e-6)


# -- b. twelve steps against the Keras class ---------------------------------------


class LinearRate(keras.optimizers.schedules.LearningRateSchedule):
    """Keras's twin of gradpipe's ``linear`` schedule."""

    def __init__(self, start, end, steps):
        self.start, self.end, self.steps = start, end, steps

    def __call__(self, step):
        frac = keras.ops.clip(keras.ops.cast(step, "float32") / self.steps, 0.0, 1.0)
        return self.start + (self.end - self.start) * frac


def _linear(start, end):
    return {"kind": "linear", "start": start, "end": end, "steps": 8}


KERAS_CASES = {
    "adafactor": (lambda: keras.optimizers.Adafactor(0.05),
                  {"kind": "adafactor", "learning_rate": 0.05}),
    "adafactor_all_args": (
        lambda: keras.optimizers.Adafactor(0.5, beta_2_decay=-0.65, epsilon_1=1e-15,
                                           epsilon_2=1e-4, clip_threshold=0.9,
                                           relative_step=False, weight_decay=0.1),
        {"kind": "adafactor", "learning_rate": 0.5, "beta_2_decay": -0.65,
         "epsilon_1": 1e-15, "epsilon_2": 1e-4, "clip_threshold": 0.9,
         "relative_step": False, "weight_decay": 0.1}),
    "adafactor_schedule": (lambda: keras.optimizers.Adafactor(LinearRate(0.5, 0.05, 8)),
                           {"kind": "adafactor", "learning_rate": "@lr"}),
    "muon": (lambda: keras.optimizers.Muon(0.01, exclude_layers=["head"]),
             {"kind": "muon", "learning_rate": 0.01, "exclude_layers": ["head"]}),
    "muon_all_args": (
        lambda: keras.optimizers.Muon(0.02, adam_beta_1=0.8, adam_beta_2=0.99,
                                      adam_weight_decay=0.1, epsilon=1e-6, weight_decay=0.2,
                                      exclude_embeddings=False, muon_a=3.0, muon_b=-4.0,
                                      muon_c=1.5, adam_lr_ratio=0.1, momentum=0.9,
                                      ns_steps=4, nesterov=False, rms_rate=0.3),
        {"kind": "muon", "learning_rate": 0.02, "adam_beta_1": 0.8, "adam_beta_2": 0.99,
         "adam_weight_decay": 0.1, "epsilon": 1e-6, "weight_decay": 0.2,
         "exclude_embeddings": False, "muon_a": 3.0, "muon_b": -4.0, "muon_c": 1.5,
         "adam_lr_ratio": 0.1, "momentum": 0.9, "ns_steps": 4, "nesterov": False,
         "rms_rate": 0.3}),
    "muon_no_rms_rate": (lambda: keras.optimizers.Muon(0.01, rms_rate=None),
                         {"kind": "muon", "learning_rate": 0.01, "rms_rate": 0.0}),
    "muon_schedule": (lambda: keras.optimizers.Muon(LinearRate(0.05, 0.005, 8)),
                      {"kind": "muon", "learning_rate": "@lr"}),
    # Keras 3.15 on the TensorFlow backend (see the module of schedule_free_adamw)
    "schedule_free_adamw": (
        lambda: keras.optimizers.ScheduleFreeAdamW(0.01),
        {"kind": "schedule_free_adamw", "learning_rate": 0.01,
         "keras_tf_momentum_read": True}),
    "schedule_free_adamw_all_args": (
        lambda: keras.optimizers.ScheduleFreeAdamW(0.05, beta_1=0.8, beta_2=0.99,
                                                   epsilon=1e-6, warmup_steps=5,
                                                   weight_decay=0.1),
        {"kind": "schedule_free_adamw", "learning_rate": 0.05, "beta_1": 0.8,
         "beta_2": 0.99, "epsilon": 1e-6, "warmup_steps": 5, "weight_decay": 0.1,
         "keras_tf_momentum_read": True}),
    "schedule_free_adamw_schedule": (
        lambda: keras.optimizers.ScheduleFreeAdamW(LinearRate(0.05, 0.005, 8)),
        {"kind": "schedule_free_adamw", "learning_rate": "@lr",
         "keras_tf_momentum_read": True}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(KERAS_CASES))
def test_twelve_steps_match_keras(case):
    """Twelve steps of random gradients on every variable of SHAPES (a matrix, a bias,
    an embedding, an excluded layer, a rank-3 kernel) equal the Keras class (atol 1e-4,
    rtol 1e-5; measured: below 1e-6)."""
    make_keras, table = KERAS_CASES[case]
    expected = keras_run(make_keras())
    rate = table["learning_rate"]
    schedules = {"lr": _linear(*{"adafactor": (0.5, 0.05)}.get(table["kind"], (0.05, 0.005)))
                 } if rate == "@lr" else None
    actual, pipe = pipe_run(table, schedules=schedules)
    assert int(pipe.iterations) == STEPS
    for e, start in zip(expected, INIT.values()):
        assert not np.allclose(e, start, atol=1e-4)  # every variable moved
    assert_close(actual, expected, rtol=1e-5, atol=1e-4)


def test_muon_takes_both_steps_as_keras_decides():
    """In the ``muon`` parity case the kernel takes Muon and the other four AdamW, as
    Keras's ``_should_use_adamw`` decides for them."""
    opt = keras.optimizers.Muon(exclude_layers=["head"])
    variables = keras_variables()
    keras_adamw = [opt._should_use_adamw(v) for v in variables]
    _, pipe = pipe_run({"kind": "muon", "learning_rate": 0.01, "exclude_layers": ["head"]})
    slots = pipe.transform_state("muon")
    ours = [slots[f"velocity/{p.replace('/', '.')}"].shape.rank > 0 for p in SHAPES]
    assert ours == keras_adamw == [False, True, True, True, True]


@pytest.mark.slow
def test_muon_in_fit_decides_by_the_keras_paths():
    """``compile()``/``fit()`` of a model with an Embedding layer, a hidden Dense and an
    output layer excluded by name: the same weights as Keras's ``Muon`` (atol 1e-4);
    the engine sees the layers' paths, so the embedding and the output take AdamW.
    Each batch uses each token once: Keras 3 mishandles repeated rows of an
    IndexedSlices gradient (it squares and scatters them one by one), where gradpipe
    steps like the dense gradient (test_sparse_gradient_equals_its_dense_sum)."""
    rng = np.random.default_rng(5)
    tokens = np.concatenate([rng.permutation(48).reshape(16, 3) for _ in range(4)])
    targets = rng.normal(size=(64, 1)).astype("f4")

    def model():
        keras.utils.set_random_seed(2)
        return keras.Sequential([keras.Input((3,), dtype="int32"),
                                 keras.layers.Embedding(48, 4), keras.layers.Flatten(),
                                 keras.layers.Dense(8, activation="tanh"),
                                 keras.layers.Dense(1, name="last")])

    trained = []
    pipe = gradpipe.build({"transforms": [{"kind": "muon", "learning_rate": 0.01,
                                           "exclude_layers": ["last"]}]})
    native = keras.optimizers.Muon(0.01, exclude_layers=["last"])
    for optimizer in (native, pipe.keras_optimizer()):
        m = model()
        m.compile(optimizer=optimizer, loss="mse")
        m.fit(tokens, targets, batch_size=16, epochs=2, verbose=0, shuffle=False)
        trained.append([np.asarray(w) for w in m.get_weights()])
    assert_close(trained[1], trained[0], rtol=1e-5, atol=1e-4)
    velocities = [v for k, v in pipe.transform_state("muon").items()
                  if k.startswith("velocity/")]
    ours = [v.shape.rank > 0 for v in velocities]  # in the model's order
    assert ours == [native._should_use_adamw(w) for w in m.trainable_weights]
    assert ours == [True, False, True, True, True]  # only the hidden kernel takes Muon


def test_muon_step_converges_on_a_matrix():
    """The contract suite's problems are vectors (AdamW in ``muon``); a least-squares
    problem in a (4, 3) matrix takes the Newton-Schulz step, and with a rate decaying
    linearly to 0 over 300 steps reaches the least-squares loss (within 1e-3)."""
    rng = np.random.default_rng(1)
    a = tf.constant(rng.normal(size=(6, 4)).astype("f4"))
    target = tf.constant(rng.normal(size=(6, 3)).astype("f4"))
    w = tf.Variable(tf.zeros((4, 3)), name="w")

    def loss():
        return tf.reduce_mean(tf.square(a @ w - target))

    best = np.linalg.lstsq(a.numpy(), target.numpy(), rcond=None)[0]
    best_loss = float(np.mean(np.square(a.numpy() @ best - target.numpy())))
    pipe = gradpipe.build({"transforms": [{"kind": "muon", "learning_rate": "@lr",
                                           "weight_decay": 0.0}],
                           "schedules": {"lr": {"kind": "linear", "start": 0.1, "end": 0.0,
                                                "steps": 300}}})
    first = float(loss())
    pipe.minimize(loss, [w], 300)
    assert pipe.transform_state("muon")["velocity/w"].shape.rank == 0  # the Muon step
    assert float(loss()) < best_loss + 1e-3 < first


@pytest.mark.slow
def test_schedule_free_default_differs_from_keras_tf_only_by_the_momentum_read():
    """Keras 3.15 on TensorFlow reads ``momentum.value`` after ``assign_sub``: it is the
    live variable there. The default follows the paper (checked above); with
    ``keras_tf_momentum_read`` the same code equals the Keras class (atol 1e-4)."""
    live = keras.Variable([1.0])
    value = live.value
    live.assign_sub([1.0])
    assert float(tf.convert_to_tensor(value)[0]) == 0.0  # the read sees the new value
    expected = keras_run(keras.optimizers.ScheduleFreeAdamW(0.01))
    paper, _ = pipe_run({"kind": "schedule_free_adamw", "learning_rate": 0.01})
    keras_tf, _ = pipe_run({"kind": "schedule_free_adamw", "learning_rate": 0.01,
                            "keras_tf_momentum_read": True})
    assert_close(keras_tf, expected, rtol=1e-5, atol=1e-4)
    assert max(np.abs(a - e).max() for a, e in zip(paper, expected)) > 1e-3
    # There the weights are the running average of z, whatever beta_1 is (rtol 1e-5,
    # atol 1e-6); the paper's weights depend on it.
    other = keras_run(keras.optimizers.ScheduleFreeAdamW(0.01, beta_1=0.5))
    assert_close(other, expected, rtol=1e-5, atol=1e-6)
    other_paper, _ = pipe_run({"kind": "schedule_free_adamw", "learning_rate": 0.01,
                               "beta_1": 0.5})
    assert max(np.abs(a - e).max() for a, e in zip(other_paper, paper)) > 1e-3


@pytest.mark.parametrize("jit", [False, True])  # compiled: a guard per variable
def test_adafactor_skips_the_step_keras_turns_to_nan(jit):
    """A matrix gradient with a row and a column of zeros (an input that was 0 in the
    batch, a unit that never fired): Keras's factored moment ``r / mean(r) * c`` is
    about 1e-60 there, which rounds to 0, and ``0 / sqrt(0)`` makes the clipped update
    of the whole matrix NaN. gradpipe keeps Keras's maths, rounding included, so it
    checks ``adafactor``'s updates of a matrix (no bound or proof can exclude this)
    and skips the step, writing nothing; the next ordinary gradient steps as Keras
    does."""
    grads = np.ones([4, 3], "f4")
    grads[0, :], grads[:, 0] = 0.0, 0.0
    keras_var, var = (tf.Variable(np.full([4, 3], 0.5, "f4")) for _ in range(2))
    keras.optimizers.Adafactor(0.01).apply_gradients([(tf.constant(grads), keras_var)])
    assert np.isnan(keras_var.numpy()).all()
    pipe = gradpipe.build({"transforms": [{"kind": "adafactor", "learning_rate": 0.01}],
                           "pipeline": {"jit_compile": jit}})
    assert not bool(pipe.apply_gradients([(tf.constant(grads), var)]))
    np.testing.assert_array_equal(var.numpy(), np.full([4, 3], 0.5, "f4"))
    assert int(pipe.skipped_steps.numpy()) == 1
    assert "; variables of rank 2 or more are checked" in str(pipe.plan)
    keras_var.assign(var)
    keras.optimizers.Adafactor(0.01).apply_gradients([(tf.ones([4, 3]), keras_var)])
    assert bool(pipe.apply_gradients([(tf.ones([4, 3]), var)]))
    np.testing.assert_array_equal(var.numpy(), keras_var.numpy())


# -- evaluating schedule_free_adamw at the averaged point ---------------------------


def test_averaged_weights_swaps_x_in_and_y_back():
    """``averaged_weights`` puts x into the variables for the block and y back after;
    training after the block is what it would have been without it (bit for bit)."""
    table = {"kind": "schedule_free_adamw", "learning_rate": 0.05}
    runs = []
    for swap in (False, True):
        var = tf.Variable(INIT["dense/kernel"], name="kernel")
        pipe = gradpipe.build({"transforms": [table]})
        grads = [g["dense/kernel"] for g in GRADS]
        for i, g in enumerate(grads):
            pipe.apply_gradients([(tf.constant(g), var)])
            if swap and i == 5:
                y = var.numpy()
                _, x = schedule_free_reference(INIT["dense/kernel"], grads[:6], 0.05)
                with averaged_weights(pipe) as variables:
                    assert variables[0] is var
                    np.testing.assert_allclose(var.numpy(), x, rtol=1e-5, atol=1e-6)
                    assert np.abs(var.numpy() - y).max() > 1e-3
                np.testing.assert_array_equal(var.numpy(), y)
        runs.append(var.numpy())
    np.testing.assert_array_equal(runs[0], runs[1])


def test_averaged_values_before_any_step_are_the_weights():
    var = tf.Variable(INIT["dense/bias"], name="bias")
    pipe = gradpipe.build({"transforms": [{"kind": "schedule_free_adamw"}]})
    pipe.build([var])
    np.testing.assert_array_equal(averaged_values(pipe)[0].numpy(), INIT["dense/bias"])


def test_averaged_values_of_packed_state():
    """Twenty small variables: the engine packs the state into one vector (nothing in
    the default config reads a variable's name); the weights and the averaged point
    are those of the state kept variable by variable (rtol 1e-5, atol 1e-6)."""
    rng = np.random.default_rng(4)
    init = [rng.normal(size=3).astype("f4") for _ in range(20)]
    grads = [[rng.normal(size=3).astype("f4") for _ in init] for _ in range(5)]
    runs = []
    for pack in ("auto", False):
        variables = [tf.Variable(x, name=f"v{i}") for i, x in enumerate(init)]
        pipe = gradpipe.build({"pipeline": {"pack_variables": pack},
                               "transforms": [{"kind": "schedule_free_adamw",
                                               "learning_rate": 0.1}]})
        pipe.build(variables)
        assert str(pipe.plan.pack).startswith("yes" if pack else "no")
        for step in grads:
            pipe.apply_gradients(zip([tf.constant(g) for g in step], variables))
        runs.append(([v.numpy() for v in variables],
                     [x.numpy() for x in averaged_values(pipe)]))
    assert_close(runs[0], runs[1], rtol=1e-5, atol=1e-6)


# -- c. IndexedSlices equal their dense sum ----------------------------------------

SPARSE_SHAPES = {"dense/kernel": (4, 3), "embedding/embeddings": (4, 3), "dense/bias": (3,)}
SPARSE_STEPS = 6
SPARSE_INIT = {p: RNG.normal(size=s).astype("f4") for p, s in SPARSE_SHAPES.items()}
SPARSE = [[(RNG.normal(size=(3, 3)).astype("f4"), np.array([1, 3, 1])) for _ in range(2)]
          + [RNG.normal(size=3).astype("f4")] for _ in range(SPARSE_STEPS)]


def _sparse_grads(step, densify):
    grads = [tf.IndexedSlices(tf.constant(v), tf.constant(i), tf.constant([4, 3]))
             for v, i in SPARSE[step][:2]] + [tf.constant(SPARSE[step][2])]
    return [tf.convert_to_tensor(g) for g in grads] if densify else grads


@pytest.mark.parametrize("table", [
    {"kind": "adafactor", "learning_rate": 0.1},
    {"kind": "muon", "learning_rate": 0.05},  # the kernel Muon, the embedding AdamW
    {"kind": "schedule_free_adamw", "learning_rate": 0.05},
], ids=lambda t: t["kind"])
@pytest.mark.slow
def test_sparse_gradient_equals_its_dense_sum(table):
    """Six steps of IndexedSlices with a repeated row equal the same dense gradients
    (rtol 1e-5, atol 1e-6), under tf.function."""
    results = []
    for densify in (False, True):
        variables = [tf.Variable(SPARSE_INIT[p], name=p) for p in SPARSE_SHAPES]
        pipe = gradpipe.build({"transforms": [table]})
        step = tf.function(lambda g, pipe=pipe, variables=variables:
                           pipe.apply_gradients(zip(g, variables)))
        for s in range(SPARSE_STEPS):
            step(_sparse_grads(s, densify))
        results.append([v.numpy() for v in variables])
    assert_close(results[0], results[1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(results[0][0], SPARSE_INIT["dense/kernel"])
