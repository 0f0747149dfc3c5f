"""The properties behind the step's speed, never its timings.

* ``jit_compile = "auto"`` compiles exactly where it is safe (``pipe.plan``);
* the compiled (fused) path, the plain path, proved and checked outputs agree;
* one pass over the gradients serves the finite check, the loss scaler and
  the global norm, and outputs the engine proves finite are not checked;
* a power-of-two loss scale unscales by multiplication, bit for bit;
* under XLA the sum of squares is folded first, never reduced element by element.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import assert_close, checked_copy, register_transform

RNG = np.random.default_rng(7)
SHAPES = [(6, 5), (5,), (7,)]
INIT = [RNG.normal(size=s).astype("f4") for s in SHAPES]
CLIP_ADAM = {"loss_scale": {"kind": "dynamic", "initial_loss_scale": 1024.0,
                            "increment_period": 2},
             "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                            {"kind": "adam", "learning_rate": 0.05}]}


def _grads(scale: float, poison: str | None = None) -> list[np.ndarray]:
    grads = [RNG.normal(size=s).astype("f4") * 4 * scale for s in SHAPES]
    if poison == "nan":
        grads[1][2] = np.nan
    elif poison == "inf":
        grads[0][1, 1] = -np.inf
    elif poison == "huge":  # finite, but the sum of squares overflows float32
        grads[2][:] = 1e30
    return grads


SEQUENCE = [None, None, "nan", None, "huge", None, "inf", None, None]
GRADS = [_grads(1024.0, p) for p in SEQUENCE]


def _checked(table: dict) -> dict:
    """``table`` with every built-in transform replaced by a third-party copy of its
    maths: the same numbers, with every output checked instead of proved."""
    return {**table, "transforms": [{**t, "kind": checked_copy(t["kind"])}
                                    for t in table["transforms"]]}


def _run(table: dict, grads=GRADS, init=INIT):
    variables = [tf.Variable(x) for x in init]
    pipe = gradpipe.build(table)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    applied = [bool(step([tf.constant(x) for x in g])) for g in grads]
    state = {k: v.numpy() for k, v in pipe.named_variables().items()}
    return [v.numpy() for v in variables], state, applied, pipe


def _with(table: dict, **options) -> dict:
    return {**table, "pipeline": {**table.get("pipeline", {}), **options}}


def _decides(table: dict, shapes: list[tuple[int, ...]]) -> bool:
    """Whether ``table``'s plan compiles its step over these variables."""
    pipe = gradpipe.build(table)
    pipe.build([tf.Variable(tf.zeros(s)) for s in shapes])
    return pipe.plan.compile.on


LARGE = [(1024, 512), (512,), (2048, 256)]  # 350k elements per shape: XLA pays


