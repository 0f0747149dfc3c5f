"""Checkpoints: exact restore, layout mismatches, crash and resume."""

from __future__ import annotations

import json
import signal
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import forked
import gradpipe
from conftest import ROOT, gradpipe_command
from gradpipe import GradpipeError

WORKER = str(ROOT / "tests" / "workers" / "crash_train.py")
TOTAL = 24


def train_once(ckpt_dir, kill_at, out):
    return forked.run([sys.executable, WORKER, str(ckpt_dir), str(TOTAL), str(kill_at),
                       str(out)], capture_output=True, text=True, timeout=300)


# Kill points: just after a checkpoint (every 3 steps), one step after and two steps
# after one, so the resumes replay 0, 1 and 2 steps.
KILL_POINTS = (3, 7, 17)


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_equal(tmp_path):
    """SIGKILL at each kill point in turn, each run resumed from the latest checkpoint
    the one before left: the final state equals an uninterrupted run's, bit for bit."""
    full = train_once(tmp_path / "full", -1, tmp_path / "full.json")
    assert full.returncode == 0, full.stderr[-3000:]
    for kill_at in KILL_POINTS:
        killed = train_once(tmp_path / "ckpt", kill_at, tmp_path / "out.json")
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr[-3000:])
        assert not (tmp_path / "out.json").exists()
        latest = tf.train.latest_checkpoint(str(tmp_path / "ckpt"))  # the next resumes here
        assert latest.endswith(f"ckpt-{kill_at // 3 * 3}"), latest
    resumed = train_once(tmp_path / "ckpt", -1, tmp_path / "out.json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result == json.loads((tmp_path / "full.json").read_text())  # exact reprs
    assert result["skipped"] > 0 and result["iterations"] < TOTAL


TABLE = {"loss_scale": {"kind": "dynamic", "initial_loss_scale": 64.0},
         "pipeline": {"accumulation_steps": 2},
         "schedules": {"lr": {"kind": "linear", "start": 0.1, "end": 0.01, "steps": 10}},
         "transforms": [{"kind": "adam", "learning_rate": "@lr"}]}


def trained(table, steps=5):
    var = tf.Variable([1.0, -1.0], name="x")
    pipe = gradpipe.build(table)
    pipe.build([var])
    for i in range(steps):
        pipe.apply_gradients([(tf.constant([0.3 * (i + 1), -0.2]) * pipe.loss_scale, var)])
    return pipe, var


def test_every_piece_of_state_restores_exactly(tmp_path):
    pipe, _ = trained(TABLE)
    path = tf.train.Checkpoint(pipeline=pipe).save(str(tmp_path / "ck"))
    clone, _ = trained(TABLE, steps=0)
    clone.restore(path)
    for name, value in pipe.named_variables().items():
        np.testing.assert_array_equal(clone.named_variables()[name].numpy(), value.numpy(),
                                      err_msg=name)
    assert int(clone.iterations.numpy()) == 2 and float(clone.loss_scale) == 64.0
    assert any(n.startswith("accumulators/") for n in clone.named_variables())


def test_a_different_pipeline_is_refused_naming_the_difference(tmp_path):
    pipe, _ = trained(TABLE)
    path = tf.train.Checkpoint(pipeline=pipe).save(str(tmp_path / "ck"))
    other, _ = trained({**TABLE, "transforms": [{"kind": "sgd", "momentum": 0.9}]}, steps=0)
    with pytest.raises(GradpipeError, match="written by a different pipeline") as info:
        other.restore(path)
    message = str(info.value)
    assert "slots/0_adam/mu/x" in message and "slots/0_sgd/momentum/x" in message


def test_restore_needs_a_gradpipe_checkpoint(tmp_path):
    path = tf.train.Checkpoint(v=tf.Variable(1.0)).save(str(tmp_path / "ck"))
    pipe, _ = trained(TABLE, steps=0)
    with pytest.raises(GradpipeError, match="holds no gradpipe pipeline"):
        pipe.restore(path)


# -- restoring into a second instance of a Keras model ---------------------------

RNG = np.random.default_rng(4)
X = RNG.normal(size=(64, 4)).astype("f4")
Y = X.sum(axis=1, keepdims=True)
CLIP_ADAM = {"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                            {"kind": "adam", "learning_rate": 0.01}]}


def keras_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1)])


def optimizer_for(which):
    if which == "keras":
        return keras.optimizers.Adam(0.01, global_clipnorm=1.0)
    return gradpipe.build(CLIP_ADAM)


def train_steps(model, optimizer, start, stop):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for i in range(start, stop):
        step(X[8 * i:8 * (i + 1)], Y[8 * i:8 * (i + 1)])


@pytest.mark.parametrize("built", [True, False], ids=["built-before-restore",
                                                      "built-after-restore"])
