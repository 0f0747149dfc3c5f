"""A compiled step variable by variable: one XLA function per distinct shape and maths.

Where every transform computes each variable's update from that variable's
gradient, state and value alone, the step calls a small XLA function per
variable, traced once for all variables of one shape (``pipe.plan`` says how
many). These tests hold it to the whole step's guarantees: the same numbers as
the plain path and as Keras, a skipped step that writes nothing, a shared
state (a step count) written once, and a transform whose maths reads the
variables' names never sharing a function between two of them.
"""

from __future__ import annotations

import attrs
import keras
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import register_transform
from gradpipe.plugin import Capabilities, Transform, no_state, variable_path, zeros_like_vars

SHAPES = [(64, 32), (64, 32), (32,), (64, 32), (32,)]


def _variables(seed: int = 0) -> list[tf.Variable]:
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.normal(size=s).astype("f4"), name=f"layer{i}/w")
            for i, s in enumerate(SHAPES)]


def _gradients(step: int) -> list[tf.Tensor]:
    rng = np.random.default_rng(100 + step)
    return [tf.constant(rng.normal(size=s).astype("f4")) for s in SHAPES]


def _train(transforms: list[dict], jit: object, steps: int = 4) -> tuple[object, list]:
    variables = _variables()
    pipe = gradpipe.build({"transforms": transforms, "pipeline": {"jit_compile": jit}})
    pipe.build(variables)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    for i in range(steps):
        assert bool(step(_gradients(i)))
    return pipe, [v.numpy() for v in variables]


def _per_variable_plugin(name: str, factory) -> tuple[list, object, object]:
    """The variables, the pipeline and the step of a third-party rule ``factory``,
    compiled variable by variable."""
    register_transform(name, factory, capabilities=Capabilities(update_rule=True))
    variables = _variables()
    pipe = gradpipe.build({"transforms": [{"kind": name}], "pipeline": {"jit_compile": True}})
    pipe.build(variables)
    assert str(pipe.plan.per_variable).startswith("yes"), pipe.plan
    return variables, pipe, tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["adamax", "nadam", "rmsprop", "adam"])
def test_one_function_per_shape_gives_the_plain_paths_and_keras_numbers(kind):
    pipe, compiled = _train([{"kind": kind, "learning_rate": 0.01}], True)
    assert str(pipe.plan.per_variable) == (
        "yes: 2 XLA functions for 5 variables, one per distinct shape and maths, each "
        "traced once"), pipe.plan
    _, plain = _train([{"kind": kind, "learning_rate": 0.01}], False)
    variables = _variables()
    optimizer = getattr(keras.optimizers, {"rmsprop": "RMSprop"}.get(kind, kind.title()))(
        learning_rate=0.01)
    for i in range(4):
        optimizer.apply_gradients(zip(_gradients(i), variables))
    for ours, theirs, native in zip(compiled, plain, variables):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(ours, native.numpy(), rtol=1e-6, atol=1e-6)


LARGE = [(512, 512), (512, 512), (512,)]  # large enough for "auto" to compile
# the second clip reads the norm of the first transform's outputs: it mixes variables
MIXED_AFTER_A_CLIP = [{"kind": "clip_by_value", "clip_value_min": -5.0, "clip_value_max": 5.0},
                      {"kind": "clip_by_global_norm", "clip_norm": 1.0}, {"kind": "adam"}]


def _large_gradients(steps: int, seed: int) -> list[list[tf.Tensor]]:
    rng = np.random.default_rng(seed)
    return [[tf.constant(rng.normal(size=s).astype("f4")) for s in LARGE]
            for _ in range(steps)]


def _auto_and_plain(transforms: list[dict], grads: list[list[tf.Tensor]]
                    ) -> tuple[object, list[bool], list, list]:
    """The "auto" plan, which steps applied (the same on both paths), and the
    weights "auto" and the plain path leave."""
    runs = []
    for jit in ("auto", False):
        variables = [tf.Variable(np.linspace(-1, 1, np.prod(s), dtype="f4").reshape(s))
                     for s in LARGE]
        pipe = gradpipe.build({"transforms": transforms, "pipeline": {"jit_compile": jit}})
        pipe.build(variables)
        step = tf.function(lambda g, p=pipe, v=variables: p.apply_gradients(zip(g, v)))
        runs.append((pipe.plan, [bool(step(g)) for g in grads],
                     [v.numpy() for v in variables]))
    (plan, applied, compiled), (_, plain_applied, plain) = runs
    assert applied == plain_applied
    return plan, applied, compiled, plain


