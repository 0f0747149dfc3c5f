"""Packed state (multi-tensor apply): many small variables, one packed chain.

* "auto" packs exactly where it is allowed and pays; ``true`` names what blocks it;
* packed and per-variable steps agree, skipped steps and missing gradients included;
* checkpoints and .keras files are the same either way, and restore across;
* the packed step launches a few ops per variable, not a chain per variable.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import assert_close, register_transform
from gradpipe import GradpipeError

RNG = np.random.default_rng(3)
SHAPES = [(int(n),) if i % 3 else (int(n) // 4, 4)
          for i, n in enumerate(RNG.integers(8, 60, size=24) * 4)]  # 24 small variables
INIT = [RNG.normal(size=s).astype("f4") for s in SHAPES]
CLIP_ADAM = {"loss_scale": {"kind": "dynamic", "initial_loss_scale": 1024.0,
                            "increment_period": 2},
             "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                            {"kind": "adam", "learning_rate": 0.05}]}
CLIP_SGD = {"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                           {"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9,
                            "nesterov": True}]}


def _with(table: dict, **options) -> dict:
    return {**table, "pipeline": {**table.get("pipeline", {}), **options}}


def _grads(poison: str | None = None, missing: int | None = None) -> list:
    grads = [RNG.normal(size=s).astype("f4") * 4096 for s in SHAPES]
    if poison == "nan":
        grads[5].flat[1] = np.nan
    elif poison == "huge":  # finite, but the sum of squares overflows float32
        grads[2][:] = 1e30
    if missing is not None:
        grads[missing] = None
    return grads


SEQUENCE = [_grads(), _grads(), _grads("nan"), _grads(missing=7), _grads("huge"),
            _grads(), _grads(missing=0), _grads()]


def _run(table: dict, sequence=SEQUENCE, compiled=True):
    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build(table)

    def step(grads):
        return pipe.apply_gradients(zip(grads, variables))

    fn = tf.function(step) if compiled else step
    applied = [bool(fn([None if x is None else tf.constant(x) for x in g]))
               for g in sequence]
    state = {k: v.numpy() for k, v in pipe.named_variables().items()}
    return [v.numpy() for v in variables], state, applied, pipe


def _packs(table: dict, shapes) -> bool:
    pipe = gradpipe.build(table)
    pipe.build([tf.Variable(tf.zeros(s)) for s in shapes])
    return pipe.plan.pack.on


@pytest.mark.slow
def test_auto_packs_many_small_variables_of_an_elementwise_chain():
    assert _packs(CLIP_ADAM, SHAPES) and _packs(CLIP_SGD, SHAPES)
    assert not _packs(CLIP_ADAM, SHAPES[:3])  # too few for the op count to matter
    assert not _packs(CLIP_ADAM, [(128, 128)] * 20)  # compiled one by one instead
    assert _packs(CLIP_ADAM, [(128, 128)] * 129)  # more than XLA compiles one by one
    # 20 shapes of 18k elements: each compiled alone would not pay back its compile
    pipe = gradpipe.build(CLIP_ADAM)
    pipe.build([tf.Variable(tf.zeros((128, 128 + i))) for i in range(20)])
    assert str(pipe.plan.pack) == (
        'yes: "auto": 20 variables, not compiled one by one: 20 distinct shapes of 17,600 '
        "elements on average, fewer than the 262,144 where compiling each on a CPU, before "
        "the first step, pays for itself")
    assert not _packs(_with(CLIP_ADAM, pack_variables=False), SHAPES)
    assert _packs(_with(CLIP_ADAM, pack_variables=True), SHAPES[:2])
    assert not _packs(_with(CLIP_ADAM, accumulation_steps=2), SHAPES)


def _third_party(name: str, update, init=gradpipe.no_state) -> str:
    register_transform(name, lambda cfg: gradpipe.Transform(init, update))
    return name


def _ema(grads, state, variables):
    new = [m if g is None else 0.9 * m + g for g, m in zip(grads, state)]
    return [None if g is None else m for g, m in zip(grads, new)], new


def test_the_engine_finds_out_whether_a_transform_packs():
    """Nothing is declared: the engine runs each transform packed and variable by
    variable before it packs; one that reads a variable's own norm is not packed,
    and the plan says why."""
    halves = _third_party("halves", lambda g, s, v: (
        [None if x is None else x * 0.5 for x in g], s))
    per_norm = _third_party("divides_by_its_norm", lambda g, s, v: (
        [None if x is None else x / (tf.norm(x) + 1.0) for x in g], s))
    chain = {"transforms": [{"kind": halves}, {"kind": "adam"}]}
    assert _packs(chain, SHAPES)
    pipe = gradpipe.build({"transforms": [{"kind": per_norm}, {"kind": "adam"}]})
    pipe.build([tf.Variable(tf.zeros(s)) for s in SHAPES])
    assert not pipe.plan.pack.on
    assert "divides_by_its_norm is not elementwise" in pipe.plan.pack.reason
    # a rule that excludes some variables by name reads names, which packed lack;
    # the pattern matches none of the engine's own test variables
    decays = {"transforms": [{"kind": "adamw", "exclude_from_weight_decay": ["norm"]}]}
    shapes = {"layer_norm/gamma": (4,), **{f"dense_{i}/kernel": s for i, s in enumerate(SHAPES)}}
    pipe = gradpipe.build(decays)
    pipe.build([tf.Variable(tf.zeros(s), name=n) for n, s in shapes.items()])
    assert pipe.plan.pack.reason == (
        "transform adamw reads the variables' names, which packed into one vector they lack")
    assert _packs({"transforms": [{"kind": "adamw"}]}, SHAPES)  # decays every variable
    ema = _third_party("averages", _ema, init=gradpipe.plugin.zeros_like_vars)
    for table in (chain, {"transforms": [{"kind": ema}, {"kind": "sgd"}]}):
        packed, split = _run(table), _run(_with(table, pack_variables=False))
        assert packed[3].plan.pack.on and not split[3].plan.pack.on
        assert packed[2] == split[2]  # compiled packed against plain: float32 rounding
        assert_close(packed[0], split[0], rtol=1e-5, atol=1e-4)  # weights reach 700


def test_a_bad_pack_variables_value_is_a_config_error():
    with pytest.raises(gradpipe.ConfigError, match=r"pipeline\.pack_variables: .*'auto'"):
        gradpipe.build(_with(CLIP_ADAM, pack_variables="yes"))


@pytest.mark.parametrize("table, reason", [
    ({"transforms": [{"kind": "clip_by_norm", "clip_norm": 1.0}, {"kind": "adam"}]},
     "clip_by_norm is not elementwise"),
    (_with(CLIP_ADAM, freeze=["Variable"]), "freeze"),
    ({"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0, "exclude": ["Variable"]},
                     {"kind": "adam"}]}, "exclude"),
])
def test_pack_true_names_what_prevents_it(table, reason):
    with pytest.raises(GradpipeError, match=reason):
        _packs(_with(table, pack_variables=True), SHAPES)


@pytest.mark.slow
@pytest.mark.parametrize("table", [CLIP_ADAM, CLIP_SGD], ids=["adam", "sgd"])
@pytest.mark.parametrize("jit", [False, "auto"], ids=["plain", "xla"])
def test_packed_and_per_variable_steps_agree(table, jit):
    """Same skips, same scale, weights and every slot within 1e-6: NaN and overflowing
    steps skipped, a missing gradient leaves its variable and its slots alone."""
    packed = _run(_with(table, jit_compile=jit))
    reference = _run(_with(table, jit_compile=False, pack_variables=False))
    assert packed[3].plan.pack.on and not reference[3].plan.pack.on
    assert packed[3].plan.compile.on is (jit == "auto")
    assert packed[2] == reference[2]
    if "loss_scale" in table:
        assert packed[2] == [True, True, False, True, True, True, True, True]
    assert_close(packed[0], reference[0], rtol=1e-6, atol=1e-6)
    assert packed[1].keys() == reference[1].keys()
    for name in packed[1]:
        assert_close(packed[1][name], reference[1][name], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_a_missing_gradient_leaves_its_variable_and_slots_exactly_as_they_were():
    table = _with(CLIP_ADAM, pack_variables=True)
    before = _run(table, SEQUENCE[:3])
    after = _run(table, SEQUENCE[:3] + [_grads(missing=4)])
    np.testing.assert_array_equal(after[0][4], before[0][4])
    for kind in ("mu", "nu"):
        names = [k for k in after[1] if k.startswith(f"slots/1_adam/{kind}/")]
        assert len(names) == len(SHAPES)
        # eager tf.Variables are all "Variable": the slots are suffixed in order
        np.testing.assert_array_equal(after[1][f"slots/1_adam/{kind}/Variable_4"],
                                      before[1][f"slots/1_adam/{kind}/Variable_4"])
        assert not np.array_equal(after[1][f"slots/1_adam/{kind}/Variable_5"],
                                  before[1][f"slots/1_adam/{kind}/Variable_5"])


@pytest.mark.slow
def test_eager_and_traced_packed_steps_agree():
    traced = _run(CLIP_ADAM)
    eager = _run(CLIP_ADAM, compiled=False)
    assert eager[2] == traced[2]
    assert_close(eager[0], traced[0], rtol=1e-6, atol=1e-6)


def test_packed_adam_matches_keras_adam():
    """Against the reference: Keras Adam(global_clipnorm=1), 5 steps (atol 1e-6)."""
    table = {"transforms": CLIP_ADAM["transforms"]}
    grads = [_grads() for _ in range(5)]
    ours, _, applied, pipe = _run(table, grads)
    assert pipe.plan.pack.on and all(applied)
    variables = [tf.Variable(x) for x in INIT]
    opt = keras.optimizers.Adam(0.05, global_clipnorm=1.0)
    for g in grads:
        opt.apply_gradients([(tf.constant(x), v) for x, v in zip(g, variables)])
    assert_close(ours, [v.numpy() for v in variables], rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("saved_packed", [True, False], ids=["packed-saved", "plain-saved"])
def test_checkpoints_restore_across_packed_and_per_variable_layouts(tmp_path, saved_packed):
    def pipeline(packed):
        return _run(_with(CLIP_ADAM, pack_variables=packed), SEQUENCE[:1])

    saved = _run(_with(CLIP_ADAM, pack_variables=saved_packed))
    path = tf.train.Checkpoint(pipeline=saved[3]).save(str(tmp_path / "ckpt"))
    target = pipeline(not saved_packed)
    assert target[3].layout() == saved[3].layout()
    target[3].restore(path)
    for name, value in target[3].named_variables().items():
        np.testing.assert_array_equal(np.asarray(value.numpy()), saved[1][name])


def test_slot_views_read_and_write_like_variables():
    pipe = _run(CLIP_ADAM, SEQUENCE[:2])[3]
    state = pipe.transform_state("adam")
    view = state[next(k for k in state if k.startswith("mu/"))]
    assert "of a packed slot" in repr(view) and not isinstance(view, tf.Variable)
    value = view.numpy()
    assert value.shape == tuple(view.shape) and value.any()
    view.assign(np.full(view.shape, 2.0, "f4"))
    np.testing.assert_array_equal(tf.convert_to_tensor(view).numpy(), 2.0)
    others = [v.numpy() for k, v in state.items() if k.startswith("mu/") and v is not view]
    assert all(np.all(o != 2.0) for o in others)  # only its own slice was written


@pytest.mark.slow
def test_the_packed_step_is_a_few_ops_per_variable():
    """Per variable: its gradient reshaped into the pack, its slice of the update
    reshaped and subtracted. The chain runs once, not once per variable."""
    bookkeeping = {"Const", "Placeholder", "Identity", "NoOp"}  # no kernel work

    def op_count(packed, shapes):
        variables = [tf.Variable(tf.zeros(s)) for s in shapes]
        pipe = gradpipe.build(_with(CLIP_ADAM, pack_variables=packed, jit_compile=False))
        grads = [tf.zeros(s) for s in shapes]
        step = tf.function(lambda: pipe.apply_gradients(zip(grads, variables)))
        graph = step.get_concrete_function().graph
        types = [op.type for op in graph.get_operations()]
        for function in graph._functions.values():  # the conditionals' branches
            types += [node.op for node in function.definition.node_def]
        return sum(t not in bookkeeping for t in types)

    def ops_per_variable(packed):  # what one more variable adds
        return (op_count(packed, SHAPES * 2) - op_count(packed, SHAPES)) / len(SHAPES)

    packed, per_variable = ops_per_variable(True), ops_per_variable(False)
    assert packed <= 3, packed  # reshape in, reshape out, subtract (none for vectors)
    assert per_variable > 5 * packed, (per_variable, packed)


def test_one_trace_and_no_hook_call_per_packed_step():
    from gradpipe.registry import get_registry

    variables = [tf.Variable(x) for x in INIT]
    pipe = gradpipe.build(CLIP_ADAM)
    pipe.build(variables)  # state created inside a first trace makes TF trace twice
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    step([tf.constant(x) for x in SEQUENCE[0]])
    calls = []
    undo = get_registry().pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: calls.append(name), lambda *a: None)
    try:
        for grads in SEQUENCE[1:3] + SEQUENCE[5:6]:
            step([tf.constant(x) for x in grads])
    finally:
        undo()
    assert pipe.plan.pack.on
    assert step.experimental_get_tracing_count() == 1 and calls == []


@pytest.mark.slow
def test_keras_fit_save_and_load_with_packed_state(tmp_path):
    """A model of 24 small layers: fit packs, .keras holds every slot by name."""
    keras.utils.set_random_seed(2)
    x = RNG.normal(size=(64, 4)).astype("f4")
    y = RNG.normal(size=(64, 1)).astype("f4")
    layers = [keras.Input((4,))] + [keras.layers.Dense(4, activation="tanh")
                                    for _ in range(11)] + [keras.layers.Dense(1)]
    m = keras.Sequential(layers)
    pipe = gradpipe.build({"transforms": CLIP_ADAM["transforms"]})
    m.compile(optimizer=pipe.keras_optimizer(), loss="mse")
    m.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert pipe.plan.pack.on
    m.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert loaded.optimizer.pipeline.plan.pack.on
    saved = pipe.named_variables()
    restored = loaded.optimizer.pipeline.named_variables()  # the model's name may differ
    assert len(restored) == len(saved) > 2 * 24
    for ours, theirs in zip(saved.values(), restored.values()):
        np.testing.assert_array_equal(theirs.numpy(), ours.numpy())
    m.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    loaded.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert_close([np.asarray(w) for w in loaded.get_weights()],
                 [np.asarray(w) for w in m.get_weights()], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_packed_fit_matches_keras_adam(jit):
    """12 Dense layers (24 variables), two epochs of fit, also inside a train step
    Keras compiles with XLA: Adam(global_clipnorm=1)'s weights within atol 1e-5."""
    x = RNG.normal(size=(64, 4)).astype("f4")
    y = RNG.normal(size=(64, 1)).astype("f4")

    def fitted(optimizer, jit_compile):
        keras.utils.set_random_seed(2)
        m = keras.Sequential([keras.Input((4,))] + [
            keras.layers.Dense(4, activation="tanh") for _ in range(11)] + [
            keras.layers.Dense(1)])
        m.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
        m.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        return [np.asarray(w) for w in m.get_weights()]

    pipe = gradpipe.build({"transforms": CLIP_ADAM["transforms"]})
    ours = fitted(pipe.keras_optimizer(), jit)
    assert pipe.plan.pack.on and int(pipe.iterations) == 8
    reference = fitted(keras.optimizers.Adam(0.05, global_clipnorm=1.0), False)
    assert_close(ours, reference, rtol=0, atol=1e-5)


def test_sparse_gradients_are_packed_dense_with_duplicate_rows_summed():
    """An embedding-style gradient (IndexedSlices, a repeated row) packed: the same
    step as per variable, where adam reads the gradient dense too."""
    def run(packed):
        variables = [tf.Variable(x) for x in INIT]
        pipe = gradpipe.build(_with(CLIP_ADAM, pack_variables=packed))
        for grads in SEQUENCE[:2]:
            tensors = [tf.constant(g) for g in grads]
            rows = tf.constant([0, 2, 0])  # row 0 twice: its values add up
            tensors[1] = tf.IndexedSlices(tf.gather(tensors[1], rows), rows,
                                          tf.constant(SHAPES[1], tf.int64))
            pipe.apply_gradients(zip(tensors, variables))
        return [v.numpy() for v in variables], pipe

    packed, pipe = run(True)
    per_variable, _ = run(False)
    assert pipe.plan.pack.on and SHAPES[1][0] > 3
    assert_close(packed, per_variable, rtol=1e-6, atol=1e-6)
    assert not np.array_equal(packed[1][0], INIT[1][0])  # the summed row moved