MLP = [(32, 256), (256,), (256, 256), (256,), (256, 10), (10,)]  # mean 12.8k elements
SGD = {"transforms": [{"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9}]}


@pytest.mark.slow
def test_auto_compiles_few_variables_that_are_not_small():
    assert _decides(CLIP_ADAM, LARGE)
    assert not _decides(CLIP_ADAM, SHAPES)  # tiny: nothing to fuse that pays
    # sgd and adam update in place on the plain path: XLA pays on larger variables only,
    # and never for sgd alone, one op a variable (test_per_variable)
    clip_sgd = {"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                               *SGD["transforms"]]}
    assert _decides(clip_sgd, LARGE) and not _decides(clip_sgd, MLP)
    assert not _decides(SGD, LARGE)
    assert not _decides(CLIP_ADAM, MLP)
    # a mean of 19k elements pays at each step, but not the compile of its three shapes
    # before the first step on a CPU
    assert not _decides(CLIP_ADAM, [(256, 128), (128,), (512, 64)])
    assert _decides(_with(CLIP_ADAM, check_updates=False), LARGE)
    many = [(16_384,)] * 129  # more than the 128 XLA compiles one by one
    # compile time grows with every variable...
    assert not _decides(_with(CLIP_ADAM, pack_variables=False), many)
    assert _decides(CLIP_ADAM, many)  # ...unless packed: one vector, one small function
    assert not _decides(_with(CLIP_ADAM, jit_compile=False), LARGE)
    assert _decides(_with(CLIP_ADAM, jit_compile=True), SHAPES)


@pytest.mark.parametrize("options", [{}, {"check_updates": False}],
                         ids=["guarded", "unguarded"])
def test_fused_and_plain_paths_agree(options):
    """Same skips, same loss-scale trajectory, weights and slots within 1e-6."""
    table = _with(CLIP_ADAM, **options)
    fused = _run(_with(table, jit_compile=True))
    plain = _run(_with(table, jit_compile=False))
    assert fused[3].plan.compile.on and not plain[3].plan.compile.on
    assert fused[2] == plain[2] == [True, True, False, True, True, True, False, True, True]
    assert_close(fused[0], plain[0], rtol=1e-6, atol=1e-6)
    assert fused[1].keys() == plain[1].keys()
    for name in fused[1]:
        assert_close(fused[1][name], plain[1][name], rtol=1e-6, atol=1e-6)
    assert fused[1]["loss_scale/current_loss_scale"] == \
        plain[1]["loss_scale/current_loss_scale"]


@pytest.mark.slow
@pytest.mark.parametrize("jit", [False, True], ids=["plain", "fused"])
def test_proved_and_checked_outputs_agree(jit):
    """Outputs proved finite give exactly what checking every output gives (the same
    maths, registered by a third party), including steps a schedule makes non-finite."""
    table = _with(CLIP_ADAM, jit_compile=jit)
    table["transforms"] = [table["transforms"][0],
                           {"kind": "adam", "learning_rate": {
                               "kind": "piecewise_constant", "learning_rate": 0.05,
                               "boundaries": [4], "decay_rates": [1e40]}}]  # inf in float32
    by_scalars = _run(table)
    by_updates = _run(_checked(table))
    assert all("proved" in check for check in by_scalars[3].plan.checks)
    assert all("checked" in check for check in by_updates[3].plan.checks)
    assert by_scalars[2] == by_updates[2]
    assert by_scalars[2][-3:] == [False, False, False]  # lr = inf: skipped, not applied
    assert np.isfinite(np.concatenate([w.ravel() for w in by_scalars[0]])).all()
    checked_state = {k.replace("_checked", ""): v for k, v in by_updates[1].items()}
    assert by_scalars[1].keys() == checked_state.keys()
    for name in by_scalars[1]:
        np.testing.assert_array_equal(by_scalars[1][name], checked_state[name])


def test_an_out_of_range_scheduled_beta_is_skipped_by_the_scalar_guard():
    table = {"transforms": [{"kind": "adam", "learning_rate": 0.1, "beta_1": {
        "kind": "piecewise_constant", "learning_rate": 0.9, "boundaries": [1],
        "decay_rates": [1.5 / 0.9]}}]}
    weights, _, applied, pipe = _run(table, [_grads(1.0) for _ in range(4)])
    assert "proved" in pipe.plan.checks[0] and applied == [True, True, False, False]
    assert np.isfinite(np.concatenate([w.ravel() for w in weights])).all()


# beta_2 = 0: after a gradient of 1e19, a zero gradient leaves v = 0 and m = 0.0099 *
# 1e19, so Adam's second step is 50 * lr * m / epsilon: infinite in float32 at lr 1e13,
# where the first step (about lr) is finite.
HUGE_THEN_ZERO = [[np.array([1e19, 0, 0, 0], "f4")]] + [[np.zeros(4, "f4")]] * 2


def _huge_rate_adam(learning_rate: object, jit: bool) -> dict:
    return {"pipeline": {"jit_compile": jit}, "schedules": {"huge": {
        "kind": "linear", "start": 1e13, "end": 1e13, "steps": 10}},
        "transforms": [{"kind": "adam", "learning_rate": learning_rate, "beta_1": 0.99,
                        "beta_2": 0.0}]}


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "fused"])
def test_a_constant_rate_beyond_adams_proof_checks_its_outputs(jit):
    """A rate whose bound alpha * 2**64 / epsilon can pass the float32 maximum is
    beyond the proof: the outputs are checked, the finite first step applies, the
    infinite second one is skipped. (The bound used to be checked for finiteness in
    float64 only, which let this infinite update reach the weights.)"""
    (weights,), _, applied, pipe = _run(_huge_rate_adam(1e13, jit), HUGE_THEN_ZERO,
                                        init=[np.zeros(4, "f4")])
    assert "checked" in pipe.plan.checks[0]
    assert applied == [True, False, False]
    assert np.isfinite(weights).all() and weights[0] < -1e12


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "fused"])
def test_a_scheduled_adam_step_beyond_its_proven_bound_is_skipped(jit):
    (weights,), _, applied, pipe = _run(_huge_rate_adam("@huge", jit), HUGE_THEN_ZERO,
                                        init=[np.zeros(4, "f4")])
    assert "proved" in pipe.plan.checks[0]
    assert applied == [False, False, False]
    np.testing.assert_array_equal(weights, np.zeros(4, "f4"))


@pytest.mark.parametrize("options, proved", [
    ({"learning_rate": 9e10}, True),
    ({"learning_rate": 1e11}, False),  # 2 * lr / (1 - 0.9f) * 2**64 / 1e-7 > 3.4e38
    ({"learning_rate": 0.001, "epsilon": 1e-20}, True),
    ({"learning_rate": 0.01, "epsilon": 1e-20}, False),
    ({"learning_rate": "@lr", "epsilon": 1e-16}, True),  # a schedule: alpha <= 1,000
    ({"learning_rate": "@lr", "epsilon": 1e-17}, False),
    ({"epsilon": 0.0}, False),
])
def test_adams_outputs_are_proved_only_where_its_bound_holds(options, proved):
    pipe = gradpipe.build({"schedules": {"lr": {"kind": "linear", "start": 0.1, "end": 0.0,
                                                "steps": 10}},
                           "transforms": [{"kind": "adam", **options}]})
    pipe.build([tf.Variable([1.0])])
    assert ("proved" in pipe.plan.checks[0]) is proved