def test_a_global_clip_first_is_compiled_variable_by_variable_given_the_norm():
    """A global clip mixes variables, but only through the norm of the step's own
    gradients, which the step has: under "auto" each variable's function is handed
    it (jit_compile = true compiles the chain whole, below). The numbers are the
    plain path's, a step with a NaN skipped and one whose sum of squares overflows
    included."""
    grads = _large_gradients(5, seed=0)
    grads[1] = [g * 1e30 for g in grads[1]]  # finite, but their sum of squares is not
    grads[3][2] = tf.tensor_scatter_nd_update(grads[3][2], [[0]], [np.nan])
    plan, applied, compiled, plain = _auto_and_plain(
        [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
         {"kind": "adamw", "learning_rate": 0.01, "weight_decay": 0.004}], grads)
    assert applied == [True, True, True, False, True]
    assert str(plan.per_variable) == (
        "yes: 2 XLA functions for 3 variables, one per distinct shape and maths, each "
        "traced once, clip_by_global_norm given the gradients' global norm"), plan
    for ours, theirs in zip(compiled, plain):
        assert np.isfinite(ours).all()
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("global_too", [False, True])
def test_a_rule_that_sums_one_variables_squares_is_never_handed_the_global_norm(global_too):
    """A plugin rule first in the chain that normalises each variable's gradient by
    its own norm, ``squared_norm([g])``: in one variable's function that is the
    same list as the whole input, so it must not be handed the step's norm. Read
    beside the global norm (``global_too``), the chain mixes variables."""
    from gradpipe.plugin import squared_norm

    def factory(cfg):
        def update(grads, state, variables):
            total = squared_norm(grads) if global_too else 1.0
            return [None if g is None else 0.01 * g * tf.math.rsqrt(
                squared_norm([g]) + 1e-12) * tf.sqrt(total) for g in grads], state

        return Transform(no_state, update)

    name = f"per_layer_normalised_{int(global_too)}"
    register_transform(name, factory, capabilities=Capabilities(update_rule=True))
    plan, _, compiled, plain = _auto_and_plain([{"kind": name}], _large_gradients(3, 1))
    assert plan.per_variable.on is not global_too, plan
    assert "given the gradients' global norm" not in str(plan.per_variable)
    for ours, theirs in zip(compiled, plain):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


def test_auto_leaves_a_step_that_mixes_variables_uncompiled_on_a_cpu():
    """A global clip after another transform reads a norm the step does not have:
    the step would be one XLA function over every variable, whose compile grows
    with them. "auto" leaves it uncompiled and says so."""
    variables = [tf.Variable(tf.zeros([300_000])) for _ in range(3)]
    pipe = gradpipe.build({"transforms": MIXED_AFTER_A_CLIP})
    pipe.build(variables)
    assert str(pipe.plan.compile).startswith(
        'no: "auto": not variable by variable (transform clip_by_global_norm mixes '
        "variables"), pipe.plan
    assert "one XLA function for all 3 variables" in str(pipe.plan.compile), pipe.plan


def test_a_skipped_step_writes_nothing():
    variables = _variables()
    pipe = gradpipe.build({"transforms": [{"kind": "adamax"}],
                           "pipeline": {"jit_compile": True}})
    pipe.build(variables)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    assert bool(step(_gradients(0)))
    state = {name: v.numpy() for name, v in pipe.named_variables().items()}
    weights = [v.numpy() for v in variables]
    grads = _gradients(1)
    grads[3] = tf.tensor_scatter_nd_update(grads[3], [[5, 5]], [np.nan])
    assert not bool(step(grads))
    for v, before in zip(variables, weights):
        np.testing.assert_array_equal(v.numpy(), before)
    for name, v in pipe.named_variables().items():
        if name != "skipped_steps":
            np.testing.assert_array_equal(v.numpy(), state[name], err_msg=name)
    assert int(pipe.skipped_steps) == 1 and int(pipe.iterations) == 1


