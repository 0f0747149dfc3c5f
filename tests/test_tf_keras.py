"""pipe.keras_optimizer() under tf-keras (TF_USE_LEGACY_KERAS=1), in a subprocess.

tests/references/tf_keras_fit.py trains each case with tf-keras's (or TFRS's)
own optimizer and with a pipeline, and reports what it measured; these tests
hold the measurements to explicit tolerances.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "references" / "tf_keras_fit.py"),
         str(tmp_path_factory.mktemp("tf_keras"))],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.slow
def test_compile_takes_it_as_a_tf_keras_optimizer_with_adam_parity(measured):
    """tf-keras Adam(global_clipnorm=1) and clip + adam: the same weights after fit."""
    adam = measured["adam"]
    assert adam["is_tf_keras_optimizer"] and adam["compiled_is_ours"]
    assert adam["difference"] <= 1e-6 and adam["iterations"] == 16


def test_keras_file_round_trip_continues_identically(measured):
    saved = measured["save_load"]
    assert saved["same_spec"] and saved["iterations"] == 16
    assert saved["difference"] == 0.0


def test_checkpoint_restores_into_a_second_model_instance(measured):
    """tf-keras numbers the second instance's layers anew; the state still restores."""
    restored = measured["checkpoint"]
    assert restored["iterations"] == 16 and restored["difference"] == 0.0


def test_learning_rate_callbacks_set_the_rate_as_they_set_adams(measured):
    lr = measured["lr_callbacks"]
    assert lr["ours"] == lr["native"] and lr["ours"][-1] < lr["ours"][1] < lr["ours"][0]
    assert lr["current"][0] == lr["current"][1]
    assert lr["difference"] <= 1e-6


def test_mixed_float16_adds_tf_keras_loss_scaling_and_says_so(measured):
    """No [loss_scale]: the scaler tf-keras's compile would add, with its trajectory."""
    mixed = measured["mixed_no_overflow"]
    assert mixed["native_wrapper"] == "LossScaleOptimizerV3"
    assert mixed["our_scales"] == mixed["native_scales"] == [32768.0] * 16
    assert mixed["difference"] <= 1e-6 and mixed["toml_has_loss_scale"]
    assert len(mixed["warnings"]) == 1
    assert ('[loss_scale] kind = "dynamic", initial_loss_scale = 32768.0, '
            "increment_period = 2000, min_loss_scale = 1.0") in mixed["warnings"][0]


def test_skipped_steps_follow_gradpipe_not_tf_keras(measured):
    """The scale backs off on the same steps. tf-keras's LossScaleOptimizer advances
    the inner optimizer's iterations on a skipped step (Adam's bias correction then
    counts it); gradpipe, like Keras 3, advances nothing on a skipped step."""
    mixed = measured["mixed_overflow"]
    assert mixed["our_scales"] == mixed["native_scales"]
    assert mixed["our_scales"][:8] == [2.0**k for k in range(14, 6, -1)]
    assert mixed["native_iterations"] == 16
    assert mixed["our_iterations"] == 8 and mixed["skipped"] == 8


def test_fit_under_mirrored_equals_one_device(measured):
    mirrored = measured["mirrored"]
    assert mirrored["iterations"] == 16 and mirrored["difference"] <= 1e-5


def test_tfrs_ranking_model_with_clippy_adagrad_matches_tfrs(measured):
    """A TFRS ranking model (embeddings: sparse gradients) trained by fit with
    clippy_adagrad ends where TFRS's ClippyAdagrad ends."""
    ranking = measured["tfrs"]
    assert ranking["difference"] <= 1e-6 * max(1.0, ranking["largest_weight"])
    assert ranking["our_loss"] == pytest.approx(ranking["native_loss"], rel=1e-6)
    assert ranking["our_loss"][-1] < ranking["our_loss"][0]


@pytest.mark.slow
def test_a_new_process_loads_a_tf_keras_model_after_import_gradpipe_alone(tmp_path):
    """Under tf-keras too, `import gradpipe` is all a loading script needs."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    path = str(tmp_path / "m.keras")
    save = f"""
import numpy as np, tensorflow as tf, gradpipe
m = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
m.compile(optimizer=gradpipe.build({{"transforms": [{{"kind": "adam"}}]}}).keras_optimizer(),
          loss="mse")
m.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=4, verbose=0)
m.save({path!r})
"""
    load = f"""
import sys, gradpipe, tensorflow as tf
m = tf.keras.models.load_model({path!r})
assert type(m.optimizer).__module__ == "gradpipe._engine.tf_keras_adapter", type(m.optimizer)
assert int(m.optimizer.iterations.numpy()) == 2
assert "gradpipe.keras" not in sys.modules
"""
    for code in (save, load):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
