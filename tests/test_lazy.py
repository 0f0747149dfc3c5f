"""Lazy sparse updates for embedding tables: only the touched rows move."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import assert_close

LAZY_RULES = ["adam", "adamw", "nadam", "adamax", "lion"]
ROWS, DIM = 7, 3


def sparse(values, indices):
    return tf.IndexedSlices(tf.constant(values, tf.float32),
                            tf.constant(indices, tf.int64), tf.constant([ROWS, DIM], tf.int64))


def table_start():
    return np.random.default_rng(3).normal(size=(ROWS, DIM)).astype("float32")


def steps_of(rule, grads, variable, lazy=True, extra=None):
    pipe = gradpipe.build({"transforms": [{"kind": rule, "learning_rate": 0.1, "lazy": lazy,
                                           **(extra or {})}]})
    for g in grads:
        assert bool(pipe.apply_gradients([(g, variable)]))
    return pipe


@pytest.mark.parametrize("rule", LAZY_RULES)
def test_lazy_is_the_rule_on_the_touched_rows_and_leaves_the_others(rule):
    """Rows 1, 4 and 5 touched (row 4 twice: summed) three times: they move exactly as
    the dense rule moves a variable made of those rows alone; the others, and their
    slots, stay as they were."""
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(4, DIM)).astype("float32") for _ in range(3)]
    table = tf.Variable(table_start())
    pipe = steps_of(rule, [sparse(g, [1, 4, 5, 4]) for g in grads], table)
    rows = tf.Variable(table_start()[[1, 4, 5]])
    steps_of(rule, [tf.constant(np.stack([g[0], g[1] + g[3], g[2]])) for g in grads], rows,
             lazy=False)
    assert_close(table.numpy()[[1, 4, 5]], rows.numpy(), rtol=1e-6, atol=1e-7)
    untouched = [0, 2, 3, 6]
    np.testing.assert_array_equal(table.numpy()[untouched], table_start()[untouched])
    for name, slot in pipe.transform_state(rule).items():
        if slot.shape == (ROWS, DIM):
            np.testing.assert_array_equal(slot.numpy()[untouched], 0.0, err_msg=name)


@pytest.mark.parametrize("rule", LAZY_RULES)
def test_a_row_not_touched_this_step_does_not_move_unlike_dense(rule):
    """Row 2 touched at step 1 only: lazily it stays where step 1 left it; densely its
    moments still move it (the trade-off the docs state)."""
    first, second = sparse([[1.0, -1.0, 0.5]], [2]), sparse([[0.3, 0.2, -0.1]], [5])
    after_first = tf.Variable(table_start())
    steps_of(rule, [first], after_first)
    lazy, dense = tf.Variable(table_start()), tf.Variable(table_start())
    steps_of(rule, [first, second], lazy)
    steps_of(rule, [tf.convert_to_tensor(first), tf.convert_to_tensor(second)], dense,
             lazy=False)
    np.testing.assert_array_equal(lazy.numpy()[2], after_first.numpy()[2])
    assert not np.allclose(dense.numpy()[2], after_first.numpy()[2])


@pytest.mark.parametrize("rule", ["adam", "adagrad", "sgd"])
def test_a_nan_in_a_touched_row_skips_the_step_with_loss_scaling(rule):
    """Dynamic loss scaling and the finite guard see the rows: a NaN skips the whole
    step (weights, slots, counters as they were) and the scale backs off."""
    extra = {"lazy": True} if rule == "adam" else {}
    pipe = gradpipe.build({"loss_scale": {"kind": "dynamic", "initial_loss_scale": 1024.0},
                           "transforms": [{"kind": rule, "learning_rate": 0.1, **extra}]})
    table = tf.Variable(table_start())
    step = tf.function(lambda g: pipe.apply_gradients([(g, table)]))
    assert bool(step(sparse(np.full((2, DIM), 1024.0, "float32"), [0, 3])))
    before = {k: v.numpy().copy() for k, v in pipe.named_variables().items()}
    weights = table.numpy().copy()
    assert not bool(step(sparse([[1.0, np.nan, 1.0], [1.0, 1.0, 1.0]], [6, 3])))
    np.testing.assert_array_equal(table.numpy(), weights)
    for name, var in pipe.named_variables().items():
        if name == "skipped_steps":
            assert int(var.numpy()) == 1
        elif name.startswith("loss_scale/") and "scale" in name.rsplit("/", 1)[-1]:
            assert float(var.numpy()) == 512.0, name
        elif not name.startswith("loss_scale/"):
            np.testing.assert_array_equal(var.numpy(), before[name], err_msg=name)


def test_lazy_state_checkpoints_and_resumes(tmp_path):
    grads = [sparse([[0.1 * i, -0.2, 0.3]], [i % ROWS]) for i in range(1, 7)]
    whole = tf.Variable(table_start())
    steps_of("adam", grads, whole)
    table = tf.Variable(table_start())
    pipe = steps_of("adam", grads[:3], table)
    path = tf.train.Checkpoint(pipeline=pipe, table=table).save(str(tmp_path / "ckpt"))
    again = tf.Variable(np.zeros((ROWS, DIM), "float32"))
    resumed = gradpipe.build({"transforms": [{"kind": "adam", "learning_rate": 0.1,
                                              "lazy": True}]})
    resumed.build([again])
    tf.train.Checkpoint(pipeline=resumed, table=again).restore(path).assert_consumed()
    for g in grads[3:]:
        resumed.apply_gradients([(g, again)])
    np.testing.assert_array_equal(again.numpy(), whole.numpy())


def test_lazy_in_fit_with_an_embedding_layer():
    """Keras's Embedding gives IndexedSlices in fit; with a lazy rule, the row of token
    1 (first batch only) ends where the first batch left it."""
    import keras

    def model_after(samples, lazy):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((1,), dtype="int32"),
                                  keras.layers.Embedding(10, 4), keras.layers.Flatten(),
                                  keras.layers.Dense(1)])
        pipe = gradpipe.build({"transforms": [{"kind": "adam", "learning_rate": 0.1,
                                               "lazy": lazy}]})
        model.compile(optimizer=pipe.keras_optimizer(), loss="mse")
        x = np.array([[1], [2]][:samples], "int32")
        model.fit(x, np.ones((samples, 1), "float32"), batch_size=1, shuffle=False,
                  epochs=1, verbose=0)
        return model.layers[0].embeddings.numpy()

    once = model_after(1, lazy=True)
    twice = model_after(2, lazy=True)
    np.testing.assert_array_equal(twice[1], once[1])
    assert not np.array_equal(twice[2], once[2])
    np.testing.assert_array_equal(twice[[0, 3, 9]], once[[0, 3, 9]])
    dense_twice = model_after(2, lazy=False)
    assert not np.array_equal(dense_twice[1], once[1])


def test_lazy_under_mirrored_reduces_rows_without_densifying():
    """Two replicas touch different rows, replica 0 row 1 then row 2: the all-reduced
    gradient stays sparse (made dense, the second step would move row 1 by its
    moments) and the steps equal the single-device ones on the gathered rows."""
    from conftest import LOGICAL_CPUS

    assert LOGICAL_CPUS >= 2
    cpus = [f"/cpu:{i}" for i in range(2)]
    pipe = gradpipe.build({"placement": {"kind": "mirrored", "devices": cpus,
                                         "reduction": "sum"},
                           "transforms": [{"kind": "adam", "learning_rate": 0.1,
                                           "lazy": True}]})
    strategy = pipe.strategy
    with strategy.scope():
        table = tf.Variable(table_start())
    pipe.build([table])
    per_replica = [np.array([[1.0, 0.5, -0.5]], "float32"), np.array([[0.2, 0.1, 0.3]],
                                                                     "float32")]
    steps = [[[1], [4]], [[2], [4]]]  # per step, per replica: the rows touched

    def replica_step(rows):
        ctx = tf.distribute.get_replica_context()
        value = tf.gather(tf.constant(np.stack(per_replica)), ctx.replica_id_in_sync_group)
        index = tf.gather(rows, ctx.replica_id_in_sync_group)
        return pipe.apply_gradients([(tf.IndexedSlices(value, index,
                                                       tf.constant([ROWS, DIM], tf.int64)),
                                      table)])

    run = tf.function(lambda rows: strategy.run(replica_step, (rows,)))
    for rows in steps:
        run(tf.constant(rows, tf.int64))
    single = tf.Variable(table_start())
    steps_of("adam", [sparse(np.concatenate(per_replica), np.ravel(rows)) for rows in steps],
             single)
    after_first = tf.Variable(table_start())
    steps_of("adam", [sparse(np.concatenate(per_replica), [1, 4])], after_first)
    for copy in strategy.experimental_local_results(table):
        assert_close(copy.numpy(), single.numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(copy.numpy()[1], after_first.numpy()[1])
        np.testing.assert_array_equal(copy.numpy()[[0, 3, 5, 6]], table_start()[[0, 3, 5, 6]])


def test_sparse_gradients_that_a_rule_makes_dense_take_the_fused_path():
    """The engine traces the chain once to see whether it keeps rows: `adam` without
    `lazy` makes them dense anyway, so they are made dense up front and the step
    takes the path a dense gradient takes; a lazy rule keeps the plain path, rows."""
    grad = sparse([[1.0, 2.0, 3.0]], [2])
    paths = {}
    for lazy in (False, True):
        table = tf.Variable(table_start())
        pipe = gradpipe.build({"transforms": [{"kind": "adam", "lazy": lazy}]})
        pipe.build([table])
        paths[lazy] = pipe.path([(grad, table)])
        dense_path = pipe.path([(tf.convert_to_tensor(grad), table)])
    assert paths[False] == dense_path == "in place"  # adam's fused kernel
    assert paths[True].startswith("plain")


def test_ftrl_stays_dense_because_its_maths_moves_rows_no_gradient_touches():
    """Why `ftrl` is not updated row by row: with l2 shrinkage (and at its first step,
    which sets every row to its closed form) a row with a zero gradient moves, so a
    sparse gradient must step as its dense sum does, untouched rows included."""
    table = {"kind": "ftrl", "learning_rate": 0.1, "l2_shrinkage_regularization_strength": 0.1}
    grad = sparse([[0.5, -0.5, 1.0]], [1])
    sparse_var, dense_var = tf.Variable(table_start()), tf.Variable(table_start())
    for var, g in ((sparse_var, grad), (dense_var, tf.convert_to_tensor(grad))):
        pipe = gradpipe.build({"transforms": [table]})
        for _ in range(2):
            pipe.apply_gradients([(g, var)])
    assert not np.allclose(sparse_var.numpy()[3], table_start()[3])  # untouched, moved
    np.testing.assert_array_equal(sparse_var.numpy(), dense_var.numpy())


def embedding_model():
    import keras

    ids = keras.Input((3,), dtype="int32")
    x = keras.layers.Flatten()(keras.layers.Embedding(50, 4, name="emb")(ids))
    return keras.Model(ids, keras.layers.Dense(1, name="out")(x))


def plan_row(plan, name):
    return next(line for line in str(plan).splitlines() if line.startswith(name))


def test_the_plan_says_which_variables_update_by_rows_and_why():
    """`by rows` names the variables a sparse gradient updates by rows and the rule
    that keeps them, or the transform that makes them dense (issue: only
    `pipe.path` said so)."""
    rows = {}
    for name, transforms in {
        "lazy": [{"kind": "adam", "lazy": True}],
        "dense": [{"kind": "clip_by_global_norm", "clip_norm": 1.0}, {"kind": "adam"}],
        "mixed": [{"kind": "adam", "lazy": True, "variables": ["emb"]},
                  {"kind": "sgd", "momentum": 0.9, "exclude": ["emb"]}],
    }.items():
        pipe = gradpipe.build({"transforms": transforms})
        pipe.build(embedding_model().trainable_variables)
        rows[name] = plan_row(pipe.plan, "by rows")
    assert "yes: for every variable" in rows["lazy"]
    assert "(by adam at transforms[0] with lazy = true)" in rows["lazy"]
    # clip_by_global_norm keeps rows; adam without lazy is what makes them dense
    assert rows["dense"].endswith("no: a sparse gradient (an embedding lookup's) is made "
                                  "dense by adam at transforms[1] with lazy = false")
    assert "for 1 of 3 variables (emb/embeddings)" in rows["mixed"]
    assert rows["mixed"].endswith("the others would get a sparse gradient made dense, by sgd at "
                                  "transforms[1]")


def test_a_lazy_rule_is_never_packed_into_dense_maths():
    """Many small variables are packed into one vector by default, which makes rows
    dense: for a lazy rule that would change the maths silently, so the plan keeps
    the variables apart, says why, and a sparse step leaves untouched rows alone."""
    import keras

    ids = keras.Input((3,), dtype="int32")
    x = keras.layers.Flatten()(keras.layers.Embedding(50, 4, name="emb")(ids))
    for _ in range(20):
        x = keras.layers.Dense(4)(x)
    model = keras.Model(ids, x)
    for lazy in (False, True):
        pipe = gradpipe.build({"transforms": [{"kind": "adam", "lazy": lazy}]})
        pipe.build(model.trainable_variables)
        packed = plan_row(pipe.plan, "packed state")
        assert packed.split()[2] == ("no:" if lazy else "yes:"), packed
    assert "transform adam updates only the rows a sparse gradient touches" in packed
    assert "yes: for every variable" in plan_row(pipe.plan, "by rows")
    table = model.trainable_variables[0]
    before = table.numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.constant([[1, 2, 3]])))
    grads = tape.gradient(loss, model.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices)
    assert bool(pipe.apply_gradients(zip(grads, model.trainable_variables)))
    np.testing.assert_array_equal(table.numpy()[4:], before[4:])  # untouched rows
    assert not np.allclose(table.numpy()[1:4], before[1:4])
    with pytest.raises(gradpipe.GradpipeError, match="pack_variables = true, but transform "
                                                     "adam updates only the rows"):
        gradpipe.build({"pipeline": {"pack_variables": True},
                        "transforms": [{"kind": "adam", "lazy": True}]}
                       ).build(model.trainable_variables)


def test_a_transform_written_for_dense_gradients_gets_dense_ones():
    """A plugin written plainly (``0.9 * m + 0.1 * g``) fails on an IndexedSlices: the
    engine finds that out when it traces the chain, gives it the dense gradient
    instead (the same step as a dense gradient takes) and the plan names it."""
    from collections import namedtuple

    from conftest import register_transform
    from gradpipe.plugin import Capabilities, Transform, zeros_like_vars

    Momentum = namedtuple("Momentum", "m")

    def plain_momentum(cfg):
        def update(grads, state, variables):
            m = [0.9 * m + 0.1 * g for g, m in zip(grads, state.m)]
            return [-0.5 * mi for mi in m], Momentum(m)

        return Transform(lambda vs: Momentum(zeros_like_vars(vs)), update)

    register_transform("plain_momentum_for_rows", plain_momentum,
                       capabilities=Capabilities(update_rule=True))
    grad = sparse([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]], [2, 2])
    tables = []
    for g in (grad, tf.convert_to_tensor(grad)):
        tables.append(tf.Variable(table_start()))
        pipe = gradpipe.build({"transforms": [{"kind": "plain_momentum_for_rows"}]})
        for _ in range(2):
            assert bool(pipe.apply_gradients([(g, tables[-1])]))
    np.testing.assert_array_equal(tables[0].numpy(), tables[1].numpy())
    assert not np.allclose(tables[0].numpy(), table_start())
    pipe.build([tables[0]])
    assert plan_row(pipe.plan, "by rows").endswith(
        "made dense before the step: plain_momentum_for_rows at transforms[0] fails on "
        "one (TypeError), so it gets dense gradients")


def test_a_rule_that_keeps_rows_but_needs_every_gradient_keeps_them():
    """Whether the chain keeps rows is asked of it with the sparse gradients alone,
    the dense ones absent (one variable's maths traced, not every one's); a rule that
    reads every gradient fails so, and is asked again with all of them: its rows stay
    rows, as they did before the engine asked the shorter question."""
    from conftest import register_transform
    from gradpipe.plugin import Capabilities, Transform, no_state

    def rows_over_the_count_of_gradients(cfg):
        def update(grads, state, variables):
            count = tf.cast(tf.add_n([tf.size(g.values if isinstance(g, tf.IndexedSlices)
                                              else g) for g in grads]), tf.float32)
            return [tf.IndexedSlices(g.values / count, g.indices, g.dense_shape)
                    if isinstance(g, tf.IndexedSlices) else g / count for g in grads], state

        return Transform(no_state, update)

    register_transform("rows_over_the_count", rows_over_the_count_of_gradients,
                       capabilities=Capabilities(update_rule=True))
    table, bias = tf.Variable(table_start()), tf.Variable(tf.zeros([DIM]))
    pipe = gradpipe.build({"transforms": [{"kind": "rows_over_the_count"}]})
    grads = [sparse([[1.0, 2.0, 3.0]], [2]), tf.ones([DIM])]
    assert bool(pipe.apply_gradients(zip(grads, [table, bias])))
    # one row of 3 and a bias of 3: 6 elements (made dense, the table's 21 would count)
    expected = table_start()
    expected[2] -= np.array([1.0, 2.0, 3.0]) / 6
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(bias.numpy(), np.full(DIM, -1 / 6), rtol=1e-6)
