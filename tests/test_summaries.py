"""TensorBoard summaries: the event files hold the expected tags and values."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from gradpipe import ConfigError


def events(logdir):
    found = defaultdict(list)
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                found[value.tag].append((event.step, float(tf.make_ndarray(value.tensor))))
                assert value.metadata.plugin_data.plugin_name == "scalars"
    return found


def test_event_files_hold_every_summary(tmp_path):
    var = tf.Variable([1.0, 2.0], name="x")
    pipe = gradpipe.build({
        "loss_scale": {"kind": "dynamic", "initial_loss_scale": 16.0},
        "pipeline": {"summaries": ["learning_rate", "hyperparameters", "loss_scale",
                                   "skipped_steps", "global_gradient_norm",
                                   "clipping_factors", "update_ratios"]},
        "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                       {"kind": "clippy_adagrad", "export_clipping_factors": True,
                        "learning_rate": {"kind": "linear", "start": 0.1, "end": 0.0,
                                          "steps": 4}}]})
    pipe.build([var])
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]))
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for g in ([3.0, 4.0], [np.nan, 1.0], [0.3, 0.4]):
            step(tf.constant(g) * pipe.loss_scale)
    writer.flush()
    found = events(tmp_path)
    # the rate each update used (0.1 at the first), at the count it reached
    assert [v for _, v in found["learning_rate"]] == pytest.approx([0.1, 0.075])
    assert [s for s, _ in found["learning_rate"]] == [1, 2]  # step = applied updates
    assert found["hyperparameters/transforms[1].learning_rate"] == found["learning_rate"]
    assert [v for _, v in found["global_gradient_norm"]] == pytest.approx([5.0, 0.5])
    assert [v for _, v in found["loss_scale"]] == [16.0, 8.0, 8.0]
    assert [v for _, v in found["skipped_steps"]] == [0.0, 1.0, 1.0]
    assert "clipping_factors/x" in found and "update_ratios/x" in found
    assert all(0 < v <= 1 for _, v in found["clipping_factors/x"])


def test_rules_per_variable_group_report_each_rate(tmp_path):
    """Rules at different rates: ``pipe.learning_rates`` gives each by path, and
    TensorBoard gets a curve per rule, not the first rule's rate for all."""
    kernel, bias = tf.Variable([1.0, 2.0], name="kernel"), tf.Variable([1.0], name="bias")
    pipe = gradpipe.build({
        "pipeline": {"summaries": ["learning_rate"]},
        "transforms": [{"kind": "sgd", "learning_rate": 0.5, "variables": ["kernel"]},
                       {"kind": "adam", "exclude": ["kernel"], "learning_rate": {
                           "kind": "linear", "start": 0.1, "end": 0.0, "steps": 4}}]})
    pipe.build([kernel, bias])
    step = tf.function(lambda: pipe.apply_gradients([(tf.ones(2), kernel), (tf.ones(1), bias)]))
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        step()
        step()
    writer.flush()
    rates = {path: float(rate) for path, rate in pipe.learning_rates.items()}
    assert rates == pytest.approx({"transforms[0]": 0.5, "transforms[1]": 0.05})  # next
    assert float(pipe.learning_rate) == 0.5  # the first rule's, as documented
    # setting an item would change no rule: an error that says why the rate is not settable
    with pytest.raises(gradpipe.GradpipeError, match=r"setting 'transforms\[0\]' would "
                       r"change none of them; this pipeline's rate cannot be set: "
                       r"transforms\[1\]\.learning_rate follows a schedule"):
        pipe.learning_rates["transforms[0]"] = 0.1
    found = events(tmp_path)
    assert "learning_rate" not in found
    assert [v for _, v in found["learning_rate/transforms[0]"]] == [0.5, 0.5]
    assert [v for _, v in found["learning_rate/transforms[1]"]] == pytest.approx([0.1, 0.075])


def test_nothing_written_without_a_writer(tmp_path):
    var = tf.Variable([1.0])
    pipe = gradpipe.build({"transforms": [{"kind": "sgd"}]})
    tf.function(lambda: pipe.apply_gradients([(tf.constant([1.0]), var)]),
                jit_compile=True)()  # no writer: summaries add no op, XLA is fine
    assert list(tmp_path.iterdir()) == []


def test_unknown_summary_is_a_config_error():
    with pytest.raises(ConfigError, match="did you mean 'loss_scale'") as info:
        gradpipe.parse({"pipeline": {"summaries": ["loss_scal"]},
                        "transforms": [{"kind": "sgd"}]})
    assert info.value.path == "pipeline.summaries"


def test_cli_run_resumes_from_checkpoint_dir(tmp_path, write_toml):
    from conftest import ROOT, gradpipe_command

    example = str(ROOT / "examples" / "quickstart.toml")
    base = ["run", example, "--json", "--checkpoint-dir", str(tmp_path / "ck"),
            "--checkpoint-every", "50"]
    first = gradpipe_command(*base, "--steps", "120")
    assert first.returncode == 0, first.stderr
    second = gradpipe_command(*base, "--steps", "300")
    summary = json.loads(second.stdout)
    assert summary["resumed_from_step"] == 120 and summary["applied_updates"] == 300
    straight = gradpipe_command("run", example, "--json", "--steps", "300")
    assert json.loads(straight.stdout)["final_loss"] == summary["final_loss"]
