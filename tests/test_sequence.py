"""Large variables in sequence (gradpipe._engine.sequence): on a CPU the compiled step
runs each variable's loops together, one variable after another, and that order
changes no number.

The variables here are small; ``SEQUENCE_MIN_SIZE`` is lowered to order them.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from gradpipe._engine import sequence

SIZES = [3_000, 3_001, 3_002]  # distinct, so that each loop names its variable
CLIP_ADAM = {"loss_scale": {"kind": "dynamic", "initial_loss_scale": 1024.0,
                            "increment_period": 2},
             "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                            {"kind": "adam", "learning_rate": 0.05}],
             "pipeline": {"jit_compile": True}}


@pytest.fixture
def order_small(monkeypatch):
    monkeypatch.setattr(sequence, "SEQUENCE_MIN_SIZE", 1_000)


def _loop_order(table: dict) -> list[int]:
    """The variable each parameter-sized loop of the optimised HLO belongs to, in
    the order XLA runs them (the module is scheduled)."""
    variables = [tf.Variable(tf.zeros([n])) for n in SIZES]
    pipe = gradpipe.build(table)
    grads = [tf.ones([n]) for n in SIZES]
    pipe.apply_gradients(zip(grads, variables))
    assert pipe.plan.compile.on and pipe.plan.sequence.on
    hlo = pipe.compiled_hlo(zip(grads, variables))
    assert "is_scheduled=true" in hlo.splitlines()[0]
    # the update's loops are calls in one computation; other computations call fewer
    sizes = "|".join(map(str, SIZES))
    loops = [re.findall(rf"= f32\[({sizes})\]\{{0\}} fusion\(", computation)
             for computation in hlo.split("\n\n")]
    return [SIZES.index(int(n)) for n in max(loops, key=len)]


@pytest.mark.slow
def test_large_variables_run_their_loops_one_variable_after_another(order_small):
    assert _loop_order(CLIP_ADAM) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.slow
def test_small_variables_are_left_to_xla():
    """Below SEQUENCE_MIN_SIZE XLA orders the loops kind by kind (the order the
    sequence exists to change, so this also shows the test above can fail)."""
    order = _loop_order(CLIP_ADAM)
    assert sorted(order) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert order != [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.slow
def test_a_transform_that_mixes_variables_leaves_them_unordered(order_small):
    """Clipping Adam's updates by their global norm makes every variable's update
    depend on every gradient: no link can be made without a cycle, none is, and
    the step still compiles and runs."""
    table = {**CLIP_ADAM, "transforms": [{"kind": "adam", "learning_rate": 0.05},
                                         {"kind": "clip_by_global_norm", "clip_norm": 0.1}]}
    order = _loop_order(table)
    assert order != sorted(order)


def _run(table: dict, steps: list[list[np.ndarray]], init: list[np.ndarray]):
    variables = [tf.Variable(x) for x in init]
    pipe = gradpipe.build(table)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    applied = [bool(step([tf.constant(x) for x in g])) for g in steps]
    state = {k: v.numpy() for k, v in pipe.named_variables().items()}
    return [v.numpy() for v in variables], state, applied


def _steps(rng: np.random.Generator) -> list[list[np.ndarray]]:
    steps = []
    for poison in [None, None, "nan", None, "inf", None, None]:
        grads = [rng.normal(size=n).astype("f4") * 4096 for n in SIZES]
        if poison:
            grads[1][7] = np.nan if poison == "nan" else np.inf
        steps.append(grads)
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["finite", "one NaN weight"])
def test_the_order_changes_no_number(monkeypatch, weights):
    """Bit for bit, skipped steps included. A variable whose weights are already
    NaN (check_updates = false lets its step apply) passes nothing to the next
    one: the link multiplies by exactly one."""
    rng = np.random.default_rng(3)
    init = [rng.normal(size=n).astype("f4") for n in SIZES]
    table = CLIP_ADAM
    if weights != "finite":
        init[0][5] = np.nan
        table = {**CLIP_ADAM, "pipeline": {"jit_compile": True, "check_updates": False}}
    steps = _steps(rng)
    monkeypatch.setattr(sequence, "SEQUENCE_MIN_SIZE", 1_000)
    ordered = _run(table, steps, init)
    monkeypatch.setattr(sequence, "SEQUENCE_MIN_SIZE", 10**9)
    unordered = _run(table, steps, init)
    assert ordered[2] == unordered[2] == [True, True, False, True, False, True, True]
    for a, b in zip(ordered[0], unordered[0]):
        np.testing.assert_array_equal(a, b)
    assert ordered[1].keys() == unordered[1].keys()
    for name in ordered[1]:
        np.testing.assert_array_equal(ordered[1][name], unordered[1][name])
    if weights != "finite":
        assert np.isnan(ordered[0][0]).sum() == 1
        assert np.isfinite(ordered[0][1]).all() and np.isfinite(ordered[0][2]).all()
