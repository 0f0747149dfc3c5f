"""A plugin's maths is bounded, not checked, where the engine can bound it.

The engine walks the operations of a transform it knows no proof for and bounds
its outputs from its inputs' norm and its state's norm or range (the plan says
"bounded"). These
tests hold the bounds against a float32 reference in numpy: a step is applied
exactly when every update and new state is finite, on the compiled and on the
plain path, and where a bound fails (a state too large for it) the chain is
checked instead, so a bound never skips a step a check would apply.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gradpipe
from conftest import bounded_step, checked_copy, register_transform
from gradpipe.plugin import Capabilities, Transform, hyper, hyperparameter, zeros_like_vars

# Each: (the update and new state in TF, the same in float32 numpy); state ``m`` per
# variable. Together they use every kind of rule the bounds have: sums, products,
# divisions, roots, powers, logs, exponentials, scalars computed from the tensors.
MATHS = {
    "ema": (lambda g, m: (0.9 * m + g, 0.9 * m + g),
            lambda g, m: (np.float32(0.9) * m + g,) * 2),
    "rms": (lambda g, m: (g / (tf.sqrt(0.999 * m + 0.001 * g * g) + 1e-7),
                          0.999 * m + 0.001 * tf.square(g)),
            lambda g, m: (g / (np.sqrt(np.float32(0.999) * m + np.float32(0.001) * g * g)
                               + np.float32(1e-7)),
                          np.float32(0.999) * m + np.float32(0.001) * (g * g))),
    "normalized": (lambda g, m: (g / (tf.norm(g) + 1e-12) + tf.tanh(m), m),
                   lambda g, m: (g / (_norm(g) + np.float32(1e-12)) + np.tanh(m), m)),
    # a trust ratio: the interval of a norm holds 0, so the bound takes its value
    "trust": (lambda g, m: (g * tf.norm(m) / tf.norm(g), m + g),
              lambda g, m: (g * _norm(m) / _norm(g), m + g)),
    "log": (lambda g, m: (tf.math.log(tf.abs(g) + 1.0), tf.maximum(m, g)),
            lambda g, m: (np.log(np.abs(g) + np.float32(1)), np.maximum(m, g))),
    "difference": (lambda g, m: ((m - g) * 1e20, m - g),
                   lambda g, m: ((m - g) * np.float32(1e20), m - g)),
    "exp": (lambda g, m: (tf.exp(tf.clip_by_value(g, -50.0, m)), m - g),
            lambda g, m: (np.exp(np.minimum(np.maximum(g, np.float32(-50)), m)), m - g)),
    # an interval whose least end alone can overflow: [-(|m| + |g|) * 1e20, 0]
    "negative": (lambda g, m: ((-tf.abs(m) - tf.abs(g)) * 1e20, m),
                 lambda g, m: ((-np.abs(m) - np.abs(g)) * np.float32(1e20), m)),
    "power": (lambda g, m: (g / tf.pow(tf.square(m) + 1.0, 0.5), m + g ** 2),
              lambda g, m: (g / np.power(m * m + np.float32(1), np.float32(0.5)), m + g * g)),
}


def _norm(x):
    return np.sqrt(np.sum(x * x, dtype=np.float32))


# what the plan says each bound reads, where not the input's norm and the state's norm
READS = {
    # rms takes the square root of its state, whose sign its norm does not tell: it is
    # bounded from the state's range (its least and largest element) instead
    "rms": "its input's norm and its state's range (",
    "normalized": "its input's norm and its state's norm, which also bound the norms "
                  "and sums it computes (",
    "trust": "its input's norm, its state's norm and the norms and sums it computes, "
             "computed again (",
}


def _transform(name):
    maths = MATHS[name][0]

    def factory(cfg):
        def update(grads, state, variables):
            pairs = [(None, m) if g is None else maths(g, m) for g, m in zip(grads, state)]
            return [u for u, _ in pairs], [m for _, m in pairs]

        return Transform(zeros_like_vars, update)

    kind = f"bounds_{name}"
    register_transform(kind, factory, attrs.frozen(kw_only=True)(type("C", (), {})),
                       capabilities=Capabilities(update_rule=True))
    return kind


@functools.cache
def _bounded_step(name: str, jit: bool):
    """A pipeline of MATHS[name] on a variable of 3, and its traced step: built once
    for all examples (each sets the state and weights it starts from)."""
    return bounded_step(_transform(name), jit)


ELEMENTS = st.sampled_from([0.0, 1e-30, 1.0, -3.0, 60.0, 1e10, 1e19, -1e19, -2e19, 1e38,
                           -3e38])


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(MATHS)), jit=st.booleans(),
       state=st.lists(ELEMENTS, min_size=3, max_size=3),
       grads=st.lists(st.lists(ELEMENTS, min_size=3, max_size=3), min_size=1, max_size=3))
# equal norms of state and gradient: a difference rule that subtracted the wrong ends
# would bound (m - g) by 0, and a product of it by 0 too
@pytest.mark.slow
@example(name="difference", jit=True, state=[1e19, 0.0, 0.0], grads=[[-1e19, 0.0, 0.0]])
@example(name="difference", jit=False, state=[1e19, 0.0, 0.0], grads=[[-1e19, 0.0, 0.0]])
@example(name="negative", jit=True, state=[1e19, 0.0, 0.0], grads=[[1.0, 0.0, 0.0]])
@example(name="negative", jit=False, state=[1e19, 0.0, 0.0], grads=[[1.0, 0.0, 0.0]])
def test_a_step_is_applied_exactly_when_its_outputs_are_finite(name, jit, state, grads):
    pipe, (var, *padding), step = _bounded_step(name, jit)
    reads = READS.get(name, "its input's norm and its state's norm (")
    assert f"bounded: its traced maths, from {reads}" in pipe.plan.checks[0], pipe.plan
    slots = list(pipe.transform_state(0).values())
    for v in [var, *padding, *slots[1:]]:  # zeros, as in a new pipeline
        v.assign(tf.zeros_like(v))
    slot = slots[0]
    slot.assign(np.array(state, "f4"))
    reference = MATHS[name][1]
    m = np.array(state, "f4")
    with np.errstate(all="ignore"):
        for g in grads:
            g = np.array(g, "f4")
            update, new = reference(g, m)
            finite = bool(np.isfinite(update).all() and np.isfinite(new).all())
            before = slot.numpy(), var.numpy()
            assert bool(step(tf.constant(g))) == finite, (g, m, update, new)
            if finite:
                m = new
                np.testing.assert_allclose(slot.numpy(), new, rtol=1e-5)
            else:  # skipped whole: nothing written
                np.testing.assert_array_equal(slot.numpy(), before[0])
                np.testing.assert_array_equal(var.numpy(), before[1])


@pytest.mark.parametrize("jit, after", [(True, []), (False, []), (False, ["sgd"]),
                                        (False, ["clip_by_value"])])
def test_a_state_too_large_for_its_bound_is_checked_instead(jit, after):
    """One element of 1.9e19: the state's sum of squares overflows, so its norm bounds
    nothing; the chain is then checked, finds every output finite and applies. On the
    plain path the check reads the outputs the step computed for its writes, unless a
    transform after the bounded one is proved from its bound (``sgd``): the chain is
    then traced again without bounds."""
    kind = _transform("ema")
    n = 1000 if jit else 1 << 20  # bounded on the plain path from 2**20 elements
    var = tf.Variable(np.zeros(n, "f4"))
    limits = {"clip_by_value": {"clip_value_min": -1.0, "clip_value_max": 1.0}}
    pipe = gradpipe.build({"transforms": [{"kind": kind}, *({"kind": k, **limits.get(k, {})}
                                                            for k in after)],
                           "loss_scale": {"kind": "dynamic"},
                           "pipeline": {"jit_compile": jit}})
    pipe.build([var])
    assert "bounded" in pipe.plan.checks[0], pipe.plan
    (slot,) = pipe.transform_state(0).values()
    slot.assign(np.r_[np.float32(1.9e19), np.zeros(n - 1, "f4")])
    step = tf.function(lambda g: pipe.apply_gradients([(g * pipe.loss_scale, var)]))
    assert bool(step(tf.ones(n)))
    assert int(pipe.skipped_steps) == 0
    np.testing.assert_allclose(slot.numpy()[:2], [0.9 * 1.9e19 + 1, 1.0], rtol=1e-6)
    slot.assign(np.full(n, 3e38, "f4"))  # 0.9 * 3e38 + 3e38 overflows: skipped
    assert not bool(step(tf.fill([n], 3e38)))
    assert slot.numpy()[0] == np.float32(3e38)


def _decay_transform(kind: str, maths):
    """Transform ``kind``: the update ``maths(g, v)`` of each gradient and its variable."""
    def factory(cfg):
        def update(grads, state, variables):
            return [None if g is None else maths(g, v) for g, v in zip(grads, variables)], state

        return Transform(lambda variables: (), update)

    register_transform(kind, factory, capabilities=Capabilities(update_rule=True))
    return kind


@pytest.mark.parametrize("jit", [True, False])
def test_a_weight_the_maths_reads_is_bounded_by_its_norm(jit):
    """Decoupled weight decay reads the model's variables: their norm bounds them, so
    the transform is bounded, not checked; an update that would overflow from one
    large weight is skipped whole, on every variable, and a weight too large for its
    bound whose update is finite is checked and applied."""
    kind = _decay_transform("bounds_weight_decay", lambda g, v: g + 0.5 * v)
    n = 1000 if jit else 1 << 20  # bounded on the plain path from 2**20 elements
    variables = [tf.Variable(np.linspace(-2, 2, n, dtype="f4") * k) for k in (1, 2, 3)]
    pipe = gradpipe.build({"transforms": [{"kind": kind}], "pipeline": {"jit_compile": jit}})
    pipe.build(variables)
    assert "bounded: its traced maths" in pipe.plan.checks[0], pipe.plan
    step = tf.function(lambda g: pipe.apply_gradients([(g, v) for v in variables]))
    before = [v.numpy() for v in variables]
    assert bool(step(tf.ones(n)))
    for v, old in zip(variables, before):
        np.testing.assert_allclose(v.numpy(), old - (1 + np.float32(0.5) * old), rtol=1e-6)
    big = np.r_[np.float32(3e38), np.zeros(n - 1, "f4")]
    variables[1].assign(big)
    before = [v.numpy() for v in variables]
    assert not bool(step(tf.constant(big)))  # 3e38 + 1.5e38 overflows: nothing written
    for v, old in zip(variables, before):
        np.testing.assert_array_equal(v.numpy(), old)
    assert bool(step(tf.zeros(n)))  # 3e38 - 1.5e38: beyond the bound, checked, applied
    np.testing.assert_allclose(variables[1].numpy()[:2], [1.5e38, 0.0], rtol=1e-6)
    np.testing.assert_allclose(variables[0].numpy(), before[0] * np.float32(0.5), rtol=1e-6)


def test_the_plan_names_what_leaves_a_transform_checked():
    """A transform that uses an operation without a bound (a running sum) is
    checked, and the plan says why; so is any transform of a small step that is
    not compiled."""
    kind = _decay_transform("bounds_cumsum", lambda g, v: g + 0.01 * tf.math.cumsum(v))
    var = tf.Variable(np.zeros([4, 4], "f4"))
    plain = gradpipe.build({"transforms": [{"kind": kind}]})
    plain.build([tf.Variable(np.zeros([4, 4], "f4"))])
    assert "checked: one sum over its updates and new state (the step is not compiled " \
           "and its 16 elements are fewer than the 1,048,576 where a bound pays)" in \
           str(plain.plan)
    pipe = gradpipe.build({"transforms": [{"kind": kind}], "pipeline": {"jit_compile": True}})
    pipe.build([var])
    assert "checked: one sum over its updates and new state (its maths uses " \
           "`Cumsum`, which has no bound here)" in str(pipe.plan)
    grads = tf.constant(np.full([4, 4], 2.0, "f4"))
    assert bool(tf.function(lambda: pipe.apply_gradients([(grads, var)]))())
    np.testing.assert_array_equal(var.numpy(), np.full([4, 4], -2.0))


@pytest.mark.parametrize("table, found", [
    ({"kind": "adamax"}, "bounded: its traced maths, from its input's norm and its "
                         "state's norm"),
    # the rate a scalar the maths reads from a schedule; the root of a running mean of
    # squares, which only its range keeps from below 0 (the first moment: its norm);
    # the weights its decoupled decay reads
    ({"kind": "adamw", "learning_rate": "@lr"}, "bounded: its traced maths, from its "
                                                "input's norm, the range of its nu, the "
                                                "norm of the rest of its state and the "
                                                "weights' norm"),
    # its factored moment may round to 0 under a gradient of 0 (see test_keras_rules_advanced)
    ({"kind": "adafactor"}, "checked: one sum over its updates and new state (its bounds "
                            "fail on ordinary values, even from its state's range)"),
])
def test_the_build_finds_how_a_rule_is_bounded(table, found):
    """The build runs each rule's traced maths once on ordinary values, and computes
    the bounds from what it reads there: how the plan guards each rule. (The rules'
    maths as a plugin's: the engine proves its own ``adafactor`` for vectors.)"""
    table = {**table, "kind": checked_copy(table["kind"])}
    pipe = gradpipe.build({"transforms": [table], "pipeline": {"jit_compile": True},
                           "schedules": {"lr": {"kind": "CosineDecay", "decay_steps": 10,
                                                "initial_learning_rate": 0.1}}})
    pipe.build([tf.Variable(np.zeros(3, "f4")), tf.Variable(np.zeros([2, 3], "f4"))])
    assert f"{table['kind']} at transforms[0]: {found}" in str(pipe.plan)


@pytest.mark.parametrize("jit", [True, False])
def test_a_checked_product_that_overflows_is_skipped(jit):
    """A checked transform whose update is a finite value times a constant that
    overflows: XLA folds ``(y * c) * 0`` into ``y * 0``, so a check by ``x * 0``
    missed the inf (it wrote inf into the weights until this test). (A running sum
    of the weight has no bound: the transform is checked.)"""
    kind = _decay_transform("bounds_overflow",
                            lambda g, v: (g + 0.0 * tf.math.cumsum(v)) * 1e30)
    var = tf.Variable(np.zeros([64], "f4"))
    pipe = gradpipe.build({"transforms": [{"kind": kind}],
                           "pipeline": {"jit_compile": jit}})
    pipe.build([var])
    assert "checked" in pipe.plan.checks[0]
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]))
    assert not bool(step(tf.concat([tf.zeros([63]), [1e10]], 0)))
    np.testing.assert_array_equal(var.numpy(), np.zeros(64))
    assert bool(step(tf.fill([64], 1e-31)))
    np.testing.assert_allclose(var.numpy(), np.full(64, -0.1), rtol=1e-6)


