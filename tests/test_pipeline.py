"""The step engine against Keras 3 optimizers, and its step semantics."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import assert_close
from gradpipe import GradpipeError

STEPS = 6
RNG = np.random.default_rng(0)
INIT = [RNG.normal(size=(3, 4)).astype("f4"), RNG.normal(size=(4,)).astype("f4")]
GRADS = [[RNG.normal(size=(3, 4)).astype("f4") * 3, RNG.normal(size=(4,)).astype("f4") * 3]
         for _ in range(STEPS)]


def run_keras(optimizer, jit):
    variables = [tf.Variable(x) for x in INIT]
    optimizer.build(variables)
    step = tf.function(lambda g: optimizer.apply_gradients(zip(g, variables)),
                       jit_compile=jit)
    for grads in GRADS:
        step([tf.constant(g) for g in grads])
    return [v.numpy() for v in variables]


def run_pipeline(table, jit, grads=GRADS):
    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build(table)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)), jit_compile=jit)
    applied = [bool(step([tf.constant(x) for x in g])) for g in grads]
    return [v.numpy() for v in variables], pipe, applied


KERAS_CASES = {
    "sgd": (lambda: keras.optimizers.SGD(0.1), [{"kind": "sgd", "learning_rate": 0.1}]),
    "sgd_momentum_clipnorm": (
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, clipnorm=1.0),
        [{"kind": "clip_by_norm", "clip_norm": 1.0},
         {"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9}]),
    "sgd_nesterov_clipvalue": (
        lambda: keras.optimizers.SGD(0.05, momentum=0.8, nesterov=True, clipvalue=0.5),
        [{"kind": "clip_by_value", "clip_value_min": -0.5, "clip_value_max": 0.5},
         {"kind": "sgd", "learning_rate": 0.05, "momentum": 0.8, "nesterov": True}]),
    "adam_global_clipnorm": (
        lambda: keras.optimizers.Adam(0.1, global_clipnorm=1.0),
        [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
         {"kind": "adam", "learning_rate": 0.1}]),
    "adam_amsgrad": (
        lambda: keras.optimizers.Adam(0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-5,
                                      amsgrad=True),
        [{"kind": "adam", "learning_rate": 0.01, "beta_1": 0.8, "beta_2": 0.99,
          "epsilon": 1e-5, "amsgrad": True}]),
}


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("case", sorted(KERAS_CASES))
def test_keras_parity(case, jit):
    """Six steps match the Keras optimizer (float32 rounding: rtol 1e-6, atol 1e-6)."""
    make_keras, transforms = KERAS_CASES[case]
    expected = run_keras(make_keras(), jit)
    actual, pipe, applied = run_pipeline({"transforms": transforms}, jit)
    assert all(applied) and int(pipe.iterations) == STEPS
    assert_close(actual, expected, rtol=1e-6, atol=1e-6)


def test_eager_matches_graph():
    """Eager execution gives the same result as tf.function (atol 1e-6)."""
    table = {"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                            {"kind": "adam", "learning_rate": 0.1}]}
    graph, _, _ = run_pipeline(table, False)
    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build(table)
    for grads in GRADS:
        pipe.apply_gradients(zip([tf.constant(g) for g in grads], variables))
    assert_close([v.numpy() for v in variables], graph, rtol=0, atol=1e-6)


def test_none_gradients_are_skipped():
    """A None gradient leaves its variable and its slots untouched."""
    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 0.1,
                                           "momentum": 0.9}]})
    pipe.apply_gradients([(tf.constant(GRADS[0][0]), variables[0]), (None, variables[1])])
    np.testing.assert_array_equal(variables[1].numpy(), INIT[1])
    assert not np.array_equal(variables[0].numpy(), INIT[0])
    slots = pipe.transform_state("sgd")
    assert len(slots) == 2 and np.all(list(slots.values())[1].numpy() == 0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_step_changes_nothing(bad):
    """A NaN/Inf gradient skips the step: no variable, slot or counter moves."""
    table = {"transforms": [{"kind": "adam", "learning_rate": 0.1}]}
    grads = [GRADS[0], [GRADS[1][0], np.full(4, bad, "f4")], GRADS[2]]
    actual, pipe, applied = run_pipeline(table, False, grads)
    assert applied == [True, False, True]
    assert int(pipe.iterations) == 2 and int(pipe.skipped_steps) == 1
    expected, _, _ = run_pipeline(table, False, [GRADS[0], GRADS[2]])
    assert_close(actual, expected, rtol=0, atol=0)


def test_one_trace_and_no_hook_calls_per_step():
    """Later steps neither retrace nor call any pluggy hook."""
    from gradpipe.registry import get_registry

    calls = []
    undo = get_registry().pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: calls.append(name), lambda *a: None)
    try:
        variables = [tf.Variable(x) for x in INIT]
        pipe = gradpipe.build({
            "schedules": {"lr": {"kind": "fixed_lr", "learning_rate": 0.1}},
            "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                           {"kind": "adam", "learning_rate": "@lr"}]})
        pipe.build(variables)
        calls.clear()
        step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
        for grads in GRADS:
            step([tf.constant(g) for g in grads])
        assert step.experimental_get_tracing_count() == 1
        assert calls == []
    finally:
        undo()


def test_state_created_outside_the_trace():
    """First use inside tf.function creates state eagerly (init_scope)."""
    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build({"transforms": [{"kind": "adam"}]})
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    step([tf.constant(g) for g in GRADS[0]])
    traces = step.experimental_get_tracing_count()  # TF traces twice on creation
    step([tf.constant(g) for g in GRADS[1]])
    assert int(pipe.iterations) == 2
    assert step.experimental_get_tracing_count() == traces


def test_checkpoint_restores_everything(tmp_path):
    """tf.train.Checkpoint saves and restores counters and slots by name."""
    table = {"loss_scale": {"kind": "dynamic", "initial_loss_scale": 8.0,
                            "increment_period": 2},
             "transforms": [{"kind": "adam", "learning_rate": 0.1}]}
    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build(table)
    for grads in GRADS[:3]:
        pipe.apply_gradients(zip([tf.constant(g) for g in grads], variables))
    path = tf.train.Checkpoint(pipeline=pipe, v=variables).save(str(tmp_path / "ck"))
    names = [n for n, _ in tf.train.list_variables(path)]
    # one key per state variable, its stable name ("/" is written ".S")
    assert "pipeline/_state/slots.S0_adam.Smu.SVariable/.ATTRIBUTES/VARIABLE_VALUE" in names, names
    clone_vars = [tf.Variable(np.zeros_like(x)) for x in INIT]
    clone = gradpipe.build(table)
    clone.build(clone_vars)
    tf.train.Checkpoint(pipeline=clone, v=clone_vars).restore(path).assert_consumed()
    assert int(clone.iterations) == 3 and float(clone.loss_scale) == float(pipe.loss_scale)
    for grads in GRADS[3:]:
        pipe.apply_gradients(zip([tf.constant(g) for g in grads], variables))
        clone.apply_gradients(zip([tf.constant(g) for g in grads], clone_vars))
    assert_close([v.numpy() for v in clone_vars], [v.numpy() for v in variables],
                 rtol=0, atol=0)


def test_accumulation_equals_mean_gradient():
    """k micro-batches give one update with their mean gradient."""
    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build({"pipeline": {"accumulation_steps": 3},
                           "transforms": [{"kind": "adam", "learning_rate": 0.1}]})
    applied = [bool(pipe.apply_gradients(zip([tf.constant(g) for g in grads], variables)))
               for grads in GRADS]
    assert applied == [False, False, True, False, False, True]
    assert int(pipe.iterations) == 2
    means = [[np.mean([GRADS[i][j] for i in range(s, s + 3)], axis=0) for j in range(2)]
             for s in (0, 3)]
    expected, _, _ = run_pipeline({"transforms": [{"kind": "adam", "learning_rate": 0.1}]},
                                  False, means)
    assert_close([v.numpy() for v in variables], expected, rtol=1e-6, atol=1e-6)


def test_fixed_loss_scale_unscales():
    """With a fixed scale S, grads of S*loss update like grads of loss."""
    table = {"transforms": [{"kind": "sgd", "learning_rate": 0.1}]}
    plain, _, _ = run_pipeline(table, False)
    scaled_grads = [[g * 128.0 for g in grads] for grads in GRADS]
    scaled, pipe, _ = run_pipeline({**table, "loss_scale": {"kind": "fixed",
                                                            "loss_scale_value": 128.0}},
                                   False, scaled_grads)
    assert float(pipe.scale_loss(1.0)) == 128.0
    assert_close(scaled, plain, rtol=1e-6, atol=1e-6)


def test_without_a_loss_scaler_scale_loss_adds_no_op():
    """No scaler and no replicas to divide by: the loss itself, in a custom loop and
    through the Keras optimizer (a factor of 1 would be a multiplication each way)."""
    pipe = gradpipe.build({"transforms": [{"kind": "sgd"}]})
    loss = tf.constant(2.5)
    assert pipe.scale_loss(loss) is loss
    assert pipe.keras_optimizer().scale_loss(loss) is loss
    assert float(pipe.scale_loss(2.5)) == 2.5


def test_fixed_loss_scale_reference_error():
    with pytest.raises(gradpipe.ConfigError, match=r"loss_scale_value must be at least 1\."):
        gradpipe.build({"loss_scale": {"kind": "fixed", "loss_scale_value": 0.5},
                        "transforms": [{"kind": "sgd"}]})


def test_sparse_gradients_sgd_stays_sparse():
    """IndexedSlices flow through clipping and plain SGD as a scatter update."""
    var = tf.Variable(np.ones((4, 2), "f4"))
    pipe = gradpipe.build({"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                                          {"kind": "sgd", "learning_rate": 1.0}]})
    grad = tf.IndexedSlices(tf.constant([[3.0, 4.0]]), tf.constant([2]), tf.constant([4, 2]))
    pipe.apply_gradients([(grad, var)])
    expected = np.ones((4, 2), "f4")
    expected[2] -= [0.6, 0.8]
    assert_close(var.numpy(), expected, rtol=0, atol=1e-6)


def test_unknown_variable_is_an_error():
    pipe = gradpipe.build({"transforms": [{"kind": "sgd"}]})
    a, b = tf.Variable(1.0), tf.Variable(2.0, name="second")
    pipe.apply_gradients([(tf.constant(1.0), a)])
    with pytest.raises(GradpipeError, match=r"variable 'second' was not among the variables"
                                            r" this pipeline was built for; build a new "
                                            r"pipeline \(or keras_optimizer\(\)\)"):
        pipe.apply_gradients([(tf.constant(1.0), b)])


def test_all_none_is_an_error():
    pipe = gradpipe.build({"transforms": [{"kind": "sgd"}]})
    with pytest.raises(GradpipeError, match="no gradients"):
        pipe.apply_gradients([(None, tf.Variable(1.0))])


def test_create_and_schedule_standalone():
    """gradpipe.create builds one component from a table."""
    schedule = gradpipe.create("schedule", {"kind": "fixed_lr", "learning_rate": 0.3})
    assert float(schedule(tf.constant(7))) == pytest.approx(0.3)
    with pytest.raises(gradpipe.ConfigError, match="unknown component kind"):
        gradpipe.create("optimizer", {"kind": "sgd"})


def test_to_toml_builds_identical_pipeline():
    import tomllib

    pipe = gradpipe.build({"transforms": [{"kind": "adam", "learning_rate": 0.2}]})
    again = gradpipe.build(tomllib.loads(pipe.to_toml()))
    assert again.spec == pipe.spec


def test_nan_born_inside_the_chain_never_reaches_weights():
    """A transform that produces NaN updates from finite gradients: the step is skipped."""
    import attrs

    from gradpipe.registry import Provider, get_registry

    @attrs.frozen(kw_only=True)
    class Config:
        pass

    def poison(cfg):
        def update(grads, state, variables):
            return [None if g is None else g * np.nan for g in grads], state
        return gradpipe.Transform(gradpipe.no_state, update)

    class Plugin:
        @gradpipe.hookimpl
        def gradpipe_register_transforms(self, register):
            register("test_poison_updates", poison, Config)

    registry = get_registry()
    if ("transform", "test_poison_updates") not in registry.components:
        registry.register_plugin(Plugin(), Provider(dist="test", version="0",
                                                    entry_point="poison"))
    var = tf.Variable([1.0, 2.0])
    pipe = gradpipe.build({"transforms": [{"kind": "test_poison_updates"},
                                          {"kind": "adam"}]})
    applied = pipe.apply_gradients([(tf.constant([1.0, 1.0]), var)])
    assert not bool(applied)
    np.testing.assert_array_equal(var.numpy(), [1.0, 2.0])
    assert int(pipe.iterations) == 0 and int(pipe.skipped_steps) == 1
    assert all(np.all(s.numpy() == 0) for s in pipe.transform_state("adam").values())


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla-inner"])
def test_check_updates_off_and_inner_jit_give_the_same_numerics(jit):
    """[pipeline] check_updates/jit_compile change speed, not results (atol 1e-6)."""
    table = {"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                            {"kind": "adam", "learning_rate": 0.1}]}
    expected, _, _ = run_pipeline(table, False)
    actual, pipe, _ = run_pipeline({**table, "pipeline": {"check_updates": False,
                                                          "jit_compile": jit}}, False)
    assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    # the gradient check still skips a NaN step with the update check off
    _, pipe, applied = run_pipeline({**table, "pipeline": {"check_updates": False,
                                                           "jit_compile": jit}}, False,
                                    [GRADS[0], [GRADS[1][0], np.full(4, np.nan, "f4")]])
    assert applied == [True, False] and int(pipe.skipped_steps.numpy()) == 1
