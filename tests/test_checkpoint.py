"""Checkpoints: exact restore, layout mismatches, crash and resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import ROOT
from gradpipe import GradpipeError

WORKER = str(ROOT / "tests" / "workers" / "crash_train.py")
TOTAL = 24


def train_once(ckpt_dir, kill_at, out):
    return subprocess.run([sys.executable, WORKER, str(ckpt_dir), str(TOTAL), str(kill_at),
                           str(out)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    result = train_once(tmp / "ckpt", -1, tmp / "out.json")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp / "out.json").read_text())


# Kill points drawn once from a seeded generator: a checkpoint boundary, just after
# one, and mid-window, so resumes replay 0, 1 and 2 steps.
KILL_POINTS = sorted(int(k) for k in np.random.default_rng(2024).choice(
    np.arange(2, TOTAL - 1), size=3, replace=False))


@pytest.mark.parametrize("kill_at", KILL_POINTS)
def test_sigkill_then_resume_is_bitwise_equal(kill_at, uninterrupted, tmp_path):
    """SIGKILL at a step, resume from the latest checkpoint: identical final state."""
    killed = train_once(tmp_path / "ckpt", kill_at, tmp_path / "out.json")
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "out.json").exists()
    resumed = train_once(tmp_path / "ckpt", -1, tmp_path / "out.json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result == uninterrupted  # bitwise: the JSON floats are exact reprs
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