def test_building_many_pipelines_warns_of_no_retracing(caplog):
    """The build traces each plugin transform once to bound it; done on every build,
    it must not have TensorFlow warn of retracing (naming gradpipe's internals)."""
    kind = _transform("ema")
    with caplog.at_level("WARNING", logger="tensorflow"):
        for _ in range(7):
            pipe = gradpipe.build({"transforms": [{"kind": kind}],
                                   "pipeline": {"jit_compile": True}})
            pipe.build([tf.Variable(np.zeros(3, "f4"))])
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]


def test_a_rule_repeated_for_each_variable_is_bounded_once():
    """A plain step bounds a rule's maths once however many variables it updates: the
    scalars each variable's maths recomputes (here ``1 - beta``; the learning rate)
    are the same values, so the intervals built from them are shared. A variable
    then adds to the traced step its maths, its writes and the rare branch that
    rechecks the maths where a bound fails: 40 ops against 19 unguarded; 66 when
    each variable read the rate anew, 83 when its maths was also bounded anew (a
    67-variable transformer's first `fit` epoch then took 3 s longer)."""
    @attrs.frozen(kw_only=True)
    class Config:
        learning_rate: float = hyperparameter(default=0.1)

    def factory(cfg):
        lr = hyper(cfg.learning_rate)  # a rate training may set: read from a variable

        def update(grads, state, variables):
            beta = tf.constant(0.9)

            def ema(g, m):
                m = tf.cast(beta, g.dtype) * m + (1.0 - tf.cast(beta, g.dtype)) * g
                return lr() * m, m

            pairs = [(None, m) if g is None else ema(g, m) for g, m in zip(grads, state)]
            return [u for u, _ in pairs], [m for _, m in pairs]

        return Transform(zeros_like_vars, update)

    register_transform("bounds_once", factory, Config,
                       capabilities=Capabilities(update_rule=True))

    def ops_per_variable(check_updates):
        def ops(count):
            # 2**20 elements or more: the plain path bounds the step (checks a smaller one)
            variables = [tf.Variable(tf.zeros(1 << 20))] + [
                tf.Variable(tf.zeros([3 + j, 2])) for j in range(count)]
            pipe = gradpipe.build({"transforms": [{"kind": "bounds_once"}], "pipeline": {
                "jit_compile": False, "pack_variables": False,
                "check_updates": check_updates}})
            pipe.build(variables)
            step = tf.function(lambda: pipe.apply_gradients(
                (tf.ones_like(v), v) for v in variables))
            graph = step.get_concrete_function().graph
            assert ("bounds_once at transforms[0]: bounded" in str(pipe.plan)) == \
                check_updates
            return len(graph.get_operations()) + sum(  # the branches' ops too
                len(f.definition.node_def) for f in graph._functions.values())

        return (ops(9) - ops(1)) / 8

    guarded, unguarded = ops_per_variable(True), ops_per_variable(False)
    # the maths and its writes, the maths again in the recheck, a few captures
    assert guarded <= 2 * unguarded + 4, (guarded, unguarded)