@pytest.mark.parametrize("kind, options, proved", [
    ("adagrad", {}, True),
    ("adagrad", {"learning_rate": "@lr"}, True),
    ("adagrad", {"learning_rate": 1e30}, True),  # each step requires 2 lr max(1, |g|) below it
    ("adagrad", {"epsilon": 1e-30}, True),
    ("adagrad", {"epsilon": 1e-31}, False),  # sqrt(eps) no longer holds an underflowing g**2
    ("adagrad", {"epsilon": 0.0}, False),  # 0 / 0 where the accumulator starts at 0 and g = 0
    ("rmsprop", {}, True),
    ("rmsprop", {"learning_rate": "@lr", "rho": 0.999999}, True),
    ("rmsprop", {"learning_rate": 1e30}, True),  # required at each step, as adagrad's
    ("rmsprop", {"momentum": 0.9, "learning_rate": 1e36}, True),
    # the momentum's sum of past steps: 2 lr / sqrt(1 - rho) / (1 - mu) * (1 + mu) > 3.4e38
    ("rmsprop", {"momentum": 0.9, "learning_rate": 1e37}, False),
    ("rmsprop", {"momentum": 0.9, "learning_rate": "@lr"}, False),  # past rates unknown
    ("rmsprop", {"rho": 1.0}, False),  # v never holds g**2
    ("rmsprop", {"rho": "@lr"}, False),
    ("rmsprop", {"centered": True}, False),  # v - avg**2 can round below 0
    ("rmsprop", {"epsilon": 1e-31}, False),
])
def test_mean_square_rules_are_proved_only_where_their_bound_holds(kind, options, proved):
    pipe = gradpipe.build({"schedules": {"lr": {"kind": "linear", "start": 0.1, "end": 0.0,
                                                "steps": 10}},
                           "transforms": [{"kind": kind, **options}]})
    pipe.build([tf.Variable([1.0])])
    assert ("proved from its input's norm and its state's largest element"
            in pipe.plan.checks[0]) is proved


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "fused"])
def test_adagrad_skips_the_step_that_would_overflow_its_accumulator(jit):
    """The proof reads the accumulator's largest element: near the float32 maximum,
    a gradient whose square would take it past that is skipped, and the same step
    as checked (the maths as a third party's) skips it too; a small one applies."""
    table = {"pipeline": {"jit_compile": jit},
             "transforms": [{"kind": "adagrad", "learning_rate": 0.1,
                             "initial_accumulator_value": 3e38}]}
    grads = [[np.array([1.0, 0.0, 0.0, 0.0], "f4")], [np.array([0.0, 0.0, 0.0, 1e19], "f4")],
             [np.array([0.0, 2.0, 0.0, 0.0], "f4")]]
    runs = [_run(t, grads, init=[np.zeros(4, "f4")]) for t in (table, _checked(table))]
    (weights,), state, applied, pipe = runs[0]
    assert "proved" in pipe.plan.checks[0] and "checked" in runs[1][3].plan.checks[0]
    assert applied == runs[1][2] == [True, False, True]
    np.testing.assert_array_equal(weights, runs[1][0][0])
    assert np.isfinite(weights).all() and weights[3] == 0.0
    assert np.isfinite(next(v for k, v in state.items() if "accumulator" in k)).all()


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("kind, first_step", [("adagrad", 0.1), ("rmsprop", 0.1 / 0.1**0.5)])
def test_a_mean_square_proof_holds_at_a_rate_set_while_training(jit, kind, first_step):
    """Each step requires ``2 * lr * max(1 / sqrt(k), |g|)`` below the float32 maximum
    at that step's rate: at 0.1 a gradient of 1e19 applies; at a rate set to 1e30,
    where ``lr * g`` overflows, it is skipped."""
    var = tf.Variable(np.zeros(3, "f4"))
    pipe = gradpipe.build({"pipeline": {"jit_compile": jit},
                           "transforms": [{"kind": kind, "learning_rate": 0.1}]})
    pipe.build([var])
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]))
    huge = tf.constant([1e19, 0.0, 0.0])
    assert bool(step(huge))
    pipe.learning_rate = 1e30
    assert not bool(step(huge))
    np.testing.assert_allclose(var.numpy(), [-first_step, 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "fused"])
def test_rmsprop_applies_steps_near_the_float32_maximum_as_checked_ones(jit):
    """rmsprop's average is a weighted mean: its proof requires ``rho max(v) + (1 -
    rho) sum(g**2)`` below the float32 maximum, not ``max(v) + sum(g**2)``, so steps
    whose squares come near the maximum apply as the checked copy's do."""
    table = {"pipeline": {"jit_compile": jit},
             "transforms": [{"kind": "rmsprop", "learning_rate": 0.1, "momentum": 0.5}]}
    grads = [[np.array([1.8e19, 0.0, 0.0, 0.0], "f4")]] * 3 + [[np.array([0, 1, 0, 0], "f4")]]
    runs = [_run(t, grads, init=[np.zeros(4, "f4")]) for t in (table, _checked(table))]
    assert "proved" in runs[0][3].plan.checks[0] and "checked" in runs[1][3].plan.checks[0]
    assert runs[0][2] == runs[1][2] == [True] * 4
    np.testing.assert_array_equal(runs[0][0][0], runs[1][0][0])


@pytest.mark.parametrize("table", [
    {"transforms": [{"kind": "adagrad"}]},  # declares nothing: compiled all the same
    {"transforms": [{"kind": "adam"}], "loss_scale": {"kind": "backoff"}},
])
def test_auto_compiles_whatever_compiles_with_no_declaration(table):
    assert _decides(table, LARGE)


def _plan_of_third_party(name: str, update, jit="auto"):
    register_transform(name, lambda cfg: gradpipe.Transform(gradpipe.no_state, update))
    pipe = gradpipe.build({"transforms": [{"kind": name}, {"kind": "sgd"}],
                           "pipeline": {"jit_compile": jit}})
    variables = [tf.Variable(tf.ones(s)) for s in LARGE]
    pipe.build(variables)
    return pipe, variables