@pytest.mark.parametrize("poison, applied", [(None, True), (np.nan, False),
                                             (np.inf, False)], ids=["finite", "nan", "inf"])
def test_gradients_whose_sum_of_squares_overflows_are_checked_one_by_one(poison, applied):
    """Without a loss scale, the per-variable step knows its gradients finite from
    their sum of squares; elements of 1e30 overflow it. Its rare branch then checks
    them one by one: finite ones are applied, a NaN or an Inf skips the step and
    writes nothing, even under a rule whose update an Inf leaves finite (tanh)."""
    def factory(cfg):
        return Transform(no_state, lambda grads, state, variables: (
            [None if g is None else 0.01 * tf.tanh(g) for g in grads], state))

    variables, pipe, step = _per_variable_plugin("per_variable_tanh", factory)
    weights = [v.numpy() for v in variables]
    grads = [g * 1e30 for g in _gradients(0)]
    if poison is not None:
        grads[3] = tf.tensor_scatter_nd_update(grads[3], [[5, 5]], [poison])
    assert bool(step(grads)) is applied
    changed = [not np.array_equal(v.numpy(), w) for v, w in zip(variables, weights)]
    assert changed == [applied] * len(variables)
    assert (int(pipe.iterations), int(pipe.skipped_steps)) == (int(applied), int(not applied))


def test_a_guard_that_reads_its_variable_bounds_it_by_that_variables_state():
    """A maths that reduces each variable's gradient to a scalar (a norm) gets a guard
    per variable, compiled, that reads the variable's state itself: a state whose
    next update overflows (``2 * (2e38 + g)``) skips the step and writes nothing,
    though the other variable of its shape holds a small one; a small one applies."""
    def factory(cfg):
        def update(grads, state, variables):
            new = [a + g for a, g in zip(state, grads)]
            return [2.0 * n * (tf.norm(g) / (tf.norm(g) + 1.0))
                    for n, g in zip(new, grads)], new
        return Transform(zeros_like_vars, update)

    variables, pipe, step = _per_variable_plugin("per_variable_norm", factory)
    assert "bounded" in pipe.plan.checks[0]
    grads = [tf.ones_like(v) for v in variables]
    state = [v for name, v in pipe.named_variables().items() if name.startswith("slots/")]
    for large, applied in ((2e38, False), (1e37, True)):
        for k, v in enumerate(state):
            v.assign(tf.fill(v.shape, large if k == 1 else 1e37))
        weights = [v.numpy() for v in variables]
        assert bool(step(grads)) is applied
        changed = [not np.array_equal(v.numpy(), w) for v, w in zip(variables, weights)]
        assert changed == [applied] * len(variables)
        assert all(np.isfinite(v.numpy()).all() for v in variables + state)


def test_a_state_shared_by_all_variables_is_written_once():
    """nadam keeps one step count and one product of its momentum schedule for every
    variable: after three steps they are those of three steps, not fifteen."""
    pipe, _ = _train([{"kind": "nadam"}], True, steps=3)
    state = pipe.transform_state("nadam")
    assert int(state["count"]) == 3
    single = gradpipe.build({"transforms": [{"kind": "nadam"}]})
    var = tf.Variable(tf.zeros([3]))
    for _ in range(3):
        single.apply_gradients([(tf.ones([3]), var)])
    assert float(state["u_product"]) == float(single.transform_state("nadam")["u_product"])


