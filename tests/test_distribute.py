"""Placements on logical CPU devices (MirroredStrategy) and two local workers (MWMS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import forked
import gradpipe
from conftest import ROOT, assert_close, free_ports
from gradpipe import ConfigError, PlacementError
from gradpipe.distribute import validate_group_assignment

CPUS = [f"/cpu:{i}" for i in range(4)]


def per_replica(strategy, values):
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(values[ctx.replica_id_in_sync_group]))


def local(strategy, value):
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


class TestGroupAssignment:
    @pytest.mark.parametrize("groups, message", [
        (((0, 1), (2, 3)), "must be a list of lists"),
        ([[0, 1, 2], [3]], "The size of each subgroup in `group_assignment` must be equal"),
        ([[0, 1]], "must be a permutation of range(4)"),
        ([[0, 0], [1, 1], [2, 2], [3, 3]], "more than once"),  # the reference accepts it
    ])
    def test_validation_errors(self, groups, message):
        with pytest.raises(PlacementError) as info:
            validate_group_assignment(groups, 4)
        assert message in str(info.value)

    def test_empty_means_no_groups(self):
        assert validate_group_assignment([], 4) is None

    def test_in_toml(self):
        with pytest.raises(ConfigError, match="must be equal") as info:
            gradpipe.parse({"placement": {"kind": "mirrored", "devices": CPUS,
                                          "group_assignment": [[0, 1, 2], [3]]},
                            "transforms": [{"kind": "sgd"}]})
        assert info.value.path == "placement.group_assignment"


@pytest.mark.parametrize("groups, expected", [
    (None, [[10.0], [10.0], [10.0], [10.0]]),
    ([[0, 1], [2, 3]], [[3.0], [3.0], [7.0], [7.0]]),
    ([[0, 3], [1, 2]], [[5.0], [5.0], [5.0], [5.0]]),
])
def test_grouped_reduction_gives_each_replica_its_group(groups, expected):
    """Replica i receives the sum of its own group's gradients (no groups: all)."""
    table = {"kind": "mirrored", "devices": CPUS}
    if groups:
        table["group_assignment"] = groups
    placement = gradpipe.create("placement", table)
    strategy = placement.strategy
    grads = per_replica(strategy, [[1.0], [2.0], [3.0], [4.0]])
    out = tf.function(lambda g: strategy.run(lambda x: placement.reduce([x])[0], (g,)))(grads)
    assert [v.tolist() for v in local(strategy, out)] == expected


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_update_is_the_mean_or_sum(replicas, reduction):
    """loss_r = c_r . w; SGD(1): w moves by -mean(c) (mean) or -sum(c) (sum)."""
    pipe = gradpipe.build({"placement": {"kind": "mirrored", "devices": CPUS[:replicas],
                                         "reduction": reduction},
                           "transforms": [{"kind": "sgd", "learning_rate": 1.0}]})
    strategy = pipe.strategy
    with strategy.scope():
        w = tf.Variable([0.0, 0.0])
    pipe.build([w])
    coefficients = [[float(i + 1), float(-2 * i)] for i in range(replicas)]

    def step(c):
        with tf.GradientTape() as tape:
            loss = pipe.scale_loss(tf.reduce_sum(c * w))
        return pipe.apply_gradients([(tape.gradient(loss, w), w)])

    tf.function(lambda c: strategy.run(step, (c,)))(per_replica(strategy, coefficients))
    combine = np.mean if reduction == "mean" else np.sum
    expected = -combine(np.array(coefficients), axis=0)
    for copy in local(strategy, w):
        assert_close(copy, expected, rtol=1e-6, atol=1e-6)


def test_groups_that_would_diverge_are_refused():
    pipe = gradpipe.build({"placement": {"kind": "mirrored", "devices": CPUS,
                                         "group_assignment": [[0, 1], [2, 3]]},
                           "transforms": [{"kind": "sgd"}]})
    with pipe.strategy.scope():
        w = tf.Variable([0.0])
    with pytest.raises(PlacementError, match="would receive different updates"):
        pipe.build([w])


def linear_problem():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(8, 16, 3)).astype("f4")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "f4") + 0.3
    return x, y