def test_auto_falls_back_with_the_reason_where_xla_fails():
    """Found out at build, not declared: a transform XLA cannot compile keeps the
    plain path, and the plan names it in one line; the step still runs."""
    def halve_in_numpy(grads, state, variables):
        return [tf.numpy_function(lambda x: x * 0.5, [g], tf.float32, stateful=False)
                for g in grads], state

    pipe, variables = _plan_of_third_party("halves_in_numpy", halve_in_numpy)
    reason = pipe.plan.compile.reason
    assert not pipe.plan.compile.on and "\n" not in reason
    assert reason.startswith('"auto": transform halves_in_numpy failed to compile: ')
    grads = [tf.ones(v.shape) for v in variables]
    assert pipe.path(zip(grads, variables)) == "in place"  # sgd's kernel, uncompiled
    assert bool(pipe.apply_gradients(zip(grads, variables)))
    assert np.allclose(variables[0].numpy(), 1.0 - 0.01 * 0.5)


def test_auto_keeps_a_sort_off_xla_on_a_cpu():
    """XLA's sort on a CPU is 2-4x slower than TensorFlow's (360k floats: 121-139 ms
    against 34-62): "auto" keeps a transform that sorts on the plain path, and says
    why; jit_compile = true still compiles it, to the same numbers."""
    def clip_to_quantile(grads, state, variables):
        def clip(g):
            bound = tf.sort(tf.reshape(tf.abs(g), [-1]))[int(0.9 * g.shape.num_elements())]
            return tf.clip_by_value(g, -bound, bound)
        return [clip(g) for g in grads], state

    pipe, variables = _plan_of_third_party("sorts_gradients", clip_to_quantile)
    assert not pipe.plan.compile.on, pipe.plan
    assert pipe.plan.compile.reason.startswith(
        '"auto": transform sorts_gradients sorts (TopKV2), which XLA runs 2-4x slower')
    grads = [tf.reshape(tf.range(v.shape.num_elements(), dtype=tf.float32), v.shape)
             for v in variables]
    assert pipe.path(zip(grads, variables)) == "in place"  # sgd's kernel, uncompiled
    assert bool(pipe.apply_gradients(zip(grads, variables)))
    forced, compiled = _plan_of_third_party("sorts_gradients", clip_to_quantile, jit=True)
    assert forced.plan.compile.on
    assert bool(forced.apply_gradients(zip(grads, compiled)))
    for plain, xla in zip(variables, compiled):  # XLA fuses 1 - 0.01 g: rounding apart
        np.testing.assert_allclose(plain.numpy(), xla.numpy(), rtol=1e-6, atol=1e-7)


def test_auto_lowers_again_each_shape_whose_maths_differs():
    """"auto" lowers a function once for the shapes it traces alike to, and again
    for a shape whose trace differs: a transform XLA cannot compile for vectors
    alone (numpy for rank 1) keeps the plain path, though the matrices' lowered."""
    def halve_vectors_in_numpy(grads, state, variables):
        return [g * 0.5 if g.shape.rank > 1 else
                tf.numpy_function(lambda x: x * 0.5, [g], tf.float32, stateful=False)
                for g in grads], state

    pipe, variables = _plan_of_third_party("halves_vectors_in_numpy", halve_vectors_in_numpy)
    assert str(pipe.plan.per_variable).startswith("no"), pipe.plan
    assert pipe.plan.compile.reason.startswith(
        '"auto": transform halves_vectors_in_numpy failed to compile: ')
    assert bool(pipe.apply_gradients(zip([tf.ones(v.shape) for v in variables], variables)))
    assert np.allclose(variables[1].numpy(), 1.0 - 0.01 * 0.5)


def test_random_draws_keep_the_plain_path_unless_xla_is_forced():
    """XLA draws other random numbers than TF's kernels: "auto" does not compile a
    transform that draws any, so the draws never depend on the variables' sizes."""
    def noise(grads, state, variables):
        return [g + tf.random.stateless_normal(tf.shape(g), seed=[1, 2]) for g in grads], state

    pipe, _ = _plan_of_third_party("adds_noise", noise)
    assert pipe.plan.compile.reason == (
        '"auto": transform adds_noise draws random numbers (StatelessRandomGetKeyCounter), '
        "which XLA draws differently from the plain path")
    forced, _ = _plan_of_third_party("adds_noise", noise, jit=True)
    assert forced.plan.compile.on and "although transform adds_noise draws" in \
        forced.plan.compile.reason


def test_auto_keeps_the_plain_path_for_sparse_gradients_writers_and_strategies(tmp_path):
    """Sparse gradients a rule keeps as rows (lazy adam) keep the plain path; a rule
    that makes them dense anyway gets them dense up front, and compiles."""
    pipe = gradpipe.build({"transforms": [{"kind": "adam", "lazy": True}]})
    var = tf.Variable(np.ones((131_072, 2), "f4"))
    pipe.build([var])
    dense = [(tf.ones((131_072, 2)), var)]
    sparse = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([1]), tf.constant([131_072, 2]))
    assert pipe.path(dense) == "compiled"
    assert pipe.path([(sparse, var)]) == "plain (sparse gradients keeps the plain path)"
    densified = gradpipe.build({"transforms": [{"kind": "adam"}]})
    densified.build([var])
    assert densified.path([(sparse, var)]) == "compiled"
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        assert pipe.path(dense) == "plain (a summary writer keeps the plain path)"
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        assert "a distribution strategy keeps the plain path" in pipe.path(dense)