def test_a_compiled_verdict_folds_its_comparisons_into_one_loop():
    """Under XLA the guard's scalar comparisons (each interval's ends against their
    dtype's limit, each check) are one chain of ands, which XLA fuses into one loop.
    Stacked into a vector, each scalar became a kernel of its own to generate and
    compile: a compiled step of clipping and Lamb over 7 variables had 529 kernels
    instead of 288, and Lamb's first step over 10 shapes compiled for 5.7 s, not 3.0.
    (Lamb's maths as a plugin's: the built-in is proved.)"""
    shapes = [(120, 16), (16, 4, 4), (24,)]
    variables = [tf.Variable(tf.random.normal(s, seed=i)) for i, s in enumerate(shapes)]
    grads = [tf.random.normal(s, seed=100 + i) for i, s in enumerate(shapes)]
    pipe = gradpipe.build({"pipeline": {"jit_compile": True}, "transforms": [
        {"kind": "clip_by_global_norm", "clip_norm": 1.0}, {"kind": checked_copy("lamb")}]})
    pipe.build(variables)
    assert "lamb_checked at transforms[1]: bounded" in str(pipe.plan)
    assert "concatenate(" not in pipe.compiled_hlo(zip(grads, variables))


def test_a_scalar_chained_through_a_thousand_ops_is_one_value_to_the_bound():
    """A rate computed through a long chain of scalar ops (a schedule of many pieces),
    again for each variable, is one value to the bound: its walk keeps no recursion
    that such a chain would exhaust (the transform was checked instead)."""
    from gradpipe.plugin import no_state

    def factory(cfg):
        def update(grads, state, variables):
            updates = []
            for g in grads:
                rate = tf.constant(0.5)
                for _ in range(1200):
                    rate = rate * 1.0001 + 1e-7
                updates.append(None if g is None else g * rate)
            return updates, state

        return Transform(no_state, update)

    register_transform("long_chain", factory)
    # not compiled (no XLA compile of the chain), large enough to be bounded
    pipe = gradpipe.build({"transforms": [{"kind": "long_chain"}, {"kind": "sgd"}],
                           "pipeline": {"jit_compile": False}})
    pipe.build([tf.Variable(tf.zeros([1 << 20]))])
    assert "long_chain at transforms[0]: bounded" in str(pipe.plan), pipe.plan
