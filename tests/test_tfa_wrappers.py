"""``lookahead``, ``moving_average`` and ``swa`` against TF Addons' own tests.

TF Addons does not import on TensorFlow 2.21, so its tests
(``tensorflow_addons/optimizers/tests/lookahead_test.py``,
``moving_average_test.py``, ``stochastic_weight_averaging_test.py``) are ported:
the same variables, gradients, hyperparameters and expected values, with the
wrapped Keras optimizer written as the gradpipe chain before the wrapper.
Beyond them: a third-party transform inside the wrapped chain, checkpoint and
resume mid-period bit for bit, and the averages swapped into a Keras model for
``evaluate`` and ``save`` and back.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from gradpipe.errors import ConfigError, GradpipeError
from gradpipe.plugins.weight_averaging import (
    assign_averaged_weights,
    averaged_values,
    averaged_weights,
)


def build(*transforms: dict) -> gradpipe.Pipeline:
    return gradpipe.build({"transforms": list(transforms)})


def apply(pipe, grads, variables, steps: int = 1) -> None:
    for _ in range(steps):
        pipe.apply_gradients(zip(grads, variables))


def tfa_sample(sparse: bool, seed: int = 0x2019):
    """TF Addons' ``run_dense_sample`` / ``run_sparse_sample`` inputs."""
    rng = np.random.RandomState(seed)
    values = [rng.random_sample((2,)), rng.random_sample((2,))]
    if sparse:
        grads = [tf.IndexedSlices(tf.constant([rng.standard_normal()], tf.float32),
                                  tf.constant([i]), tf.constant([2])) for i in (0, 1)]
    else:
        grads = [tf.constant(rng.standard_normal((2,)), tf.float32) for _ in range(2)]
    return values, grads


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("k", [5, 10, 100])
def test_lookahead_exact_ratio(sparse, k):
    """TF Addons ``test_dense_exact_ratio`` / ``test_sparse_exact_ratio``: after
    ``k`` steps the weights are ``start + alpha (fast - start)``, ``fast`` the
    weights plain Adam reaches."""
    values, grads = tfa_sample(sparse)
    for alpha in (0.3, 0.7):
        fast = [tf.Variable(v, dtype=tf.float32) for v in values]
        slow = [tf.Variable(v, dtype=tf.float32) for v in values]
        apply(build({"kind": "adam"}), grads, fast, k)
        apply(build({"kind": "adam"}, {"kind": "lookahead", "sync_period": k,
                                        "slow_step_size": alpha}), grads, slow, k)
        for value, f, s in zip(values, fast, slow):
            start = value.astype(np.float32)
            np.testing.assert_allclose(s.numpy(), start + (f.numpy() - start) * alpha,
                                       rtol=1e-6, atol=1e-6)


def test_lookahead_wraps_a_third_party_transform_and_syncs_every_period():
    """The chain ``agc`` (gradpipe-agc, an installed distribution) -> ``sgd`` is
    wrapped whole: each period ends ``alpha`` of the way from its start to where
    the chain alone would be, and the next period starts there."""
    chain = [{"kind": "agc", "clipping": 0.05}, {"kind": "sgd", "learning_rate": 0.1,
                                                   "momentum": 0.9}]
    var = tf.Variable([1.0, -2.0, 0.5])
    pipe = build(*chain, {"kind": "lookahead", "sync_period": 3, "slow_step_size": 0.4})
    grads = [tf.constant([0.3, -0.2, 0.9])]
    momentum = gradpipe.build({"transforms": chain})  # the same chain, for the fast path
    probe = tf.Variable(var)
    for _ in range(2):  # two periods
        start = var.numpy()
        probe.assign(start)
        for _ in range(3):
            apply(momentum, grads, [probe])
            apply(pipe, grads, [var])
        np.testing.assert_allclose(var.numpy(), start + 0.4 * (probe.numpy() - start),
                                   rtol=1e-6)
    assert "agc" in str(pipe.plan) and "lookahead" in str(pipe.plan)