def _live_ops(graph) -> list:
    """The ops TF's function runtime runs: those the outputs or a stateful op need.
    (A chain traced only for its ``require_finite`` scalars leaves dead ops, pruned.)"""
    frontier = [t.op for t in graph.outputs] + [
        op for op in graph.get_operations() if op._is_stateful]
    live: dict[str, object] = {}
    while frontier:
        op = frontier.pop()
        if op.name not in live:
            live[op.name] = op
            frontier += [t.op for t in op.inputs] + list(op.control_inputs)
    return list(live.values())


def _step_ops(concrete, into: tuple[str, ...] = ("then_branch", "else_branch", "f")) -> list:
    """Every live op of a traced step: its graph and every function it calls through
    the attributes ``into`` (by default the conditionals' branches too)."""
    ops, graphs, seen = [], [concrete.graph], set()
    while graphs:
        graph = graphs.pop()
        for op in _live_ops(graph):
            ops.append(op)
            for attr in into:
                try:
                    name = op.get_attr(attr).name
                except (ValueError, TypeError, AttributeError):
                    continue
                if name not in seen:
                    seen.add(name)
                    graphs.append(graph._get_function(name).graph)
    return ops


def _op_counts(concrete, size: int | None = None) -> dict[str, int]:
    """Op type -> count of the step's live ops (with ``size``: only those that read
    or write a float tensor of ``size`` elements)."""
    counts: dict[str, int] = {}
    for op in _step_ops(concrete):
        if size is None or any(t.dtype.is_floating and t.shape.num_elements() == size
                               for t in (*op.inputs, *op.outputs)):
            counts[op.type] = counts.get(op.type, 0) + 1
    return counts


def _elementwise_finite_checks(concrete, size: int) -> int:
    """The engine's element-wise finite checks over ``size`` elements: sum(x * 0), NaN
    exactly where an element is not finite."""
    def times_zero(op) -> bool:
        return op.type == "Mul" and any(
            t.op.type == "Const" and not tf.get_static_value(t).any() for t in op.inputs)
    return sum(op.type == "Sum" and times_zero(op.inputs[0].op)
               and op.inputs[0].shape.num_elements() == size for op in _step_ops(concrete))


def test_one_pass_serves_the_finite_check_the_scaler_and_the_norm():
    """Plain path, one 1000-element variable: the scaled gradient is read once by a
    fused sum of squares (norm and finite check together); the element-wise check and
    a second sum live only in the branch taken when that sum is not finite; the
    updates are never checked element-wise."""
    pipe = gradpipe.build(_with(CLIP_ADAM, jit_compile=False))
    var = tf.Variable(tf.zeros([1000]))
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]))
    concrete = step.get_concrete_function(tf.TensorSpec([1000], tf.float32))
    counts = _op_counts(concrete, 1000)
    # The engine's fallback check and nothing else: neither the scaler nor the update
    # guard reads every element again.
    assert _elementwise_finite_checks(concrete, 1000) == 1, counts
    # The scaled gradient, and the unscaled one in the rare fallback: clipping sums
    # nothing itself, it reuses the engine's sum.
    assert counts.get("L2Loss") == 2, counts
    assert counts.get("Square") == 1, counts  # Adam's g*g


@pytest.mark.parametrize("size", [16_384, 1_000])
def test_plain_scalar_guard_decides_before_the_chain_runs(size):
    """Plain path: the finite flag and the guard's scalars decide first, and one
    conditional holds the chain and the assignments. No update or new moment is
    its operand (a nested conditional switches every operand it carries); only
    the gradient is."""
    pipe = gradpipe.build(_with(CLIP_ADAM, jit_compile=False))
    var = tf.Variable(tf.zeros([size]))
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]))
    concrete = step.get_concrete_function(tf.TensorSpec([size], tf.float32))
    sized_operands = [sum(t.dtype.is_floating and t.shape.num_elements() == size
                          for t in op.inputs)
                      for op in _step_ops(concrete) if op.type in ("If", "StatelessIf")]
    assert max(sized_operands) == 1, sized_operands


