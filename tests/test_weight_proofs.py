"""``lamb``, ``adafactor``, ``adamw``, optax's ``fromage`` and TF Addons'
``conditional_gradient`` proved finite from their input's and weights' norms.

``lamb``'s trust ratio ``||w|| / ||u||`` is unbounded where ``||u||`` is tiny,
but ``ratio * |u_i|`` never exceeds ``||w||``: the proof requires the rate
times ``2**76 ||w||`` (the ratio's largest value) and the rate times the
direction's bound (the ratio at 1) below the float32 maximum; ``fromage``'s ratio
``||w|| / max(||g||, min_norm)`` likewise. ``adafactor``'s
step scales with ``rms(w)``, which overflows with ``||w||**2``. Where a
condition fails, the step is checked, not skipped. Each path is held to the
maths checked as a third party's (``checked_copy``): the same steps applied,
the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import PROOF_PATHS as PATHS
from conftest import checked_copy

SCHEDULE = {"lr": {"kind": "linear", "start": 0.1, "end": 0.0, "steps": 10}}


@pytest.mark.parametrize("options, proved", [
    ({}, True),
    ({"learning_rate": "@lr", "beta_1": "@lr"}, True),  # each step requires its own
    ({"learning_rate": 1e10}, True),  # 1e10 * 2**64 / (0.1 * 1e-7) = 1.8e37
    ({"learning_rate": 1e12}, False),  # 1.8e39: the direction alone may overflow
    ({"epsilon": 0.0}, False),  # 0 / 0 where both moments are 0
    ({"beta_1": 0.99999999}, False),  # 1.0 in float32: 1 - beta_1**t is 0
    ({"beta_2": 0.9999995}, False),  # less than 2**-20 below 1 in float32
])
def test_lambs_outputs_are_proved_only_where_its_bound_holds(options, proved):
    pipe = gradpipe.build({"schedules": SCHEDULE, "transforms": [{"kind": "lamb", **options}]})
    pipe.build([tf.Variable([1.0])])
    assert ("lamb at transforms[0]: proved from its input's norm and its weights' norm"
            in pipe.plan.checks[0]) is proved, pipe.plan.checks[0]


def _run(kind: str, path: str, init: list[np.ndarray], grads: list[list[np.ndarray]],
         **options: object):
    variables = [tf.Variable(x) for x in init]
    pipe = gradpipe.build({"pipeline": {"jit_compile": path != "plain"}, "transforms": [
        *PATHS[path], {"kind": kind, "learning_rate": 0.01, **options}]})
    pipe.build(variables)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    applied = [bool(step([tf.constant(x) for x in g])) for g in grads]
    return applied, [v.numpy() for v in variables], pipe.plan


@pytest.mark.parametrize("path", PATHS)
def test_a_step_whose_trust_ratio_would_overflow_is_skipped_as_a_check_skips_it(path):
    """Weights of norm 1e30 with a gradient of 1e-20: ``||u||`` is about 5e-13, the
    ratio 2e42, past the float32 maximum, and the update infinite. The proof skips
    that step, as the check does; the steps before and after it (ordinary weights,
    then a weight near the largest a step at 0.01 allows) apply on both."""
    init = [np.full((6, 4), 0.5, "f4"), np.zeros(4, "f4"), np.full((6, 4), 0.5, "f4")]
    ordinary = [np.ones((6, 4), "f4"), np.ones(4, "f4"), np.ones((6, 4), "f4")]
    tiny = [np.full((6, 4), 1e-20, "f4"), np.ones(4, "f4"), np.ones((6, 4), "f4")]
    runs = []
    for kind in ("lamb", checked_copy("lamb")):
        first = _run(kind, path, init, [ordinary])
        huge = [w.copy() for w in first[1]]
        huge[0][0, 0] = 1e30  # ||w|| 1e30: the rate times 2**76 ||w|| overflows
        runs.append((first, _run(kind, path, huge, [tiny, ordinary])))
    (proved_first, proved), (checked_first, checked) = runs
    assert "lamb at transforms[-1]: proved" in str(proved[2].checks).replace(
        f"transforms[{len(PATHS[path])}]", "transforms[-1]")
    assert "proved" not in checked[2].checks[-1]
    assert str(proved[2].per_variable).startswith("yes") == (path == "per-variable")
    assert proved_first[0] == checked_first[0] == [True]
    for a, b in zip(proved_first[1], checked_first[1]):
        np.testing.assert_array_equal(a, b)
    assert checked[0][0] is False and proved[0][0] is False  # skipped by both
    assert proved[0][1] == checked[0][1]
    for a, b in zip(proved[1], checked[1]):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", PATHS)
def test_a_tiny_direction_on_ordinary_weights_applies_with_its_large_ratio(path):
    """The same tiny gradient on weights of norm about 2.4: a ratio near 5e12 that the
    proof allows, and an update of the weights' own size, as the check computes it."""
    init = [np.full((6, 4), 0.5, "f4"), np.zeros(4, "f4"), np.full((6, 4), 0.5, "f4")]
    tiny = [np.full((6, 4), 1e-20, "f4"), np.ones(4, "f4"), np.ones((6, 4), "f4")]
    results = [_run(kind, path, init, [tiny, tiny])
               for kind in ("lamb", checked_copy("lamb"))]
    assert results[0][0] == results[1][0] == [True, True]
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
    # each step moves the weights by lr * ||w|| / sqrt(24): by 0.005
    np.testing.assert_allclose(results[0][1][0], init[0] - 0.01, rtol=1e-3)


