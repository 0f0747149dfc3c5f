"""Convergence criteria and minimize against TensorFlow Probability."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import gradpipe
from conftest import assert_close
from gradpipe import ConfigError

TFP_CRITERIA = tfp.optimizer.convergence_criteria
LOSSES = [100, 30, 10, 9, 8.95, 8.96, 8.93, 8.92, 8.93, 8.94, 8.91]


def criterion(table):
    return gradpipe.create("convergence", table)


def drive(crit, losses, grads=None):
    """Feed a loss (and gradient) sequence; return has_converged per step >= 1."""
    grads = grads or [[tf.zeros([1])]] * len(losses)
    state = crit.bootstrap(tf.constant(losses[0], tf.float32), grads[0], [tf.zeros([1])])
    flags = []
    for step in range(1, len(losses)):
        flag, state = crit.one_step(tf.constant(step), tf.constant(losses[step], tf.float32),
                                    grads[step], [tf.zeros([1])], state)
        flags.append(np.asarray(flag).tolist())
    return flags


class TestLossNotDecreasing:
    @pytest.mark.parametrize("kwargs, first", [({"atol": 1.0}, 7), ({"rtol": 0.1}, 6)])
    def test_seed_sequence(self, kwargs, first):
        """Upstream scenario: window 2, min 4; atol=1 fires at 7, rtol=.1 at 6."""
        ours = drive(criterion({"kind": "loss_not_decreasing", "window_size": 2,
                                "min_num_steps": 4, **kwargs}), LOSSES)
        theirs = drive(TFP_CRITERIA.LossNotDecreasing(window_size=2, min_num_steps=4,
                                                      **kwargs), LOSSES)
        assert ours == theirs
        assert ours.index(True) + 1 == first

    def test_batched_parameters(self):
        """atol=[.1, 15, 40], window=[5, 6, 4] equals three scalar TFP criteria."""
        ours = drive(criterion({"kind": "loss_not_decreasing", "atol": [0.1, 15.0, 40.0],
                                "window_size": [5, 6, 4], "min_num_steps": 0}), LOSSES)
        for i, (atol, window) in enumerate([(0.1, 5), (15.0, 6), (40.0, 4)]):
            scalar = drive(TFP_CRITERIA.LossNotDecreasing(atol=atol, window_size=window,
                                                          min_num_steps=0), LOSSES)
            assert [flags[i] for flags in ours] == scalar

    @pytest.mark.parametrize("seed", range(5))
    def test_random_sequences(self, seed):
        rng = np.random.default_rng(seed)
        losses = list(np.cumsum(rng.normal(-0.5, 1.0, size=40)) + 100)
        table = {"atol": 0.2, "rtol": 0.3, "window_size": 4, "min_num_steps": 3}
        ours = drive(criterion({"kind": "loss_not_decreasing", **table}), losses)
        assert ours == drive(TFP_CRITERIA.LossNotDecreasing(**table), losses)

    def test_needs_a_tolerance(self):
        with pytest.raises(ConfigError, match="at least one of `atol` and `rtol`"):
            gradpipe.parse({"transforms": [{"kind": "sgd"}],
                            "convergence": [{"kind": "loss_not_decreasing"}]})


class TestSuccessiveGradients:
    # g0=[1], then [-1], [1], [1], ...: consecutive products are -1, -1, 1, 1 while
    # products with g0 are -1, 1, 1, 1 -- the two readings diverge from step 2.
    GRADS = [[tf.constant([v])] for v in (1.0, -1.0, 1.0, 1.0, -3.0, 1.0)]
    LOSSES = [1.0] * 6

    def test_tfp_quirk_mode_matches_tfp(self):
        """compare_with_initial = true reproduces TFP 0.25 exactly."""
        table = {"kind": "successive_gradients_are_uncorrelated", "min_num_steps": 0,
                 "compare_with_initial": True}
        ours = drive(criterion(table), self.LOSSES, self.GRADS)
        theirs = drive(TFP_CRITERIA.SuccessiveGradientsAreUncorrelated(min_num_steps=0),
                       self.LOSSES, self.GRADS)
        assert ours == theirs

    def test_default_compares_consecutive_gradients(self):
        """The fix: TFP's own one_step fed the previous step's gradients as state."""
        ours = drive(criterion({"kind": "successive_gradients_are_uncorrelated",
                                "min_num_steps": 0}), self.LOSSES, self.GRADS)
        tfp_crit = TFP_CRITERIA.SuccessiveGradientsAreUncorrelated(min_num_steps=0)
        state = tfp_crit.bootstrap(tf.constant(1.0), self.GRADS[0], [tf.zeros([1])])
        intended = []
        for step in range(1, 6):
            flag, (_, moving) = tfp_crit.one_step(step, tf.constant(1.0), self.GRADS[step],
                                                  [tf.zeros([1])], state)
            state = (self.GRADS[step], moving)  # carry the previous gradients forward
            intended.append(bool(flag))
        assert ours == intended
        quirk = drive(TFP_CRITERIA.SuccessiveGradientsAreUncorrelated(min_num_steps=0),
                      self.LOSSES, self.GRADS)
        assert ours != quirk  # the sequence really separates the two readings

    def test_seed_case(self):
        """g0=[1], g1=[-1]: m=-0.1, converged."""
        flags = drive(criterion({"kind": "successive_gradients_are_uncorrelated",
                                 "min_num_steps": 0}), [1.0, 1.0], self.GRADS[:2])
        assert flags == [True]


def quadratic():
    x = tf.Variable(0.0)
    return x, lambda: (x - 5.0) ** 2


@pytest.mark.parametrize("short", [False, True], ids=["full", "short"])
def test_minimize_matches_tfp_with_criterion(short):
    """SGD(.1) on (x-5)^2, a criterion firing at step 2: steps [0,1,2,2,2], x=2.44."""
    table = {"kind": "gradient_norm_below", "tolerance": 7.0}
    x, loss = quadratic()
    trace_fn = lambda tq: (tq.step, tq.loss, tq.has_converged)  # noqa: E731
    theirs = tfp.math.minimize(loss, 5, keras.optimizers.SGD(0.1),
                               convergence_criterion=criterion(table), trace_fn=trace_fn,
                               return_full_length_trace=not short)
    assert float(x) == pytest.approx(2.44, rel=1e-6)
    y, loss_y = quadratic()
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 0.1}],
                           "convergence": [table]})
    result = pipe.minimize(loss_y, [y], 5, trace_fn, return_full_length_trace=not short)
    assert [t.numpy().tolist() for t in result.trace] == [t.numpy().tolist() for t in theirs]
    assert list(result.trace[0].numpy()) == ([0, 1, 2] if short else [0, 1, 2, 2, 2])
    assert float(y) == pytest.approx(2.44, rel=1e-6)
    assert result.steps == 3 and result.converged and result.criterion == "gradient_norm_below"


def test_minimize_matches_tfp_without_criterion():
    x, loss = quadratic()
    theirs = tfp.math.minimize(loss, 7, keras.optimizers.SGD(0.05))
    y, loss_y = quadratic()
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 0.05}]})
    result = pipe.minimize(loss_y, [y], 7)
    assert_close(result.trace.numpy(), theirs.numpy(), rtol=1e-6, atol=0)
    assert float(y) == float(x) and result.steps == 7 and not result.converged


def test_minimize_matches_tfp_loss_not_decreasing():
    """The same optimizer and criterion in TFP and in a pipeline give the same trace."""
    tfp_crit = TFP_CRITERIA.LossNotDecreasing(atol=0.5, window_size=3, min_num_steps=5)
    _x, loss = quadratic()
    theirs = tfp.math.minimize(loss, 60, keras.optimizers.Adam(0.5),
                               convergence_criterion=tfp_crit,
                               return_full_length_trace=False)
    y, loss_y = quadratic()
    pipe = gradpipe.build({
        "transforms": [{"kind": "adam", "learning_rate": 0.5}],
        "convergence": [{"kind": "loss_not_decreasing", "atol": 0.5, "window_size": 3,
                         "min_num_steps": 5}]})
    result = pipe.minimize(loss_y, [y], 60, return_full_length_trace=False)
    assert_close(result.trace.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    assert len(theirs) < 60 and result.criterion == "loss_not_decreasing"


def test_nonfinite_stops_at_injected_nan():
    """A NaN loss at step 3 stops the loop; the short trace ends at step 3."""
    x = tf.Variable(1.0)
    calls = tf.Variable(0)

    def loss():
        calls.assign_add(1)
        return x ** 2 * tf.where(calls == 4, np.nan, 1.0)  # NaN loss and gradients

    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 0.1}],
                           "convergence": [{"kind": "nonfinite"}]})
    result = pipe.minimize(loss, [x], 10, lambda tq: tq.step, return_full_length_trace=False)
    assert list(result.trace.numpy()) == [0, 1, 2, 3]
    assert result.criterion == "nonfinite" and result.skipped_steps == 1
    assert np.isfinite(float(x))  # the NaN step never touched the variable


def test_several_criteria_report_which():
    x, loss = quadratic()
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 0.1}],
                           "convergence": [{"kind": "parameter_change_below", "tolerance": 1e-9},
                                           {"kind": "gradient_norm_below", "tolerance": 1.0}]})
    result = pipe.minimize(loss, [x], 100)
    assert result.converged and result.criterion == "gradient_norm_below"
    assert abs(float(x) - 5.0) < 0.5


def test_minimize_with_loss_scaling_and_accumulation():
    """Dynamic loss scaling is undone and accumulation halves the applied updates."""
    x, loss = quadratic()
    pipe = gradpipe.build({"loss_scale": {"kind": "dynamic", "initial_loss_scale": 1024.0},
                           "pipeline": {"accumulation_steps": 2},
                           "transforms": [{"kind": "sgd", "learning_rate": 0.1}]})
    result = pipe.minimize(loss, [x], 6, lambda tq: tq.gradients[0])
    assert int(pipe.iterations) == 3
    assert float(x) == pytest.approx(2.44, rel=1e-6)  # 3 updates of SGD(.1)
    assert float(result.trace[0]) == pytest.approx(-10.0)  # unscaled gradients


@pytest.mark.parametrize("table, message", [
    ({"kind": "loss_not_decreasing", "atol": "low"}, "transforms"),
    ({"kind": "gradient_norm_below"}, "tolerance: is required"),
    ({"kind": "nonfinte"}, "did you mean 'nonfinite'"),
])
def test_bad_convergence_table(table, message):
    with pytest.raises(ConfigError) as info:
        gradpipe.parse({"transforms": [{"kind": "sgd"}], "convergence": [table]})
    assert info.value.path.startswith("convergence[0]")
    if message != "transforms":
        assert message in str(info.value)