def test_a_transform_that_mixes_variables_keeps_the_whole_step():
    """jit_compile = true compiles a global clip with the rule as one function."""
    pipe, compiled = _train([{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                             {"kind": "adam"}], True)
    assert str(pipe.plan.per_variable) == (
        "no: transform clip_by_global_norm mixes variables: one variable's output reads "
        "another's gradient, state or value (a global norm, say)")
    _, plain = _train([{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                       {"kind": "adam"}], False)
    for ours, theirs in zip(compiled, plain):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_maths_that_reads_a_variables_name_gets_a_function_of_its_own():
    """A rule that steps ``layer0`` twice as far: were variables of one shape to share
    the function traced for ``layer0``, every one of them would."""
    def factory(cfg):
        def update(grads, state, variables):
            return [None if g is None else g * (2.0 if "layer0" in variable_path(v) else 1.0)
                    for g, v in zip(grads, variables)], state

        return Transform(no_state, update)

    register_transform("per_variable_named", factory,
                       attrs.frozen(kw_only=True)(type("C", (), {})),
                       capabilities=Capabilities(update_rule=True))
    pipe, compiled = _train([{"kind": "per_variable_named"}], True, steps=1)
    assert str(pipe.plan.per_variable).startswith("yes: 5 XLA functions for 5 variables")
    before = _variables()
    for i, (after, start, g) in enumerate(zip(compiled, before, _gradients(0))):
        factor = 2.0 if i == 0 else 1.0
        np.testing.assert_allclose(after, start.numpy() - factor * g.numpy(), rtol=1e-6)


def test_check_plan_says_how_many_functions(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text('[[transforms]]\nkind = "adamax"\n')
    from gradpipe.cli import main

    assert main(["check", str(path), "--shapes", "400x100*50,20*10"]) == 0
    out = capsys.readouterr().out
    assert "per variable  yes: 2 XLA functions for 60 variables" in out, out


@pytest.mark.gpu
@pytest.mark.skipif(not tf.config.list_logical_devices("GPU"), reason="needs a GPU")
def test_on_a_gpu_the_functions_give_the_cpus_numbers():
    """Each variable's XLA function compiled for the GPU gives the plain path's numbers
    on the CPU, and a skipped step there writes nothing either."""
    with tf.device("/GPU:0"):
        pipe, on_gpu = _train([{"kind": "nadam", "learning_rate": 0.01}], True)
    assert pipe.plan.per_variable.on, pipe.plan
    with tf.device("/CPU:0"):
        _, on_cpu = _train([{"kind": "nadam", "learning_rate": 0.01}], False)
    for ours, theirs in zip(on_gpu, on_cpu):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_plan_never_says_yes_to_xla_and_to_the_uncompiled_kernel(capsys):
    """A compiled step never runs the in-place kernel: the plan says so, rather than
    "yes" twice; where XLA is off, the kernel is back."""
    from gradpipe.cli import main

    example = "examples/mixed_precision.toml"
    assert main(["check", example, "--shapes", "4096x1024,1024,1024x10,10"]) == 0
    plan = capsys.readouterr().out
    assert "XLA           yes" in plan and ("in place      no: the step is compiled; the "
                                            "last rule's fused kernel serves only an "
                                            "uncompiled step") in plan
    assert "on average (at least 16,384 where XLA pays over an in-place kernel)" in plan
    pipe = gradpipe.build({"transforms": [{"kind": "adam"}],
                           "pipeline": {"jit_compile": False}})
    pipe.build([tf.Variable(tf.zeros([400, 100]))])
    assert str(pipe.plan.in_place).startswith("yes: the last rule's fused kernel"), pipe.plan


def test_auto_keeps_sgd_alone_on_its_one_op_kernel():
    """sgd's in-place kernel reads and writes each variable in one op, one pass
    already: "auto" runs it rather than compile sgd alone, but compiles sgd after
    clipping (which XLA fuses into the update) and adam (six kernels a variable)."""
    variables = [tf.Variable(tf.zeros([300_000])) for _ in range(3)]
    grads = [tf.ones([300_000]) for _ in variables]

    def built(*transforms):
        pipe = gradpipe.build({"transforms": list(transforms)})
        pipe.build(variables)
        return pipe

    sgd = {"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9}
    alone = built(sgd)
    assert str(alone.plan).splitlines()[0] == (
        'XLA           no: "auto": sgd alone updates each variable in one fused kernel, '
        "which XLA does not beat"), alone.plan
    assert alone.path(zip(grads, variables)) == "in place"
    clipped = built({"kind": "clip_by_global_norm", "clip_norm": 1.0}, sgd).plan
    assert clipped.compile.on and clipped.per_variable.on, clipped
    assert built({"kind": "adam"}).plan.compile.on