@pytest.mark.parametrize("options, proved", [
    ({}, True),
    ({"learning_rate": "@lr", "weight_decay": "@lr"}, True),  # each step requires its own
    ({"learning_rate": 1e30, "epsilon_1": 1.0}, True),  # required at each step
    ({"epsilon_1": 0.0}, False),  # 0 / 0 where a gradient and its moment are 0
])
def test_adafactors_outputs_are_proved_only_where_its_bound_holds(options, proved):
    pipe = gradpipe.build({"schedules": SCHEDULE,
                           "transforms": [{"kind": "adafactor", **options}]})
    pipe.build([tf.Variable([1.0])])
    assert ("adafactor at transforms[0]: proved from its input's norm, its state's largest "
            "element and its weights' norm" in pipe.plan.checks[0]) is proved
    assert ("; variables of rank 2 or more are checked" in pipe.plan.checks[0]) is proved


@pytest.mark.parametrize("path", PATHS)
def test_adafactor_skips_the_step_whose_weights_rms_overflows_as_a_check_skips_it(path):
    """Vectors (adafactor's full second moment): an ordinary step applies on both;
    then a weight of 3e19, whose square overflows ``rms(w)`` and so the step size,
    is skipped by the proof as by the check, and a weight of 1e18 (with weight
    decay) applies on both, to the same weights."""
    init = [np.full(24, 0.5, "f4"), np.zeros(4, "f4")]
    grads = [np.linspace(-1, 1, 24, dtype="f4"), np.ones(4, "f4")]
    runs = []
    for kind in ("adafactor", checked_copy("adafactor")):
        weights = [_run(kind, path, [w.copy() for w in init], [grads] * 2,
                        weight_decay=0.1)]
        for large in (3e19, 1e18):
            start = [w.copy() for w in weights[-1][1]]
            start[0][0] = large
            weights.append(_run(kind, path, start, [grads], weight_decay=0.1))
        runs.append(weights)
    assert "adafactor at transforms[-1]: proved" in str(runs[0][0][2].checks).replace(
        f"transforms[{len(PATHS[path])}]", "transforms[-1]")
    assert "proved" not in runs[1][0][2].checks[-1]
    assert [r[0] for r in runs[0]] == [r[0] for r in runs[1]] == [[True, True], [False],
                                                                  [True]]
    for proved, checked in zip(*runs):
        for a, b in zip(proved[1], checked[1]):
            assert np.isfinite(a).all()
            np.testing.assert_array_equal(a, b)