@pytest.mark.parametrize("rule", [{"kind": "adam", "learning_rate": 0.05},
                                  {"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9}])
def test_the_in_place_scalar_guard_costs_no_read_of_the_state(rule):
    """At a constant rate, the rule's required scalars are the norm the step has
    already, or proved by its config: the guard adds no read of a slot or variable
    (the trace that found them is not in the step) and no step-size computation.
    Nothing outside the conditional reads a variable, guarded or not: not the rule's
    state (which the chain before it does not need), nor ``iterations`` for
    summaries no writer records (TF never prunes a read)."""
    def ops(check_updates: bool) -> dict[str, int]:
        variables = [tf.Variable(x) for x in INIT]
        pipe = gradpipe.build(_with({"transforms": [
            {"kind": "clip_by_global_norm", "clip_norm": 1.0}, rule]},
            jit_compile=False, check_updates=check_updates))
        pipe.build(variables)
        assert pipe.path(zip([tf.constant(x) for x in INIT], variables)) == "in place"
        step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
        concrete = step.get_concrete_function([tf.TensorSpec(x.shape) for x in INIT])
        assert [op.name for op in _live_ops(concrete.graph)
                if op.type == "ReadVariableOp"] == []
        return _op_counts(concrete)

    guarded, unguarded = ops(True), ops(False)
    for op_type in ("ReadVariableOp", "Pow", "Sqrt", "RealDiv"):
        assert guarded.get(op_type) == unguarded.get(op_type), op_type


def _clipped_step(rule: str, jit: bool):
    """The pipeline clip_by_global_norm -> ``rule``, its tf.function step over INIT's
    shapes, and that step's trace."""
    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build(_with({"transforms": [
        {"kind": "clip_by_global_norm", "clip_norm": 1.0},
        {"kind": rule, "learning_rate": 0.05}]}, jit_compile=jit))
    pipe.build(variables)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    return pipe, step, step.get_concrete_function([tf.TensorSpec(x.shape) for x in INIT])


@pytest.mark.parametrize("rule", ["adam", "lamb"], ids=["in-place", "functional"])
def test_a_step_writes_only_in_the_branch_that_decides(rule):
    """Without a loss scaler every write of a plain step, the skip counter's included,
    is inside the conditional that decides whether it applies: a step that applies
    writes no counter but the iterations (and a skip only the skip counter). (The
    compiled step has no conditional: it writes on every call, the old values where
    it skips; see test_the_compiled_step_has_no_conditional.)"""
    pipe, step, concrete = _clipped_step(rule, jit=False)
    for op in _step_ops(concrete, into=("f",)):  # the step, the compiled function it calls
        assert "Assign" not in op.type, op.name
    skip = [np.full_like(x, np.nan) for x in INIT]
    assert [bool(step([tf.constant(g) for g in grads])) for grads in (INIT, skip)] == [
        True, False]
    assert (int(pipe.iterations), int(pipe.skipped_steps)) == (1, 1)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["adam", "lamb"])
def test_the_compiled_step_has_no_conditional(rule):
    """Every transform's state is kept by the engine where a step is skipped, so the
    compiled step needs no conditional, whatever the transform (lamb declares
    nothing): nothing the size of the parameters crosses one."""
    pipe, step, concrete = _clipped_step(rule, jit=True)
    compiled = [op for op in _step_ops(concrete, into=("f",)) if op.type in (
        "If", "StatelessIf")]
    assert [op.name for op in compiled if "transforms_" in op.name] == []
    skip = [np.full_like(x, np.nan) for x in INIT]
    assert [bool(step([tf.constant(g) for g in grads])) for grads in (INIT, skip)] == [
        True, False]
    assert (int(pipe.iterations), int(pipe.skipped_steps)) == (1, 1)


def test_a_chain_that_is_not_proved_checks_its_outputs():
    pipe = gradpipe.build({"transforms": [{"kind": "lars", "learning_rate": 0.1}],
                           "pipeline": {"jit_compile": False}})
    var = tf.Variable(tf.ones([1000]))
    pipe.build([var])
    assert "checked" in pipe.plan.checks[0]
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]))
    concrete = step.get_concrete_function(tf.TensorSpec([1000], tf.float32))
    # the rare fallbacks, one element at a time: the gradients, and the updates (lars's
    # new momentum: a state that is the updates is checked once)
    assert _elementwise_finite_checks(concrete, 1000) == 2, _op_counts(concrete, 1000)


@pytest.mark.parametrize("scale, exact", [(2.0**15, True), (1.0, True), (2.0**-3, True),
                                          (1000.0, False), (3.0, False)])
def test_power_of_two_scales_unscale_by_multiplication_bit_for_bit(scale, exact):
    from gradpipe._engine.step_ops import unscale

    if scale >= 1:  # a fixed scale is at least 1
        scaler = gradpipe.build({"loss_scale": {"kind": "fixed", "loss_scale_value": scale},
                                 "transforms": [{"kind": "sgd"}]}).loss_scaler
        assert scaler.power_of_two is exact
    g = tf.constant(np.random.default_rng(3).normal(size=10_000).astype("f4")
                    * np.float32(1e4))
    s = tf.constant(scale)
    by_division = (g / s).numpy()
    by_multiplication = unscale(g, s, tf.float32, reciprocal=True).numpy()
    if exact:
        np.testing.assert_array_equal(by_multiplication, by_division)
    np.testing.assert_array_equal(unscale(g, s, tf.float32, reciprocal=False).numpy(),
                                  by_division)


def test_dynamic_scaler_multiplies_only_when_every_scale_is_a_power_of_two():
    def scaler(**config):
        return gradpipe.build({"loss_scale": {"kind": "dynamic", **config},
                               "transforms": [{"kind": "sgd"}]}).loss_scaler

    assert scaler().power_of_two
    assert not scaler(initial_loss_scale=1000.0).power_of_two
    assert not scaler(multiplier=3.0).power_of_two
    assert not scaler(min_loss_scale=0.0).power_of_two  # may go denormal: 1/S overflows