def test_lookahead_resumes_mid_period_bit_for_bit(tmp_path):
    """Checkpoint after 4 of a period's 6 steps; a new pipeline and new variables restored
    from it continues exactly as the uninterrupted one."""
    table = [{"kind": "adam", "learning_rate": 0.01}, {"kind": "lookahead"}]
    grads = [tf.constant([0.5, -1.0, 2.0]), tf.constant([[0.1, 0.2], [0.3, -0.4]])]

    def start():
        return [tf.Variable([1.0, 2.0, 3.0]), tf.Variable([[1.0, -1.0], [0.5, 0.25]])]

    straight, pipe = start(), build(*table)
    apply(pipe, grads, straight, 4)
    tf.train.Checkpoint(optimizer=pipe, weights=straight).write(str(tmp_path / "ckpt"))
    apply(pipe, grads, straight, 9)

    resumed, fresh = start(), build(*table)
    tf.train.Checkpoint(optimizer=fresh, weights=resumed).read(str(tmp_path / "ckpt"))
    apply(fresh, grads, resumed, 9)
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_lookahead_learning_rate_is_settable():
    """TF Addons ``test_model_dynamic_lr``: the wrapped rule's rate reads and sets."""
    var = tf.Variable([[1.0]])
    pipe = build({"kind": "adam"}, {"kind": "lookahead", "sync_period": 10,
                                    "slow_step_size": 0.4})
    apply(pipe, [tf.constant([[0.1]])], [var])
    np.testing.assert_allclose(pipe.learning_rate.numpy(), 1e-3)
    pipe.learning_rate = 1e-4
    np.testing.assert_allclose(pipe.learning_rate.numpy(), 1e-4)


def ma_pipe(**keys) -> gradpipe.Pipeline:
    return build({"kind": "sgd", "learning_rate": keys.pop("lr", 2.0)},
                 {"kind": "moving_average", **keys})


def test_moving_average_run():
    """TF Addons ``test_run``: weights and averages after two SGD steps, then the
    averages assigned for good."""
    var0, var1 = tf.Variable([1.0, 2.0]), tf.Variable([3.0, 4.0])
    pipe = ma_pipe(average_decay=0.5)
    apply(pipe, [tf.constant([0.1, 0.1]), tf.constant([0.01, 0.01])], [var0, var1], 2)
    np.testing.assert_allclose(var0.numpy(), [0.6, 1.6], rtol=1e-6)
    np.testing.assert_allclose(var1.numpy(), [2.96, 3.96], rtol=1e-6)
    avg0, avg1 = averaged_values(pipe)
    np.testing.assert_allclose(avg0.numpy(), [0.75, 1.75], rtol=1e-6)
    np.testing.assert_allclose(avg1.numpy(), [2.975, 3.975], rtol=1e-6)
    assign_averaged_weights(pipe)
    np.testing.assert_allclose(var0.numpy(), [0.75, 1.75], rtol=1e-6)
    np.testing.assert_allclose(var1.numpy(), [2.975, 3.975], rtol=1e-6)


@pytest.mark.parametrize("keys, average", [
    ({"start_step": 1, "lr": 1.0}, [0.85, 1.85]),  # test_start_step
    ({"dynamic_decay": True}, [0.64, 1.64]),  # test_dynamic_decay
    # num_updates = 0 caps the decay at 1/10: 0.1 * 0.82 + 0.9 * 0.6
    ({"num_updates": 0}, [0.622, 1.622]),
])
def test_moving_average_decay_options(keys, average):
    """TF Addons ``test_start_step`` and ``test_dynamic_decay`` (two steps of
    ``[0.1, 0.1]`` on ``[1, 2]``), and ``num_updates``'s fixed cap."""
    var = tf.Variable([1.0, 2.0])
    pipe = ma_pipe(average_decay=0.5, **keys)
    apply(pipe, [tf.constant([0.1, 0.1])], [var], 2)
    np.testing.assert_allclose(averaged_values(pipe)[0].numpy(), average, rtol=1e-6)


@pytest.mark.parametrize("value", [1.0, "a", True, -1])
def test_moving_average_num_updates_must_be_a_count(value):
    """TF Addons ``test_num_updates_invalid``: a float or a string is an error."""
    with pytest.raises(ConfigError, match="num_updates"):
        ma_pipe(num_updates=value)