def _same_as_checked(kind: str, path: str, init, grads, **options) -> list[bool]:
    """Which steps apply, after asserting the proof and the check agree on them and
    on the weights, and that the weights stay finite."""
    (applied, weights, plan), (expected, reference, _) = (
        _run(k, path, init, grads, **options) for k in (kind, checked_copy(kind)))
    assert "proved" in plan.checks[-1]
    assert applied == expected
    for a, b in zip(weights, reference):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)
    return applied


VECTOR = [np.linspace(-1, 1, 24, dtype="f4"), np.ones(4, "f4")]


@pytest.mark.parametrize("path", ["plain", "per-variable"])
@pytest.mark.parametrize("options, init, grads, applied", [
    # epsilon_2 holds the step size near the float32 maximum; at the second step,
    # after a gradient of 0, |u| reaches 1 / sqrt(2**-5), unclipped: 4e38 overflows
    ({"epsilon_2": 1e38, "beta_2_decay": -5.0, "clip_threshold": 1e10, "learning_rate": 1.0},
     [np.zeros(24, "f4"), np.zeros(4, "f4")],
     [[np.zeros(24, "f4"), np.zeros(4, "f4")], VECTOR], [True, False]),
    # weight decay at a rate times 1e7: w' = w (1 - 1e7) and rms(w') overflow
    ({"weight_decay": 1e10}, [np.full(24, 1e13, "f4"), np.zeros(4, "f4")], [VECTOR],
     [False]),
    # the new moment g**2 + epsilon_1 overflows
    ({"epsilon_1": 3e38}, [np.zeros(24, "f4"), np.zeros(4, "f4")],
     [[np.where(np.arange(24) == 0, 1e19, 1.0).astype("f4"), np.ones(4, "f4")]], [False]),
    # k epsilon_1 rounds to 0: 0 / 0 where a gradient is 0 (the first), else finite
    ({"epsilon_1": 1e-38}, [np.zeros(24, "f4"), np.zeros(4, "f4")],
     [[np.zeros(24, "f4"), np.ones(4, "f4")], VECTOR], [False, True]),
    # at beta_2_decay = -5, k epsilon_1 falls below 2**-120 from the 17th step: the
    # steps after it are checked, and apply
    ({"beta_2_decay": -5.0}, [np.zeros(24, "f4"), np.zeros(4, "f4")], [VECTOR] * 20,
     [True] * 20),
])
def test_adafactor_applies_exactly_the_steps_a_check_applies(path, options, init, grads,
                                                             applied):
    assert _same_as_checked("adafactor", path, init, grads, **options) == applied


@pytest.mark.parametrize("path", ["plain", "per-variable"])
def test_lamb_on_weights_past_its_proof_is_checked_and_applies(path):
    """Weights of norm 1e17: past what the proof takes at a rate of 0.01 (the ratio
    could reach ``2**76 * 1e17``), but the step is finite: checked, and applied."""
    init = [np.full((6, 4), 1e17 / np.sqrt(24), "f4"), np.zeros(4, "f4")]
    grads = [[np.ones((6, 4), "f4"), np.ones(4, "f4")]] * 2
    assert _same_as_checked("lamb", path, init, grads) == [True, True]


@pytest.mark.parametrize("options, proved", [
    ({}, True),
    ({"learning_rate": "@lr", "weight_decay": "@lr"}, True),  # each step requires its own
    ({"learning_rate": 1e10}, True),  # 2 * 1e10 / 0.1 * 2**64 / 1e-7 = 3.7e37
    ({"learning_rate": 1e12}, False),  # 3.7e39: adam's step alone may overflow
    ({"epsilon": 0.0}, False),  # 0 / 0 where both moments are 0
])
def test_adamws_outputs_are_proved_only_where_its_bound_holds(options, proved):
    pipe = gradpipe.build({"schedules": SCHEDULE,
                           "transforms": [{"kind": "adamw", **options}]})
    pipe.build([tf.Variable([1.0])])
    assert ("adamw at transforms[0]: proved from its input's norm and its weights' norm"
            in pipe.plan.checks[0]) is proved, pipe.plan.checks[0]


