"""Loss scalers against Keras 3, TF1 and the OpenSeq2Seq closed forms."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import assert_close
from gradpipe import ConfigError

INF, NAN = np.inf, np.nan


def scaler(table):
    return gradpipe.create("loss_scale", table)


def trajectory(s, finite_flags):
    """Scale after each update, feeding a finite or an Inf gradient."""
    out = []
    for ok in finite_flags:
        _, apply = s.update([tf.constant([1.0 if ok else INF])])
        assert bool(apply) == ok
        out.append(float(s()))
    return out


class TestDynamicAgainstKeras:
    SEQUENCE = [1, 1, INF, 1, 1, 1, NAN, 1, 1, 1, 1, INF, INF, 1, 1, 1, 1, 1]

    @pytest.mark.parametrize("initial, growth", [(2.0**15, 2000), (400.0, 3), (1.0, 2)])
    def test_step_by_step(self, initial, growth):
        """Scale, variables and iterations equal Keras LossScaleOptimizer at every step."""
        rng = np.random.default_rng(1)
        init = rng.normal(size=4).astype("f4")
        k_var, g_var = tf.Variable(init), tf.Variable(init)
        lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                                  initial_scale=initial,
                                                  dynamic_growth_steps=growth)
        lso.build([k_var])
        pipe = gradpipe.build({
            "loss_scale": {"kind": "dynamic", "initial_loss_scale": initial,
                           "increment_period": growth, "min_loss_scale": 0.0},
            "transforms": [{"kind": "sgd", "learning_rate": 0.1}]})
        for poison in self.SEQUENCE:
            g = rng.normal(size=4).astype("f4") * poison
            # each side scales its "loss" by its own current scale
            lso.apply_gradients([(tf.constant(g) * lso.dynamic_scale, k_var)])
            pipe.apply_gradients([(tf.constant(g) * pipe.loss_scale, g_var)])
            assert float(pipe.loss_scale) == float(lso.dynamic_scale)
            assert int(pipe.iterations) == int(lso.iterations)
            np.testing.assert_allclose(g_var.numpy(), k_var.numpy(), rtol=1e-6, atol=1e-7)

    def test_no_floor_like_keras(self):
        """min_loss_scale = 0: initial 1 and three overflows give 0.125 (Keras case 7)."""
        s = scaler({"kind": "dynamic", "initial_loss_scale": 1.0, "min_loss_scale": 0.0})
        assert trajectory(s, [False] * 3) == [0.5, 0.25, 0.125]


class TestDynamicAgainstTF1:
    CASES = [
        dict(initial=4.0, period=2, mult=2.0, flags=[1, 1, 0, 1, 1, 1, 0, 0, 0]),
        dict(initial=1.0, period=5, mult=2.0, flags=[0, 0, 1, 1]),       # floor 1
        dict(initial=8.0, period=0, mult=3.0, flags=[1, 1, 0, 1]),       # period 0
        dict(initial=3e38, period=1, mult=2.0, flags=[1, 1, 0, 1]),      # scale overflow
    ]

    @pytest.mark.parametrize("case", CASES)
    def test_trajectory(self, case):
        """Same scale and should_apply as tf.compat.v1 DynamicLossScale at every step."""
        ref = tf.compat.v1.mixed_precision.DynamicLossScale(
            case["initial"], case["period"], case["mult"])
        ours = scaler({"kind": "dynamic", "initial_loss_scale": case["initial"],
                       "increment_period": case["period"], "multiplier": case["mult"]})
        for ok in case["flags"]:
            g = [tf.constant([1.0 if ok else INF])]
            _, ref_apply = ref.update(g)
            _, our_apply = ours.update(g)
            assert bool(ref_apply) == bool(our_apply)
            assert float(ours()) == float(ref())

    def test_fixed_matches_tf1(self):
        ref = tf.compat.v1.mixed_precision.FixedLossScale(128)
        ours = scaler({"kind": "fixed", "loss_scale_value": 128})
        assert float(ours()) == float(ref())
        assert bool(ours.update([tf.constant([INF])])[1]) is True  # TF semantics
        assert ours.get_config() == ref.get_config()

    def test_indexed_slices_and_none(self):
        """IndexedSlices: only values are checked; None is ignored."""
        s = scaler({"kind": "dynamic", "initial_loss_scale": 8.0})
        nan_slices = tf.IndexedSlices(tf.constant([NAN]), tf.constant([0]), tf.constant([3]))
        assert not bool(s.update([nan_slices, None])[1])
        assert float(s()) == 4.0
        assert bool(s.update([None])[1])


class TestDynamicExtensions:
    def test_ceiling(self):
        s = scaler({"kind": "dynamic", "initial_loss_scale": 4.0, "increment_period": 1,
                    "max_loss_scale": 10.0})
        assert trajectory(s, [True] * 3) == [8.0, 10.0, 10.0]

    def test_hysteresis(self):
        """hysteresis = 2: the first overflow is tolerated, the second backs off."""
        s = scaler({"kind": "dynamic", "initial_loss_scale": 16.0, "hysteresis": 2})
        assert trajectory(s, [False, False, False, False]) == [16.0, 8.0, 8.0, 4.0]

    def test_config_round_trip(self):
        s = scaler({"kind": "dynamic", "initial_loss_scale": 4.0, "hysteresis": 3})
        again = type(s).from_config(s.get_config())
        assert again.get_config() == s.get_config()


class TestOpenSeq2Seq:
    def test_backoff_closed_form(self):
        """min 1, max 8, window 2: overflow at k=0 -> 4; k=1 -> 4; k=2 -> 8."""
        s = scaler({"kind": "backoff", "scale_min": 1.0, "scale_max": 8.0, "step_window": 2})
        assert float(s()) == 8.0  # starts at scale_max
        assert trajectory(s, [False, True, True]) == [4.0, 4.0, 8.0]

    def test_backoff_first_growth_at_window_minus_one(self):
        s = scaler({"kind": "backoff", "scale_max": 2.0**20, "step_window": 3})
        s.scale.assign(2.0)
        assert trajectory(s, [True, True, True]) == [2.0, 2.0, 4.0]

    @pytest.mark.parametrize("amax, expected", [(2.0**-4, 16384.0), (16.0, 4096.0)])
    def test_logmax_first_call(self, amax, expected):
        """HEAD defaults, first call: amax 2^-4 -> 16384 (clipped); 16 -> 4096 (rtol 1e-3)."""
        s = scaler({"kind": "logmax"})
        _, apply = s.update([tf.constant([amax, -amax / 2])])
        assert bool(apply)
        assert float(s()) == pytest.approx(expected, rel=1e-3)

    def test_logmax_overflow_drops_to_min(self):
        s = scaler({"kind": "logmax"})
        _, apply = s.update([tf.constant([INF])])
        assert not bool(apply) and float(s()) == 1.0

    def test_logmax_zero_gradient(self):
        """Reference mode: log2(0) poisons the state; corrected mode keeps it."""
        ref = scaler({"kind": "logmax"})
        ref.update([tf.constant([0.0])])
        assert not np.isfinite(float(ref.x_hat))
        fixed = scaler({"kind": "logmax", "corrected": True})
        fixed.update([tf.constant([0.0])])
        fixed.update([tf.constant([16.0])])
        # the zero call left the statistics alone: this is a first call, 2^(16-4)
        assert float(fixed()) == pytest.approx(4096.0, rel=1e-3)
        assert np.isfinite(float(fixed.x_hat))


@pytest.mark.parametrize("table, key, message", [
    ({"kind": "dynamic", "initial_loss_scale": -1.0}, "initial_loss_scale", "must be > 0"),
    ({"kind": "dynamic", "multiplier": 1.0}, "multiplier", "must be > 1.0"),
    ({"kind": "dynamic", "initial_scale": 2.0}, "initial_scale", "did you mean"),
    ({"kind": "dynamic", "min_loss_scale": 8.0, "max_loss_scale": 2.0}, "max_loss_scale",
     "must be >= min_loss_scale"),
    ({"kind": "backoff", "step_factor": 0.5}, "step_factor", "must be > 1.0"),
    ({"kind": "logmax", "beta1": 1.5}, "beta1", "must be < 1"),
    ({"kind": "fixed", "loss_scale_value": 0.5}, "loss_scale_value", "at least 1"),
])
def test_bad_parameters_name_the_key(table, key, message):
    with pytest.raises(ConfigError) as info:
        gradpipe.build({"loss_scale": table, "transforms": [{"kind": "sgd"}]})
    assert info.value.path == f"loss_scale.{key}"
    assert message in str(info.value)


def test_soak_nonfinite_steps_never_touch_weights():
    """1000 steps, ~10% poisoned with NaN/Inf: weights equal a run without those steps."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(32, 5)).astype("f4")
    y = x @ rng.normal(size=(5, 1)).astype("f4")
    poison = rng.random(1000) < 0.1
    kinds = rng.choice([NAN, INF, -INF], size=1000)
    table = {"loss_scale": {"kind": "dynamic", "initial_loss_scale": 2.0**12,
                            "increment_period": 10_000},
             "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                            {"kind": "adam", "learning_rate": 0.01}]}

    def train(skip_poisoned):
        w = tf.Variable(np.zeros((5, 1), "f4"), name="w")
        pipe = gradpipe.build(table)

        @tf.function
        def step(bad):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(x @ w - y))
            g = tape.gradient(loss, w) * pipe.loss_scale
            g = g + bad  # bad is 0, NaN or Inf
            return pipe.apply_gradients([(g, w)])

        nonfinite_seen = 0
        for i in range(1000):
            if poison[i] and skip_poisoned:
                continue
            applied = step(tf.constant(kinds[i] if poison[i] else 0.0, tf.float32))
            assert np.all(np.isfinite(w.numpy()))
            nonfinite_seen += int(not bool(applied))
        return w.numpy(), pipe, nonfinite_seen

    poisoned_w, pipe, skipped = train(False)
    clean_w, clean_pipe, _ = train(True)
    assert skipped == int(poison.sum()) == int(pipe.skipped_steps)
    assert int(pipe.iterations) == int(clean_pipe.iterations) == 1000 - poison.sum()
    np.testing.assert_array_equal(poisoned_w, clean_w)