SGD_CASES = {"momentum": {"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9},
             "nesterov": {"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9,
                          "nesterov": True},
             "plain": {"kind": "sgd", "learning_rate": 0.1}}
ADAM_CASES = {"adam": {"kind": "adam", "learning_rate": 0.1},
              "amsgrad": {"kind": "adam", "learning_rate": 0.1, "amsgrad": True,
                          "beta_2": 0.99},
              "scheduled": {"kind": "adam", "beta_1": 0.8, "learning_rate": {
                  "kind": "piecewise_constant", "learning_rate": 0.1, "boundaries": [2],
                  "decay_rates": [0.1]}}}


@pytest.mark.parametrize("case", [*SGD_CASES, *ADAM_CASES])
def test_in_place_updates_equal_the_functional_update_bit_for_bit(case):
    """sgd: ResourceApplyKerasMomentum/GradientDescent compute exactly Keras's
    formulas; adam: ResourceApplyGradientDescent on each moment and
    ResourceApplyAdagradV2 on the variable round as the functional update does."""
    grads = [_grads(1.0) for _ in range(6)] + [_grads(1.0, "nan")]
    results = []
    for in_place in (True, False):
        variables = [tf.Variable(x) for x in INIT]
        table = {"transforms": [{**SGD_CASES, **ADAM_CASES}[case]],
                 "pipeline": {"jit_compile": False}}
        pipe = gradpipe.build(table if in_place else _checked(table))
        pipe.build(variables)
        path = pipe.path(zip([tf.constant(x) for x in grads[0]], variables))
        assert (path == "in place") is in_place
        step = tf.function(lambda g, p=pipe, v=variables: p.apply_gradients(zip(g, v)))
        applied = [bool(step([tf.constant(x) for x in g])) for g in grads]
        results.append(([v.numpy() for v in variables],
                         [s.numpy() for s in pipe.transform_state(0).values()], applied))
    (weights, slots, applied), (weights_f, slots_f, applied_f) = results
    assert applied == applied_f == [True] * 6 + [False]
    for a, b in zip(weights + slots, weights_f + slots_f):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
def test_in_place_adam_is_keras_bit_for_bit_on_variables_split_across_threads(amsgrad):
    """adam's fused kernels against Keras 3's Adam, rtol 0: sizes whose kernels TF
    splits across the thread pool and whose lengths leave a remainder after the
    vector loop, gradients from 1e-3 to 1e2."""
    import keras

    rng = np.random.default_rng(11)
    sizes = [1, 4_099, 65_537, 262_147]
    init = [rng.normal(size=n).astype("f4") for n in sizes]
    steps = [[(rng.normal(size=n) * scale).astype("f4") for n in sizes]
             for scale in (1e-3, 1.0, 1e2, 1.0)]
    ours, theirs = [tf.Variable(x) for x in init], [tf.Variable(x) for x in init]
    table = {"transforms": [{"kind": "adam", "learning_rate": 0.01, "amsgrad": amsgrad}],
             "pipeline": {"jit_compile": False}}
    assert _kernel_ops(table, ours) == {"ResourceApplyGradientDescent",
                                        "ResourceApplyAdagradV2"}
    pipe = gradpipe.build(table)
    opt = keras.optimizers.Adam(0.01, amsgrad=amsgrad)
    opt.build(theirs)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, ours)))
    keras_step = tf.function(lambda g: opt.apply(g, theirs))
    for grads in steps:
        assert bool(step([tf.constant(g) for g in grads]))
        keras_step([tf.constant(g) for g in grads])
    assert pipe.path(zip([tf.constant(g) for g in steps[0]], ours)) == "in place"
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def _kernel_ops(table: dict, variables) -> set[str]:
    pipe = gradpipe.build(table)
    pipe.build(variables)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    concrete = step.get_concrete_function([tf.TensorSpec(v.shape, tf.float32)
                                           for v in variables])
    return {op.type for op in _step_ops(concrete) if op.type.startswith("ResourceApply")}


def test_the_in_place_path_is_taken_only_where_nothing_else_needs_the_updates():
    sgd = {"transforms": [SGD_CASES["momentum"]], "pipeline": {"jit_compile": False}}
    variables = [tf.Variable(x) for x in INIT]
    assert _kernel_ops(sgd, variables) == {"ResourceApplyKerasMomentum"}
    frozen = _with(sgd, freeze=["Variable"])
    assert _kernel_ops(frozen, [tf.Variable(x) for x in INIT]) == set()
    scheduled = {"transforms": [{"kind": "sgd", "momentum": 0.9, "learning_rate": {
        "kind": "piecewise_constant", "learning_rate": 0.1, "boundaries": [2],
        "decay_rates": [0.1]}}], "pipeline": {"jit_compile": False}}
    # a scheduled rate has no static bound: every update is checked, so no kernel
    assert _kernel_ops(scheduled, [tf.Variable(x) for x in INIT]) == set()


def test_the_compiled_step_is_one_loop_per_array_it_writes():
    """XLA, Adam with clipping and loss scaling: per variable exactly three
    parameter-sized loops (its two moments, then itself from them); no
    parameter-sized copy anywhere, nothing materialised for the unscaled or
    clipped gradients (the sum of squares folds each gradient into a row
    FOLD_ROWS times shorter, see test_xla_sum_of_squares_folds_before_it_reduces)."""
    import re

    size = 12_345
    variables = [tf.Variable(tf.zeros([size])), tf.Variable(tf.zeros([size]))]
    pipe = gradpipe.build(_with(CLIP_ADAM, jit_compile=True))
    grads = [tf.ones([size]), tf.ones([size])]
    pipe.apply_gradients(zip(grads, variables))
    assert pipe.path(zip(grads, variables)) == "compiled"
    hlo = pipe.compiled_hlo(zip(grads, variables))
    entry = hlo[hlo.index("\nENTRY"):]
    sized = rf"= f32\[{size}\]\{{0\}} (\w+)\("
    assert re.findall(sized, hlo).count("copy") == 0
    computed = [op for op in re.findall(sized, entry) if op != "parameter"]
    assert computed == ["fusion"] * 6, computed


def _buffer(variable: tf.Variable) -> int:
    """Address of the buffer behind ``variable``: ``np.asarray`` views the read
    tensor's memory, which aliases the variable's (``Tensor.numpy()`` would copy it,
    and compare where the allocator put each copy)."""
    return np.asarray(variable.value()).__array_interface__["data"][0]