TABLE = {"loss_scale": {"kind": "dynamic", "initial_loss_scale": 256.0},
         "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                        {"kind": "adam", "learning_rate": 0.05}]}


def train(placement, x, y, *, lazy=False, function=True):
    """Train on (x, y); ``lazy``: the first apply_gradients, inside strategy.run,
    builds the pipeline; ``function``: the replica step runs in a tf.function."""
    pipe = gradpipe.build({**TABLE, "placement": placement})
    strategy = pipe.strategy
    with strategy.scope():
        w = tf.Variable(tf.zeros([3, 1]))
        b = tf.Variable(0.0)
    if not lazy:
        pipe.build([w, b])
    n = strategy.num_replicas_in_sync

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = pipe.scale_loss(tf.reduce_mean(tf.square(xb @ w + b - yb)))
        grads = tape.gradient(loss, [w, b])
        return pipe.apply_gradients(zip(grads, [w, b]))

    def run(xb, yb):
        return strategy.run(step, (xb, yb))

    run = tf.function(run) if function else run
    for xs, ys in zip(x, y):
        run(per_replica(strategy, np.split(xs, n)), per_replica(strategy, np.split(ys, n)))
    return pipe, strategy, w, b


@pytest.mark.slow
@pytest.mark.parametrize("function", [True, False], ids=["tf.function", "eager"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("replicas", [2, 4])
def test_first_apply_inside_strategy_run_builds_the_pipeline(replicas, reduction, function):
    """A pipeline never built, first used inside strategy.run (as Keras 3 optimizers
    are), ends bit for bit where one built beforehand ends."""
    x, y = linear_problem()
    placement = {"kind": "mirrored", "devices": CPUS[:replicas], "reduction": reduction}
    lazy, strategy, w, b = train(placement, x, y, lazy=True, function=function)
    _, _, w0, b0 = train(placement, x, y, function=function)
    for copy, copy0 in zip(local(strategy, w), local(strategy, w0)):
        assert_close(copy, copy0, rtol=0, atol=0)
    assert_close(local(strategy, b), local(strategy, b0), rtol=0, atol=0)
    assert int(lazy.iterations.numpy()) == len(x)
    assert lazy.layout()["slots/1_adam/mu/Variable"] == [3, 1]


def test_a_pipeline_made_outside_a_strategy_scope_says_so_when_built_inside():
    """Made outside the scope, built inside it: TensorFlow's "Must not nest
    tf.distribute.Strategy scopes" becomes an error that says where to make it, and
    nothing is created."""
    from gradpipe.errors import PlacementError

    pipe = gradpipe.build({"transforms": [{"kind": "adam"}]})
    strategy = tf.distribute.MirroredStrategy(CPUS[:2])
    with strategy.scope():
        w = tf.Variable([1.0, 2.0])
        with pytest.raises(PlacementError, match=r"this pipeline was made for _DefaultDistri"
                           r"butionStrategy .* but is built in MirroredStrategy's scope: "
                           r"make the pipeline .* inside `with strategy.scope\(\):`"):
            pipe.build([w])
    assert not [name for name in pipe.named_variables() if name.startswith("slots/")]


def test_mirrored_pipeline_equals_single_device_on_the_whole_batch():
    """clip + dynamic scale + adam on 2 replicas == 1 device on the concatenated batch."""
    x, y = linear_problem()
    pipe, strategy, w, b = train({"kind": "mirrored", "devices": CPUS[:2]}, x, y)
    _, _, w1, b1 = train({"kind": "default"}, x, y)
    copies = local(strategy, w)
    assert_close(copies[0], copies[1], rtol=0, atol=0)  # copies never diverge
    assert_close(copies[0], w1.numpy(), rtol=1e-5, atol=1e-6)
    assert_close(local(strategy, b)[0], b1.numpy(), rtol=1e-5, atol=1e-6)
    assert int(pipe.iterations.numpy()) == len(x)


def test_inf_on_one_replica_skips_every_replica():
    pipe = gradpipe.build({**TABLE, "placement": {"kind": "mirrored", "devices": CPUS[:2]}})
    strategy = pipe.strategy
    with strategy.scope():
        w = tf.Variable([1.0, 2.0])
    pipe.build([w])
    step = tf.function(lambda g: strategy.run(
        lambda x: pipe.apply_gradients([(x, w)]), (g,)))
    applied = step(per_replica(strategy, [[0.1, 0.1], [np.inf, 0.1]]))
    assert [bool(a) for a in local(strategy, applied)] == [False, False]
    for copy in local(strategy, w):
        np.testing.assert_array_equal(copy, [1.0, 2.0])
    assert [float(s) for s in local(strategy, pipe.loss_scaler.current_loss_scale)] == \
        [128.0, 128.0]
    assert int(pipe.skipped_steps.numpy()) == 1


def test_clip_before_reduce_clips_each_replica():
    """clip_before_reduce: each replica's gradient is clipped, then the clipped ones summed."""
    def moved(clip_before):
        pipe = gradpipe.build({
            "placement": {"kind": "mirrored", "devices": CPUS[:2], "reduction": "sum",
                          "clip_before_reduce": clip_before},
            "transforms": [{"kind": "clip_by_norm", "clip_norm": 1.0},
                           {"kind": "sgd", "learning_rate": 1.0}]})
        with pipe.strategy.scope():
            w = tf.Variable([0.0, 0.0])
        pipe.build([w])
        tf.function(lambda g: pipe.strategy.run(lambda x: pipe.apply_gradients([(x, w)]),
                                                (g,)))(per_replica(pipe.strategy,
                                                                   [[3.0, 4.0], [3.0, 4.0]]))
        return -local(pipe.strategy, w)[0]

    assert_close(moved(False), [0.6, 0.8], rtol=1e-6, atol=1e-6)   # clip the sum [6, 8]
    assert_close(moved(True), [1.2, 1.6], rtol=1e-6, atol=1e-6)    # sum of clipped [.6, .8]


def test_auto_reports_its_choice():
    placement = gradpipe.create("placement", {"kind": "auto"})
    assert placement.description.startswith("auto chose ")


def test_missing_gpu_is_a_placement_error():
    with pytest.raises(PlacementError, match="asks for GPU 7"):
        gradpipe.create("placement", {"kind": "gpu", "device": 7})


@pytest.mark.slow
@pytest.mark.parametrize("lazy", [False, True], ids=["built", "built-on-first-apply"])
def test_multi_worker_two_processes(tmp_path, lazy):
    """Two workers on localhost end identical, and equal a single run on the global
    batch, whether the pipeline is built beforehand or by its first apply_gradients."""
    script = str(ROOT / "tests" / "workers" / "multi_worker_train.py")
    flags = ["--lazy"] if lazy else []
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = []
    for index in range(2):
        env = {**os.environ, "TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})}
        procs.append(forked.Popen([sys.executable, script, *flags,
                                   str(tmp_path / f"{index}.json")],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    single = forked.run([sys.executable, script, "--single", str(tmp_path / "single.json")],
                        capture_output=True, text=True, timeout=240)
    assert single.returncode == 0, single.stderr[-3000:]
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    reference = json.loads((tmp_path / "single.json").read_text())
    assert results[0]["replicas"] == 2 and results[0]["iterations"] == 25
    assert results[0]["w"] == results[1]["w"] and results[0]["b"] == results[1]["b"]
    assert_close(results[0]["w"], reference["w"], rtol=1e-5, atol=1e-6)
    assert_close(results[0]["b"], reference["b"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_cli_run_with_mirrored_placement(write_toml):
    path = write_toml("""
        [placement]
        kind = "mirrored"
        logical_cpus = 2

        [problem]
        kind = "quadratic"

        [[transforms]]
        kind = "adam"
        learning_rate = 0.05
    """)
    result = forked.run([sys.executable, "-m", "gradpipe.cli", "run", str(path), "--json"],
                        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["replicas"] == 2 and summary["target_reached"] is True
    override = forked.run([sys.executable, "-m", "gradpipe.cli", "run", str(path), "--json",
                           "--placement", "cpu", "--steps", "20"],
                          capture_output=True, text=True, timeout=300)
    assert json.loads(override.stdout)["placement"] == "cpu:0"
