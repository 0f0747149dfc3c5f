"""Reliability: limits, plugin faults, atomic steps, soak under mirrored, killed writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradpipe
from conftest import ROOT
from gradpipe import ConfigError, GradpipeError, PluginError
from gradpipe.in_place import can_apply_in_place


class TestLimits:
    def test_zero_learning_rate_leaves_weights(self):
        var = tf.Variable([1.0, 2.0])
        pipe = gradpipe.build({"transforms": [{"kind": "adam", "learning_rate": 0.0}]})
        assert bool(pipe.apply_gradients([(tf.constant([3.0, 4.0]), var)]))
        np.testing.assert_array_equal(var.numpy(), [1.0, 2.0])

    def test_clip_norm_at_float_max(self):
        var = tf.Variable([0.0, 0.0])
        pipe = gradpipe.build({"transforms": [
            {"kind": "clip_by_global_norm", "clip_norm": 3.4028234663852886e38},
            {"kind": "sgd", "learning_rate": 1.0}]})
        pipe.apply_gradients([(tf.constant([3.0, 4.0]), var)])
        np.testing.assert_allclose(var.numpy(), [-3.0, -4.0], rtol=1e-6)

    @pytest.mark.parametrize("k", [1, 10_000])
    def test_accumulation_extremes(self, k):
        var = tf.Variable([0.0])
        pipe = gradpipe.build({"pipeline": {"accumulation_steps": k},
                               "transforms": [{"kind": "sgd", "learning_rate": 1.0}]})
        step = tf.function(lambda: pipe.apply_gradients([(tf.constant([1.0]), var)]))
        applied = [bool(step()) for _ in range(50)]
        assert all(applied) if k == 1 else not any(applied)
        assert int(pipe.iterations.numpy()) == (50 if k == 1 else 0)
        assert var.numpy()[0] == (-50.0 if k == 1 else 0.0)

    def test_accumulation_beyond_the_limit(self):
        with pytest.raises(ConfigError, match=r"pipeline.accumulation_steps: must be in"):
            gradpipe.parse({"pipeline": {"accumulation_steps": 10**7},
                            "transforms": [{"kind": "sgd"}]})


# Extreme but valid hyperparameters and gradients up to the largest finite-sum element.
EXTREME_RATES = st.sampled_from([1e-3, 1.0, 1e6, 1e10, 1e13, 1e20, 1e30])
EXTREME_ELEMENTS = st.sampled_from([0.0, 1e-30, 1.0, -3.0, 1e10, 1e19, -1e19])
SCALAR_GUARDED = st.one_of(
    st.builds(lambda lr, b1, b2, eps: {"kind": "adam", "learning_rate": lr, "beta_1": b1,
                                        "beta_2": b2, "epsilon": eps},
              EXTREME_RATES, st.sampled_from([0.0, 0.5, 0.9, 0.99, 0.999999]),
              st.sampled_from([0.0, 0.5, 0.999]), st.sampled_from([1e-30, 1e-16, 1e-7, 1.0])),
    st.builds(lambda lr, mu, nesterov: {"kind": "sgd", "learning_rate": lr, "momentum": mu,
                                        "nesterov": nesterov},
              EXTREME_RATES, st.sampled_from([0.0, 0.9, 0.999999]), st.booleans()))


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(rule=SCALAR_GUARDED, scheduled=st.booleans(),
       clip=st.sampled_from([None, 1e-3, 1.0, 1e30]),
       grads=st.lists(st.lists(EXTREME_ELEMENTS, min_size=3, max_size=3),
                      min_size=2, max_size=5))
def test_the_scalar_guard_never_applies_a_step_the_element_guard_skips(rule, scheduled, clip,
                                                                     grads):
    """Soundness of ``preserves_finite``: from the same state, a step that checking
    every update element would skip is never applied on the strength of the scalars.
    (Adam's bound, once only required finite in float64, failed this from rates
    of about 1e13.)"""
    table: dict = {}
    if scheduled:  # the same rate from a schedule: each step's own bound is checked
        rate = rule["learning_rate"]
        table["schedules"] = {"lr": {"kind": "linear", "start": rate, "end": rate,
                                     "steps": 10}}
        rule = {**rule, "learning_rate": "@lr"}
    table["transforms"] = ([] if clip is None else [
        {"kind": "clip_by_global_norm", "clip_norm": clip}]) + [rule]
    if gradpipe.build(table)._guard != "scalars":
        return  # not proved by scalars: nothing to compare
    runs = []
    for guard in ("scalars", "updates"):
        var = tf.Variable(np.zeros(3, "f4"))
        pipe = gradpipe.build(table)
        pipe._guard = guard
        runs.append([(bool(pipe.apply_gradients([(tf.constant(g, tf.float32), var)])),
                      var.numpy().copy()) for g in grads])
    for (by_scalars, weights), (by_elements, reference) in zip(*runs):
        if by_scalars != by_elements:  # from here on the states differ
            assert not by_scalars, "the scalar guard applied a step with a non-finite update"
            break
        # Compared by finiteness, not value: the two paths round differently (an
        # in-place kernel against the functional ops), which cancellation can
        # magnify, and a weight that overflows from finite updates does so on both.
        np.testing.assert_array_equal(np.isfinite(weights), np.isfinite(reference))


def _in_process_plugin(name, factory, config=None):
    import attrs

    from gradpipe.registry import Provider, get_registry

    @attrs.frozen(kw_only=True)
    class Config:
        pass

    class Plugin:
        @gradpipe.hookimpl
        def gradpipe_register_transforms(self, register):
            register(name, factory, config or Config)

    registry = get_registry()
    if ("transform", name) not in registry.components:
        registry.register_plugin(Plugin(), Provider(dist="gradpipe-faulty", version="0",
                                                    entry_point=name))


class TestPluginFaults:
    def test_factory_that_raises(self):
        def factory(cfg):
            raise RuntimeError("cannot build")

        _in_process_plugin("raising_factory", factory)
        with pytest.raises(PluginError, match=r"'raising_factory' from plugin gradpipe-faulty "
                                              r"0 \(entry point 'raising_factory'\) failed to "
                                              r"build at transforms\[0\]: RuntimeError"):
            gradpipe.build({"transforms": [{"kind": "raising_factory"}, {"kind": "sgd"}]})

    def test_component_breaking_the_interface(self):
        _in_process_plugin("not_a_transform", lambda cfg: object())
        with pytest.raises(PluginError, match="lacks init, update: it breaks the transform"):
            gradpipe.build({"transforms": [{"kind": "not_a_transform"}, {"kind": "sgd"}]})

    def test_wrong_return_structure_at_run_time(self):
        _in_process_plugin("wrong_structure", lambda cfg: gradpipe.Transform(
            gradpipe.no_state, lambda g, s, v: (g[:1], s)))
        var, other = tf.Variable([1.0]), tf.Variable([2.0])
        pipe = gradpipe.build({"transforms": [{"kind": "wrong_structure"}, {"kind": "sgd"}]})
        with pytest.raises(GradpipeError, match="returned 1 updates for 2 variables"):
            pipe.apply_gradients([(tf.constant([1.0]), var), (tf.constant([1.0]), other)])
        assert var.numpy()[0] == 1.0 and other.numpy()[0] == 2.0


@pytest.mark.parametrize("guard", ["updates", "scalars"])
def test_a_failure_inside_apply_gradients_changes_no_variable(guard):
    """A runtime error in the second variable's update: the first is untouched too,
    whether every update is checked or a few scalars stand for them."""
    import attrs

    def factory(cfg):
        def update(grads, state, variables):
            checked = [grads[0], tf.debugging.assert_all_finite(grads[1] * 0 + tf.math.log(
                grads[1]), "log of a negative gradient")]
            return checked, state
        return gradpipe.Transform(gradpipe.no_state, update)

    @attrs.frozen(kw_only=True)
    class PreservesFinite:
        preserves_finite = True  # a claim this transform cannot keep: it raises

    name = f"fails_at_run_time_{guard}"
    _in_process_plugin(name, factory, PreservesFinite if guard == "scalars" else None)
    a, b = tf.Variable([1.0]), tf.Variable([2.0])
    pipe = gradpipe.build({"transforms": [{"kind": name},
                                          {"kind": "adam", "learning_rate": 0.1}],
                           "pipeline": {"jit_compile": False}})
    assert pipe._guard == guard
    pipe.build([a, b])
    for fn in (pipe.apply_gradients, tf.function(pipe.apply_gradients)):
        with pytest.raises(tf.errors.InvalidArgumentError, match="log of a negative"):
            fn([(tf.constant([1.0]), a), (tf.constant([-1.0]), b)])
        assert a.numpy()[0] == 1.0 and b.numpy()[0] == 2.0
        assert int(pipe.iterations.numpy()) == 0
        assert all(np.all(v.numpy() == 0) for v in pipe.transform_state("adam").values())


def test_an_in_place_rule_whose_requirement_reads_its_state_is_still_checked():
    """The in-place path first traces the last rule's ``update`` in a scratch function
    and keeps none of it where every scalar it requires is known already. This rule
    requires its step count below 3, a scalar only its state gives: the step must
    check it, so the fourth step is skipped and its state and weights kept."""
    from typing import NamedTuple

    import attrs

    from gradpipe.transform import require_finite

    class Count(NamedTuple):
        count: object

    def factory(cfg):
        def init(variables):
            return Count(tf.constant(0.0))

        def update(grads, state, variables):
            require_finite(state.count < 3.0)
            return [g * 0.5 for g in grads], Count(state.count + 1)

        def apply(grads, slots, variables):
            return [slots.count.assign_add(1.0),
                    *(v.assign_sub(g * 0.5) for g, v in zip(grads, variables))]

        return gradpipe.Transform(init, update, apply)

    @attrs.frozen(kw_only=True)
    class Capped:
        preserves_finite = True

    _in_process_plugin("capped_in_place", factory, Capped)
    var = tf.Variable([8.0])
    pipe = gradpipe.build({"transforms": [{"kind": "capped_in_place"}],
                           "pipeline": {"jit_compile": False}})
    pipe.build([var])
    assert pipe._guard == "scalars" and can_apply_in_place(pipe, [tf.constant([1.0])])
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]))
    applied = [bool(step(tf.constant([2.0]))) for _ in range(5)]
    assert applied == [True, True, True, False, False]
    assert var.numpy()[0] == 5.0
    assert pipe.transform_state(0)["count"].numpy() == 3.0
    assert int(pipe.iterations.numpy()) == 3


def test_soak_mirrored_5000_steps():
    """mlp_classifier, 2 logical CPUs, NaN/Inf bursts, huge and zero gradients."""
    pipe = gradpipe.build({
        "placement": {"kind": "mirrored", "devices": ["/cpu:0", "/cpu:1"]},
        "loss_scale": {"kind": "dynamic", "initial_loss_scale": 2.0**10,
                       "increment_period": 50},
        "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                       {"kind": "adam", "learning_rate": 0.01}]})
    strategy = pipe.strategy
    with strategy.scope():
        task = gradpipe.create("problem", {"kind": "mlp_classifier", "hidden": 16})
    variables = list(task.variables)
    pipe.build(variables)
    rng = np.random.default_rng(11)
    steps = 5000
    kind = rng.choice(["ok", "nan", "inf", "huge", "zero"], size=steps,
                      p=[0.85, 0.05, 0.04, 0.03, 0.03])
    replica = rng.integers(0, 2, size=steps)  # which replica gets the fault

    def replica_step(step, fault, where):
        ctx = tf.distribute.get_replica_context()
        with tf.GradientTape() as tape:
            loss = pipe.scale_loss(task.loss(step))
        grads = tape.gradient(loss, variables)
        mine = tf.equal(ctx.replica_id_in_sync_group, where)
        poison = tf.where(mine, fault, tf.ones_like(fault))  # multiplier
        grads = [g * poison for g in grads]
        return pipe.apply_gradients(zip(grads, variables))

    run = tf.function(lambda s, f, w: strategy.run(replica_step, (s, f, w)))
    multiplier = {"ok": 1.0, "nan": np.nan, "inf": np.inf, "huge": 1e30, "zero": 0.0}
    skipped = []
    for i in range(steps):
        applied = run(tf.constant(i, tf.int64), tf.constant(multiplier[kind[i]]),
                      tf.constant(int(replica[i])))
        flags = [bool(a) for a in strategy.experimental_local_results(applied)]
        assert flags[0] == flags[1]  # every replica decides the same
        if not flags[0]:
            skipped.append(kind[i])
    # Every NaN/Inf step is skipped, no clean or zero step is; a 1e30 gradient is
    # skipped only if scaling overflows it to Inf, and is clipped otherwise.
    assert skipped.count("nan") == int((kind == "nan").sum())
    assert skipped.count("inf") == int((kind == "inf").sum())
    assert "ok" not in skipped and "zero" not in skipped
    assert int(pipe.skipped_steps.numpy()) == len(skipped)  # exact accounting
    for var in variables:
        copies = [c.numpy() for c in strategy.experimental_local_results(var)]
        assert all(np.all(np.isfinite(c)) for c in copies)
        np.testing.assert_array_equal(copies[0], copies[1])
    assert task.accuracy() > 0.8


def test_sigkill_during_checkpoint_write_never_leaves_a_wrong_checkpoint(tmp_path):
    """Kill a writer mid-save at several moments; the latest checkpoint loads, unmixed."""
    script = str(ROOT / "tests" / "workers" / "checkpoint_writer.py")
    for attempt, delay in enumerate((0.0, 0.15, 0.35)):
        directory = tmp_path / f"run{attempt}"
        proc = subprocess.Popen([sys.executable, script, str(directory)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "1"  # one complete save first
            time.sleep(delay)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
        latest = tf.train.latest_checkpoint(str(directory))
        assert latest is not None
        pipe = gradpipe.build({"transforms": [{"kind": "adam"}]})
        big = [tf.Variable(tf.zeros([2_000_000]), name=f"w{i}") for i in range(4)]
        pipe.build(big)
        pipe.restore(latest)
        tf.train.Checkpoint(weights=big).restore(latest).expect_partial()
        step = int(pipe.iterations.numpy())
        assert step >= 1 and latest.endswith(f"-{step}")
        for var in big:
            values = np.unique(var.numpy())
            assert values.tolist() == [float(step)]  # one save, never a mix