def test_compiled_steps_update_variables_and_slots_in_their_own_buffers():
    """After the first step (which XLA runs on fresh buffers), every compiled step
    writes each variable and slot where it already lives: no parameter-sized
    buffer is allocated per step. The pipeline keeps no tensor of its initial
    state, whose buffers the slots adopt: holding one kept a second copy of every
    slot alive for good (153 MiB at 20M parameters, benchmarks/HISTORY.md)."""
    size = 20_000
    variables = [tf.Variable(tf.zeros([size])) for _ in range(3)]
    pipe = gradpipe.build(_with(CLIP_ADAM, jit_compile=True))
    grads = [tf.ones([size]) for _ in range(3)]
    pipe.build(variables)
    step = tf.function(lambda: pipe.apply_gradients(zip(grads, variables)))
    everything = variables + [v for v in pipe.named_variables().values() if v.shape == (size,)]
    assert len(everything) == 9  # three variables, two Adam moments each
    step()
    for _ in range(2):
        before = [_buffer(v) for v in everything]
        step()
        assert [_buffer(v) for v in everything] == before


@pytest.mark.parametrize("shape", [(1,), (31,), (4_095,), (4_096,), (32 * 4_096 + 7,),
                                   (300, 257), (0,)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_xla_sum_of_squares_equals_l2loss(shape, dtype):
    """The folded sum inside XLA and TF's L2Loss outside it agree to float32
    rounding (they add in different orders), for every size around the fold's
    threshold and remainder, and for half-precision gradients."""
    value = tf.cast(RNG.normal(size=shape).astype("f4") * 3, dtype)
    outside = gradpipe.transform.sum_of_squares([value, None])
    inside = tf.function(lambda x: gradpipe.transform.sum_of_squares([x, None]),
                         jit_compile=True)(value)
    expected = float(np.sum(np.square(value.numpy().astype("f8"))))
    assert_close(inside, expected, rtol=1e-5, atol=0.0)
    assert_close(outside, expected, rtol=1e-5, atol=0.0)


@pytest.mark.parametrize("poison,expected", [(np.inf, np.inf), (np.nan, np.nan),
                                             (1e30, np.inf)])
def test_xla_sum_of_squares_is_not_finite_exactly_when_l2loss_is_not(poison, expected):
    values = RNG.normal(size=200_003).astype("f4")
    values[123_457] = poison
    inside = tf.function(lambda x: gradpipe.transform.sum_of_squares([x]),
                         jit_compile=True)(tf.constant(values))
    np.testing.assert_equal(float(inside), expected)
    np.testing.assert_equal(float(gradpipe.transform.sum_of_squares([values])), expected)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_xla_sum_of_squares_folds_before_it_reduces(dtype):
    """XLA's CPU reduction is a sequential loop; the fold is what makes the sum run
    at memory bandwidth. In the optimised HLO nothing of the tensor's size is
    materialised (not its float32 cast either), and every reduction adds up short
    runs: the fold FOLD_ROWS elements for each element of its row, then partial
    sums of FOLD_WIDTH elements of that row (or a remainder of fewer)."""
    import re

    size = 100_003
    fn = tf.function(lambda x: gradpipe.transform.sum_of_squares([x]), jit_compile=True)
    hlo = fn.experimental_get_compiler_ir(tf.zeros([size], dtype))(stage="optimized_hlo")
    # Buffers live in the entry and control-flow computations; fused ones only
    # describe loop bodies.
    unfused = [block for block in hlo.split("\n\n")
               if not re.match(r"%(fused|wrapped)", block.lstrip())]
    materialised = re.findall(rf"= \w+\[{size}\]\{{0\}} ([\w-]+)\(", "\n".join(unfused))
    assert set(materialised) <= {"parameter", "bitcast"}, materialised
    sizes = {name: int(np.prod([int(d) for d in dims.split(",") if d]))
             for name, dims in re.findall(r"%([\w.-]+) = f32\[([\d,]*)\]", hlo)}
    reduced = re.findall(r"%([\w.-]+) = f32\[[\d,]*\]\S* reduce(?:-window)?\(%([\w.-]+)",
                         hlo)
    assert reduced, hlo
    rows, width = gradpipe.transform.FOLD_ROWS, gradpipe.transform.FOLD_WIDTH
    partial_sums = size // rows // width
    runs = {out: sizes[operand] // sizes[out] for out, operand in reduced}
    assert all(run <= max(partial_sums, width, rows) for run in runs.values()), runs


def test_keep_where_skipped_is_checked_not_trusted():
    """A transform that passes its state through keep_where_skipped with a wrong
    ``old`` (zeros) would lose it on a skipped step: the engine checks ``old`` is the
    state it handed in, and keeps the real one itself."""
    def update(grads, state, variables):
        new = [m + g for g, m in zip(grads, state)]
        kept = gradpipe.plugin.keep_where_skipped(new, [tf.zeros_like(m) for m in state])
        return kept, kept

    register_transform("forgets_on_skips", lambda cfg: gradpipe.Transform(
        gradpipe.plugin.zeros_like_vars, update))
    var = tf.Variable(tf.zeros([5000]))
    pipe = gradpipe.build({"transforms": [{"kind": "forgets_on_skips"}, {"kind": "sgd"}],
                           "pipeline": {"jit_compile": True}})
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]))
    assert bool(step(tf.ones([5000])))
    assert not bool(step(tf.fill([5000], np.nan)))
    [slot] = pipe.transform_state("forgets_on_skips").values()
    np.testing.assert_array_equal(slot.numpy(), np.ones(5000, "f4"))