def test_half_precision_variables_use_float32_masters():
    """fp16 variables are updated through float32 masters and refreshed from them."""
    var = tf.Variable(np.array([1.0, 2.0], "f2"))
    pipe = gradpipe.build({"loss_scale": {"kind": "dynamic", "initial_loss_scale": 1024.0},
                           "transforms": [{"kind": "sgd", "learning_rate": 1e-4}]})
    for _ in range(10):
        pipe.apply_gradients([(tf.constant([1.0, 1.0], tf.float16) * 1024, var)])
    [master] = [v for name, v in pipe.named_variables().items()
                if name.startswith("masters/")]
    assert master.dtype == tf.float32
    assert_close(master.numpy(), [1.0 - 1e-3, 2.0 - 1e-3], rtol=0, atol=1e-6)
    # fp16 alone would lose these updates: 2 - 1e-4 rounds back to 2 in float16
    assert var.dtype == tf.float16
    assert_close(var.numpy(), master.numpy().astype("f2"), rtol=0, atol=0)


def test_keras_mixed_float16_model_in_custom_loop():
    """A Keras model under mixed_float16 trains with a dynamic-scaled pipeline."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1, dtype="float32")])
        pipe = gradpipe.build({"loss_scale": {"kind": "dynamic"},
                               "transforms": [{"kind": "adam", "learning_rate": 0.01}]})
        x = np.random.default_rng(0).normal(size=(64, 4)).astype("f4")
        y = x.sum(axis=1, keepdims=True)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
                scaled = pipe.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            pipe.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        losses = [float(step()) for _ in range(200)]
        assert losses[-1] < 0.2 * losses[0]
        assert all(np.all(np.isfinite(v.numpy())) for v in model.trainable_variables)
    finally:
        keras.mixed_precision.set_global_policy("float32")