def test_weights_loaded_after_building_are_averaged():
    """The first average starts from the weights at the first step, not from
    those the pipeline saw when it was built."""
    var = tf.Variable([5.0, 5.0])
    pipe = ma_pipe(average_decay=0.5)
    pipe.build([var])
    var.assign([1.0, 2.0])
    apply(pipe, [tf.constant([0.1, 0.1])], [var])
    np.testing.assert_allclose(averaged_values(pipe)[0].numpy(), [0.9, 1.9], rtol=1e-6)


def test_swa_averaging():
    """TF Addons ``test_averaging``: SGD(1.0), start 0, period 1, three steps."""
    var0, var1 = tf.Variable([1.0, 1.0]), tf.Variable([2.0, 2.0])
    pipe = build({"kind": "sgd", "learning_rate": 1.0},
                 {"kind": "swa", "start_averaging": 0, "average_period": 1})
    apply(pipe, [tf.constant([0.1, 0.1])] * 2, [var0, var1], 3)
    np.testing.assert_allclose(var0.numpy(), [0.7, 0.7], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(var1.numpy(), [1.7, 1.7], rtol=1e-6, atol=1e-6)
    assign_averaged_weights(pipe)
    np.testing.assert_allclose(var0.numpy(), [0.8, 0.8], rtol=1e-6)
    np.testing.assert_allclose(var1.numpy(), [1.8, 1.8], rtol=1e-6)


def test_swa_members_by_period():
    """From step ``start_averaging`` (from 0), every ``average_period``-th new
    weights join: SGD(1) on ``w = 0`` with gradient -1 gives ``w_t = t``; start 2,
    period 3, 10 steps average ``w_3, w_6, w_9`` = 6. Before the first member
    there is no average to swap in."""
    var = tf.Variable([0.0])
    pipe = build({"kind": "sgd", "learning_rate": 1.0},
                 {"kind": "swa", "start_averaging": 2, "average_period": 3})
    apply(pipe, [tf.constant([-1.0])], [var], 2)
    with pytest.raises(GradpipeError, match=r"swa has no average yet: 2 steps applied, and "
                                            r"step 2 \(from 0\) is its first member"):
        averaged_values(pipe)
    apply(pipe, [tf.constant([-1.0])], [var], 8)
    np.testing.assert_allclose(averaged_values(pipe)[0].numpy(), [6.0])


def test_moving_average_before_any_step_has_no_average():
    var = tf.Variable([0.0])
    pipe = build({"kind": "sgd"}, {"kind": "moving_average"})
    pipe.build([var])
    with pytest.raises(GradpipeError, match=r"^moving_average has no average yet: no step "
                                            r"applied$"):
        averaged_values(pipe)
    apply(pipe, [tf.constant([-1.0])], [var], 1)  # w: 0 -> 0.01, decay 0.99 from 0
    assert averaged_values(pipe)[0].numpy() == pytest.approx([1e-4])


@pytest.mark.parametrize("keys", [{"average_period": 0}, {"start_averaging": -1},
                                  {"average_period": 2.5}])
def test_swa_rejects_tfa_invalid_periods(keys):
    """TF Addons raises for ``average_period < 1`` and ``start_averaging < 0``."""
    with pytest.raises(ConfigError, match=next(iter(keys))):
        build({"kind": "sgd"}, {"kind": "swa", **keys})


def test_wrappers_must_follow_an_update_rule():
    with pytest.raises(ConfigError, match="after"):
        build({"kind": "lookahead"}, {"kind": "adam"})


def test_swap_needs_one_averaging_transform():
    var = tf.Variable([1.0])
    pipe = build({"kind": "sgd"}, {"kind": "lookahead"})
    apply(pipe, [tf.constant([1.0])], [var])
    with pytest.raises(GradpipeError, match="moving_average or swa"):
        averaged_values(pipe)


@pytest.mark.slow
@pytest.mark.parametrize("kind, keys", [("moving_average", {"average_decay": 0.9}),
                                        ("swa", {"start_averaging": 62, "average_period": 10})])
def test_averages_swap_into_a_keras_model_for_evaluate_and_save(kind, keys, tmp_path):
    """TF Addons ``test_fit_simple_linear_model`` in small: ``model.fit`` with the
    pipeline, then the averages inside the block for ``evaluate`` and ``save``
    (the saved model holds them), the trained weights after it."""
    import keras

    rng = np.random.RandomState(0x2019)
    x = rng.standard_normal((2000, 3)).astype(np.float32)
    w = rng.standard_normal((3, 1)).astype(np.float32)
    y = x @ w + rng.standard_normal((2000, 1)).astype(np.float32) * 1e-4
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    pipe = build({"kind": "sgd", "learning_rate": 0.05}, {"kind": kind, **keys})
    model.compile(pipe.keras_optimizer(), loss="mse")
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    trained = [v.numpy() for v in model.weights]
    averages = [a.numpy() for a in averaged_values(pipe)]
    assert not np.allclose(trained[0], averages[0], rtol=0, atol=1e-7)
    with averaged_weights(pipe):
        for var, average in zip(model.weights, averages):
            np.testing.assert_array_equal(var.numpy(), average)
        loss = model.evaluate(x, y, verbose=0)
        model.save(tmp_path / "averaged.keras")
    for var, value in zip(model.weights, trained):
        np.testing.assert_array_equal(var.numpy(), value)
    saved = keras.models.load_model(tmp_path / "averaged.keras", compile=False)
    for var, average in zip(saved.weights, averages):
        np.testing.assert_array_equal(var.numpy(), average)
    predicted = saved.predict(x[:100], verbose=0)
    assert loss < 1e-3 and np.max(np.abs(predicted - x[:100] @ w)) < 5e-2


def test_swap_under_mirrored_strategy():
    """TF Addons ``test_swap_weights`` (MirroredStrategy, SGD(2.0), decay 0.5, a
    gradient of 0.1 once the two replicas' halves are summed): the average goes
    into every replica's copy and the trained weights come back."""
    pipe = gradpipe.build({"placement": {"kind": "mirrored", "devices": ["/cpu:0", "/cpu:1"]},
                           "transforms": [{"kind": "sgd", "learning_rate": 2.0},
                                          {"kind": "moving_average", "average_decay": 0.5}]})
    strategy = pipe.strategy
    with strategy.scope():
        var = tf.Variable([1.0, 2.0])
    pipe.build([var])
    tf.function(lambda: strategy.run(
        lambda: pipe.apply_gradients([(tf.constant([0.05, 0.05]), var)])))()  # summed: 0.1
    copies = lambda: [v.numpy() for v in strategy.experimental_local_results(var)]  # noqa: E731
    for copy in copies():
        np.testing.assert_allclose(copy, [0.8, 1.8], rtol=1e-6)
    with averaged_weights(pipe):
        for copy in copies():
            np.testing.assert_allclose(copy, [0.9, 1.9], rtol=1e-6)
    for copy in copies():
        np.testing.assert_allclose(copy, [0.8, 1.8], rtol=1e-6)


@pytest.mark.parametrize("kind", ["swa", "schedule_free_adamw"])
def test_a_step_inside_the_swapped_block_is_an_error_and_the_keras_optimizer_is_accepted(
        kind):
    """A step applied while the averages are swapped in trains them, and the block's
    end puts the trained weights back: an error after the weights are back. The
    helpers take the Keras optimizer (``model.optimizer``) as well as the pipeline."""
    from gradpipe.plugins import schedule_free_adamw

    if kind == "swa":
        pipe = build({"kind": "sgd", "learning_rate": 0.5}, {"kind": "swa"})
        values, swapped = averaged_values, averaged_weights
    else:
        pipe = gradpipe.build({"transforms": [{"kind": kind, "learning_rate": 0.5}]})
        values, swapped = schedule_free_adamw.averaged_values, \
            schedule_free_adamw.averaged_weights
    var = tf.Variable([1.0, 2.0])
    for _ in range(2):  # two members: the average is not the weights
        pipe.apply_gradients([(tf.constant([0.2, -0.4]), var)])
    trained = var.numpy()
    optimizer = pipe.keras_optimizer()
    np.testing.assert_array_equal(values(optimizer)[0].numpy(), values(pipe)[0].numpy())
    with swapped(optimizer):  # evaluating inside: no error
        inside = var.numpy()
    assert not np.array_equal(inside, trained)
    error = r"^1 step applied inside averaged_weights\(\) trained the weights.*train outside"
    with pytest.raises(GradpipeError, match=error), swapped(pipe):
        pipe.apply_gradients([(tf.constant([0.2, -0.4]), var)])
    np.testing.assert_array_equal(var.numpy(), trained)
