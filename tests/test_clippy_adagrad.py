"""clippy_adagrad against TFRS ClippyAdagrad (run under legacy Keras in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import ROOT, assert_close
from gradpipe import ConfigError

MODES = {"default": {}, "clip_accumulator_update": {"clip_accumulator_update": True},
         "standard": {"use_standard_accumulator_update": True}}
BASE = {"learning_rate": 0.5, "initial_accumulator_value": 0.01,
        "variable_relative_threshold": 0.2, "accumulator_relative_threshold": 0.01,
        "absolute_threshold": 0.01, "epsilon": 1e-7}


def make_cases():
    rng = np.random.default_rng(11)
    cases = []
    for mode, flags in MODES.items():
        init = rng.normal(size=(4, 3)).round(3)
        dense = [{"values": (rng.normal(size=(4, 3)) * 3).round(3).tolist()} for _ in range(12)]
        sparse = [{"values": (rng.normal(size=(3, 3)) * 3).round(3).tolist(),
                   "indices": [int(i) for i in rng.choice([0, 2, 3], size=3)]}
                  for _ in range(12)]  # row 1 never touched; duplicates likely
        for kind, steps in (("dense", dense), ("sparse", sparse)):
            cases.append({"name": f"{mode}-{kind}", "params": {**BASE, **flags},
                          "init": init.tolist(), "steps": steps})
    return cases


CASES = make_cases()


@pytest.fixture(scope="module")
def tfrs_results():
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "references" /
                                                 "clippy_adagrad_tfrs.py")],
                            input=json.dumps(CASES), capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(zip([c["name"] for c in CASES], json.loads(result.stdout)))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_parity_with_tfrs(case, tfrs_results):
    """12 steps: variable, accumulator and every exported factor match (rtol 1e-5)."""
    expected = tfrs_results[case["name"]]
    var = tf.Variable(np.array(case["init"], "float32"), name="table")
    pipe = gradpipe.build({"transforms": [{"kind": "clippy_adagrad",
                                           "export_clipping_factors": True,
                                           **case["params"]}]})
    factors = []
    for step in case["steps"]:
        if "indices" in step:
            grad = tf.IndexedSlices(tf.constant(step["values"], tf.float32),
                                    tf.constant(step["indices"]), tf.constant([4, 3]))
        else:
            grad = tf.constant(step["values"], tf.float32)
        pipe.apply_gradients([(grad, var)])
        factors.append(float(pipe.transform_state("clippy_adagrad")["clipping_factor/table"]))
    state = pipe.transform_state("clippy_adagrad")
    assert_close(var.numpy(), expected["var"], rtol=1e-5, atol=1e-6)
    assert_close(state["accumulator/table"].numpy(), expected["accumulator"], rtol=1e-5,
                 atol=1e-6)
    assert_close(factors, expected["factors"], rtol=1e-5, atol=1e-7)
    assert min(factors) < 1.0  # the cases really clip


@pytest.mark.parametrize("mode, x, acc, s", [
    ("default", 0.9, 0.05, 0.500003),
    ("clip_accumulator_update", 0.9, 0.0200001, 0.500003),
    ("standard", 0.910557, 0.05, 1.0),
])
def test_seed_closed_form(mode, x, acc, s):
    """seed-semantics §3 case 3: x=[1], g=[.2], lr=.1, acc0=.01 (rtol 1e-5)."""
    var = tf.Variable([1.0], name="x")
    pipe = gradpipe.build({"transforms": [{"kind": "clippy_adagrad", "learning_rate": 0.1,
                                           "initial_accumulator_value": 0.01,
                                           "export_clipping_factors": True, **MODES[mode]}]})
    pipe.apply_gradients([(tf.constant([0.2]), var)])
    state = pipe.transform_state(0)
    assert float(var.numpy()[0]) == pytest.approx(x, rel=1e-5)
    assert float(state["accumulator/x"].numpy()[0]) == pytest.approx(acc, rel=1e-5)
    assert float(state["clipping_factor/x"]) == pytest.approx(s, rel=1e-5)


def test_both_accumulator_modes_is_the_reference_error():
    with pytest.raises(ConfigError, match=r"clip_accumulator_update and "
                       r"use_standard_accumulator_update cannot both be set to True\."):
        gradpipe.parse({"transforms": [{"kind": "clippy_adagrad", **MODES["standard"],
                                        "clip_accumulator_update": True}]})