MATRIX = [np.ones((6, 4), "f4"), np.ones(4, "f4")]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("options, init, grads, applied", [
    ({}, [np.full((6, 4), 0.5, "f4"), np.zeros(4, "f4")], [MATRIX] * 3, [True] * 3),
    # a decay of lr * weight_decay = 1e4 on a weight of 1e35: 1e39 overflows
    ({"weight_decay": 1e6}, [np.where(np.eye(6, 4) > 0, 1e35, 0.5).astype("f4"),
                             np.zeros(4, "f4")], [MATRIX], [False]),
    # weights of 2e34, whose squares overflow the weights' norm, decayed by 2e38:
    # past the proof, finite: checked, and applied
    ({"weight_decay": 1e6}, [np.where(np.eye(6, 4) > 0, 2e34, 0.5).astype("f4"),
                             np.zeros(4, "f4")], [MATRIX], [True]),
])
def test_adamw_applies_exactly_the_steps_a_check_applies(path, options, init, grads,
                                                         applied):
    assert _same_as_checked("adamw", path, init, grads, **options) == applied


CG = {"kind": "conditional_gradient", "learning_rate": 0.9}


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e39
@pytest.mark.parametrize("rule, proved", [
    ({"kind": "fromage"}, True),
    ({"kind": "fromage", "learning_rate": "@lr", "min_norm": 0.0}, True),  # each step
    ({"kind": "fromage", "min_norm": 1e39}, False),  # inf in float32
    (CG, True),
    ({**CG, "learning_rate": "@lr"}, True),  # each step requires its rate in [0, 1]
    ({**CG, "ord": "nuclear"}, False),  # a singular value decomposition: checked
    ({**CG, "epsilon": 0.0}, False),  # 0 / 0 where the gradient is 0
])
def test_optax_and_tfa_rules_are_proved_only_where_their_config_allows(rule, proved):
    pipe = gradpipe.build({"schedules": SCHEDULE, "transforms": [rule]})
    pipe.build([tf.Variable([1.0])])
    assert (f"{rule['kind']} at transforms[0]: proved from its input's norm and its "
            "weights' norm" in pipe.plan.checks[0]) is proved, pipe.plan.checks[0]


def _eye(value: float) -> list[np.ndarray]:
    return [np.where(np.eye(6, 4) > 0, value, 0.5).astype("f4"), np.zeros(4, "f4")]


TINY_NORM = {"min_norm": 1e-30}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("options, init, grads, applied", [
    ({}, _eye(0.5), [MATRIX] * 3, [True] * 3),
    # weights of norm 2e18 and a zero gradient, whose norm is min_norm: the ratio 2e18 /
    # 1e-30 overflows, and 0 times it is NaN: the proof fails, the check skips
    (TINY_NORM, _eye(1e18), [[np.zeros((6, 4), "f4"), MATRIX[1]]], [False]),
    # the same weights with a gradient of norm 5: past the proof, finite: checked, applied
    (TINY_NORM, _eye(1e18), [MATRIX], [True]),
])
def test_fromage_applies_exactly_the_steps_a_check_applies(path, options, init, grads,
                                                           applied):
    assert _same_as_checked("fromage", path, init, grads, **options) == applied


FAR = {"learning_rate": 0.0, "lambda_": 5e37}  # w - new = w + lambda_ s: a jump to the ball
# one element of -1: s = g / ||g|| is -1 there, a step of 5e37 away from a negative weight
NEGATIVE = [np.where(np.arange(24).reshape(6, 4) == 0, -1.0, 0.0).astype("f4"),
            np.zeros(4, "f4")]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("options, init, grads, applied", [
    ({"learning_rate": 0.9}, _eye(0.5), [MATRIX] * 3, [True] * 3),
    # a weight of -3e38 stepping 5e37 further: -3.5e38 overflows; the weights' norm
    # fails the proof (lambda_ alone would pass it) and the check skips
    (FAR, _eye(-3e38), [NEGATIVE], [False]),
    # weights of 1e38 stepping back by 5e37: past the proof, finite: checked, applied
    (FAR, _eye(1e38), [NEGATIVE], [True]),
])
def test_conditional_gradient_applies_exactly_the_steps_a_check_applies(path, options, init,
                                                                        grads, applied):
    assert _same_as_checked("conditional_gradient", path, init, grads, **options) == applied