@pytest.mark.parametrize("which", ["keras", "gradpipe"])
def test_restore_into_a_second_instance_of_the_model(which, built, tmp_path):
    """A custom loop saves with a CheckpointManager and restores into a second instance
    of the same model, in the same process: Keras numbers its layers anew
    (sequential_1.dense_2.kernel), yet the optimizer state restores exactly, as Keras's
    Adam does, whether it exists before the restore or is built after it."""
    reference, reference_opt = keras_model(), optimizer_for(which)
    train_steps(reference, reference_opt, 0, 8)
    first, first_opt = keras_model(), optimizer_for(which)
    train_steps(first, first_opt, 0, 4)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=first, optimizer=first_opt), str(tmp_path), max_to_keep=2)
    manager.save()
    second, second_opt = keras_model(), optimizer_for(which)
    if built:
        second_opt.build(second.trainable_variables)
    tf.train.Checkpoint(model=second, optimizer=second_opt).restore(manager.latest_checkpoint)
    train_steps(second, second_opt, 4, 8)
    for ours, theirs in zip(second.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    if which == "gradpipe":  # the names differed, and were matched
        assert not set(second_opt.named_variables()) & {
            n for n in first_opt.named_variables() if "dense" in n}
        assert int(second_opt.iterations.numpy()) == 8


@pytest.mark.parametrize("built", [True, False],
                         ids=["built-before-restore", "built-after-restore"])
def test_a_plain_checkpoint_restore_of_another_pipeline_is_a_loud_error(built, tmp_path):
    """No assert_consumed() needed: the state of a different pipeline is never silently
    left fresh. Built: the restore raises; not yet: the build that would use it does."""
    pipe, _ = trained(TABLE)
    path = tf.train.Checkpoint(pipeline=pipe).save(str(tmp_path / "ck"))
    other = gradpipe.build({**TABLE, "transforms": [{"kind": "sgd", "momentum": 0.9}]})
    fresh = tf.Variable([1.0, -1.0], name="x")
    if built:
        other.build([fresh])
    restore = tf.train.Checkpoint(pipeline=other)
    message = (r"written by a different pipeline: missing from the saved state: "
               r"learning_rate, slots/0_sgd/momentum/x; saved but not in this pipeline: "
               r"slots/0_adam/count, slots/0_adam/mu/x, slots/0_adam/nu/x")
    with pytest.raises(GradpipeError, match=message):
        restore.restore(path)
        other.apply_gradients([(tf.constant([0.1, 0.1]), fresh)])


def test_a_checkpoint_of_an_older_state_layout_is_a_loud_error(tmp_path):
    """Before 0.2 the state was saved in nested tables (_state/slots/<transform>/...);
    such a checkpoint's values cannot be paired, and saying so beats a fresh start."""
    pipe, _ = trained(TABLE, steps=0)

    class Layout(tf.train.experimental.PythonState):
        def serialize(self):
            return json.dumps(pipe.layout())

        def deserialize(self, value):
            del value

    old = tf.Module()
    old._layout = Layout()
    old._iterations, old._skipped, old._micro_steps = (tf.Variable(0, dtype=tf.int64)
                                                       for _ in range(3))
    old._state = tf.Module()
    old._state.slots = {"0_adam": {name.split("/", 2)[2]: tf.Variable(value)
                                   for name, value in pipe.named_variables().items()
                                   if name.startswith("slots/")}}
    old._state.accumulators = {"x": tf.Variable([0.0, 0.0])}
    old.loss_scaler = pipe.loss_scaler
    path = tf.train.Checkpoint(pipeline=old).save(str(tmp_path / "old"))
    with pytest.raises(GradpipeError, match=(
            r"lists accumulators/x, slots/0_adam/count, slots/0_adam/mu/x, slots/0_adam/nu/x "
            r"in its layout but holds no value for them: it was written in another layout "
            r"of the state \(an older gradpipe\)")):
        pipe.restore(path)


def test_cli_resume_with_another_pipeline_names_the_difference(tmp_path, write_toml):
    """gradpipe run --checkpoint-dir resumes by name; another pipeline's directory is
    a clear error before any step, not a raw traceback or a fresh start."""
    ckpt = str(tmp_path / "ck")
    adam = write_toml("""
        [problem]
        kind = "quadratic"

        [[transforms]]
        kind = "adam"
        learning_rate = 0.05
    """, "adam.toml")
    sgd = write_toml("""
        [problem]
        kind = "quadratic"

        [[transforms]]
        kind = "sgd"
        learning_rate = 0.05
        momentum = 0.9
    """, "sgd.toml")
    run = ["run", "--steps", "20", "--checkpoint-dir", ckpt]
    first = gradpipe_command(*run, adam)
    assert first.returncode == 0, first.stderr
    other = gradpipe_command(*run, sgd)
    assert other.returncode != 0
    assert "written by a different pipeline" in other.stderr
    assert "slots/0_sgd/momentum/x" in other.stderr and "Traceback" not in other.stderr
