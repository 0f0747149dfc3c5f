"""``adamax``, ``nadam``, the sign rules (``lion``, ``sign_sgd``, ``signum``),
optax's ``adamaxw``, ``nadamw``, ``radam`` and ``rprop`` proved finite from their
input's norm (and the weights' norm where a weight decays), optax's ``amsgrad``
and ``sm3`` and TF Addons' ``proximal_adagrad`` from their input's norm and their
state's largest element, optax's ``adan`` and ``adabelief`` from their input's norm
and the largest element of their previous gradient and first moment, optax's
``yogi`` from its input's norm alone; every
proof's epsilon a normal float32.

Adamax's step ``lr * m / ((1 - beta_1**t) (u + epsilon))`` has ``|m| <= max|g|``
and a denominator of at least ``(1 - beta_1) epsilon``: the step stays within
``2 lr / (1 - beta_1) * 2**64 / epsilon``; Nadam's within twice that, the sign
rules' within the rate. optax's rules scale by the rate last, so their bound is
``max(1, lr) (K + weight_decay ||w||)``. The bound is required below the float32
maximum (at build for a constant rate, at each step for a scheduled one). Where
a scheduled rate fails it, the step is checked, not skipped. Each path is held
to the maths checked as a third party's (``checked_copy``): the same steps
applied, the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import PROOF_PATHS as PATHS
from conftest import checked_copy


def _schedule(end: float) -> dict:
    """A rate of 0.01 at the first step, ``end`` from the second on."""
    return {"lr": {"kind": "linear", "start": 0.01, "end": end, "steps": 1}}


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e39
@pytest.mark.parametrize("kind, options, proved", [
    ("adamax", {}, True),
    ("adamax", {"learning_rate": "@lr"}, True),  # each step requires its own
    ("adamax", {"learning_rate": 1.0}, True),
    ("adamax", {"learning_rate": 1.5}, False),  # lr * m, computed first, may overflow
    ("adamax", {"beta_2": 0.5}, False),  # u forgets a gradient before m does
    ("adamax", {"beta_2": "@lr"}, False),
    ("adamax", {"beta_1": "@lr"}, False),  # a scheduled beta_1: checked
    ("adamax", {"epsilon": 0.0}, False),  # 0 / 0 where m and u are 0
    ("adamax", {"epsilon": 1e-40}, False),  # (1 - beta_1) epsilon: not a normal float32
    ("nadam", {}, True),
    ("nadam", {"learning_rate": "@lr"}, True),
    ("nadam", {"learning_rate": 1e10}, True),  # 4 * 1e10 / 0.1 * 2**64 / 1e-7 = 7.4e37
    ("nadam", {"learning_rate": 1e11}, False),  # 7.4e38: the step may overflow
    ("nadam", {"beta_2": "@lr"}, False),  # a scheduled beta: checked
    ("nadam", {"beta_1": 0.99999999}, False),  # 1.0 in float32: 1 - prod u_t can be 0
    ("nadam", {"epsilon": 0.0}, False),  # 0 / 0 where m and v are 0
    ("lion", {}, True),
    ("lion", {"learning_rate": "@lr", "beta_1": "@lr"}, True),  # each step requires its own
    ("lion", {"learning_rate": 1e39}, False),  # inf in float32: inf * sign 0 is NaN
    # optax's order, lr * (direction + weight_decay * w): K = 4 / (1 - 0.9 / 0.999) = 40.4
    ("adamaxw", {"weight_decay": 0.0}, True),
    ("adamaxw", {"learning_rate": 8e36, "weight_decay": 0.0}, True),  # 3.2e38
    ("adamaxw", {"learning_rate": 9e36, "weight_decay": 0.0}, False),  # 3.6e38
    ("adamaxw", {"epsilon": 1e-20}, True),  # m / u does not grow with 1 / epsilon
    ("adamaxw", {"epsilon": 1e-40}, False),  # not a normal float32: u may be 0
    ("adamaxw", {"beta_2": 0.8}, False),  # u forgets a gradient before m does
    ("adamaxw", {"beta_1": "@lr"}, False),
    ("nadamw", {"weight_decay": 0.0, "learning_rate": "@lr"}, True),
    ("nadamw", {"nesterov": False}, True),  # optax's adamw: m_hat within the same bound
    ("nadamw", {"beta_2": 0.99999999}, False),  # 1.0 in float32: v_hat is 0 / 0
    ("nadamw", {"epsilon": 1e-50}, False),
    ("radam", {}, True),
    ("radam", {"nesterov": True, "learning_rate": "@lr"}, True),
    ("radam", {"beta_2": 0.6}, False),  # rho_inf = 4: r's denominator is 0
    ("radam", {"beta_2": "@lr"}, False),
    ("sign_sgd", {"learning_rate": "@lr"}, True),
    ("sign_sgd", {"learning_rate": 1e39}, False),
    ("signum", {"beta": "@lr"}, True),
    ("rprop", {}, True),
    ("rprop", {"eta_plus": 1e30, "max_step_size": 3e38}, True),  # clipped: finite
    ("rprop", {"eta_plus": 1e39}, False),  # inf in float32: outside the proof, checked
    ("rprop", {"learning_rate": 1e39}, False),  # inf: inf * sign 0 is NaN
    ("rprop", {"max_step_size": 1e39}, False),  # an overflowing step size clips to inf
    # K = 4 / 0.1 * 2**64 / 1e-8 = 7.4e28 (2 * 2**64 / 1e-8 without bias_correction_mu)
    ("amsgrad", {}, True),
    ("amsgrad", {"learning_rate": "@lr"}, True),
    ("amsgrad", {"learning_rate": 4e9}, True),  # 3.0e38
    ("amsgrad", {"learning_rate": 5e9}, False),  # 3.7e38: the step may overflow
    ("amsgrad", {"learning_rate": 5e9, "bias_correction_mu": False}, True),  # 1.8e37
    ("amsgrad", {"beta_2": "@lr"}, False),  # a scheduled beta: bounded instead
    ("amsgrad", {"beta_2": 0.9999999}, False),  # 1 - beta_2 below 2**-22 in float32
    ("amsgrad", {"epsilon": 0.0}, False),  # 0 / 0 where m and nu_max are 0
    # a momentum of values within 1: K = 2
    ("sm3", {}, True),
    ("sm3", {"learning_rate": "@lr", "momentum": "@lr"}, True),  # each step requires its own
    ("sm3", {"learning_rate": 1.6e38}, True),
    ("sm3", {"learning_rate": 1.8e38}, False),  # 3.6e38: the step may overflow
    ("adabelief", {}, True),  # K = 8 / 0.1 / 1e-16 = 8e17 per unit of the largest element
    ("adabelief", {"nesterov": True, "learning_rate": "@lr", "weight_decay": 0.1}, True),
    ("adabelief", {"beta_2": "@lr"}, False),  # a scheduled beta: bounded instead
    ("adabelief", {"epsilon": 0.0}, False),  # 0 / 0 where both moments are 0
    ("adan", {}, True),  # K = (4 / 0.02 + 8) * 2**64 / 1e-8 = 3.8e29
    ("adan", {"learning_rate": "@lr", "weight_decay": 0.01}, True),
    ("adan", {"learning_rate": 8e8}, True),  # 3.1e38
    ("adan", {"learning_rate": 1e9}, False),  # 3.8e38: the step may overflow
    ("adan", {"beta_3": "@lr"}, False),  # a scheduled beta: bounded instead
    ("adan", {"epsilon": 1e-40}, False),  # not a normal float32
    ("yogi", {}, True),  # K = 4 / 0.1 * 2**64 / 1e-3 = 7.4e23
    ("yogi", {"learning_rate": "@lr"}, True),
    ("yogi", {"learning_rate": 4e14}, True),  # 3.0e38
    ("yogi", {"learning_rate": 5e14}, False),  # 3.7e38: the step may overflow
    ("yogi", {"beta_2": "@lr"}, False),  # a scheduled beta: bounded instead
    ("yogi", {"epsilon": 0.0}, False),  # 0 / 0 where both moments are 0
    ("yogi", {"initial_accumulator_value": 1e20}, False),  # a first moment past 2**64
    ("proximal_adagrad", {}, True),
    ("proximal_adagrad", {"learning_rate": "@lr", "l1_regularization_strength": 0.1}, True),
    ("proximal_adagrad", {"l2_regularization_strength": 1e30}, True),
    # subnormal: a CPU flushes it to 0, whose rsqrt is infinite (0 * inf: NaN)
    ("proximal_adagrad", {"initial_accumulator_value": 1e-40}, False),
])
def test_outputs_are_proved_only_where_the_bound_holds(kind, options, proved):
    pipe = gradpipe.build({"schedules": _schedule(0.02),
                           "transforms": [{"kind": kind, **options}]})
    pipe.build([tf.Variable([1.0])])
    default_decay = {"adamaxw": 1e-4, "nadamw": 1e-4, "adan": 0.0, "adabelief": 0.0}
    decays = kind in default_decay and options.get("weight_decay", default_decay[kind]) != 0
    regularises = kind == "proximal_adagrad" and any("strength" in k for k in options)
    assert ("weights' norm" in pipe.plan.checks[0]) == (proved and (decays or regularises))
    assert (f"{kind} at transforms[0]: proved from its input's norm" in pipe.plan.checks[0]
            ) is proved, pipe.plan.checks[0]


def _run(rule: dict, path: str, grads: list[list[np.ndarray]], schedules: dict):
    variables = [tf.Variable(np.full((6, 4), 0.5, "f4")), tf.Variable(np.zeros(4, "f4"))]
    pipe = gradpipe.build({"schedules": schedules,
                           "pipeline": {"jit_compile": path != "plain"},
                           "transforms": [*PATHS[path], rule]})
    pipe.build(variables)
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    applied = [bool(step([tf.constant(x) for x in g])) for g in grads]
    return applied, [v.numpy() for v in variables], pipe.plan


ONES = [np.ones((6, 4), "f4"), np.ones(4, "f4")]


#: a rate of 0.01 at the first step, 0.02 at the next two, then 1e30: past the bound
#: (about 1e56), but each step is near 1e30, so checked, and applied
RISING = {"lr": {"kind": "piecewise_constant", "learning_rate": 0.01, "boundaries": [0, 2],
                 "decay_rates": [2.0, 1e32]}}


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e39
# nadamw (its proof is adamaxw's) and sign_sgd (signum's, without state) are held to
# the check by the decay test below and the property test of test_reliability
@pytest.mark.parametrize("kind", ["adamax", "nadam", "lion", "adamaxw", "radam", "signum",
                                  "yogi"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("schedules, applied", [
    (RISING, [True] * 5),
    # an end past float32: the rate is infinite, NaN at the first step (inf * 0)
    (_schedule(1e39), [False] * 3),
], ids=["rising", "infinite"])
def test_the_steps_applied_are_exactly_those_a_check_applies(kind, path, schedules, applied):
    if schedules is RISING and kind == "adamaxw":
        # the weights, near 1e30 after a step at 1e30, decay by 1e30 * 1e-4 * 1e30: past
        # float32
        applied = [True] * 4 + [False]
    (by_proof, weights, plan), (by_check, reference, _) = (
        _run({"kind": k, "learning_rate": "@lr"}, path, [ONES] * len(applied), schedules)
        for k in (kind, checked_copy(kind)))
    assert "proved" in plan.checks[-1]
    assert by_proof == by_check == applied
    for a, b in zip(weights, reference):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # -NaN
@pytest.mark.parametrize("path", PATHS)
def test_rprop_applies_exactly_the_steps_a_check_applies(path):
    """rprop's step is a step size times a sign, its rate a number: ordinary
    gradients, elements of 1e20 (their sum of squares overflows: the proof fails,
    the step is checked and applies), a NaN (skipped) and a flipped sign, while a
    step size of 0.01 grows by 1e30 past float32 and is clipped to 1e30."""
    rule = {"learning_rate": 0.01, "eta_plus": 1e30, "max_step_size": 1e30}
    huge = [np.full((6, 4), 1e20, "f4"), np.full(4, 1e20, "f4")]
    grads = [ONES, huge, [np.full((6, 4), np.nan, "f4"), ONES[1]], ONES,
             [-g for g in ONES]]
    (by_proof, weights, plan), (by_check, reference, _) = (
        _run({**rule, "kind": k}, path, grads, {}) for k in ("rprop", checked_copy("rprop")))
    assert f"rprop at transforms[{len(PATHS[path])}]: proved from its input's norm" in \
        plan.checks[-1]
    assert by_proof == by_check == [True, True, False, True, True]
    for a, b in zip(weights, reference):
        assert np.isfinite(a).all()
        # the step size reached its limit (the whole path's clip makes 1e20 a 0)
        assert (np.abs(a).max() >= 1e30) == (path != "whole")
        np.testing.assert_array_equal(a, b)


def _steps_from_state(kind: str, path: str, slot: str, steps: list
                      ) -> tuple[list[bool], list[np.ndarray], object]:
    """Which ``steps`` apply, the weights, the plan. ``steps``: each the value ``slot``
    is set to first (``None``: as it is) and the gradients."""
    variables = [tf.Variable(np.full((6, 4), 0.5, "f4")), tf.Variable(np.zeros(4, "f4"))]
    pipe = gradpipe.build({"pipeline": {"jit_compile": path != "plain"},
                           "transforms": [*PATHS[path], {"kind": kind}]})
    pipe.build(variables)
    state = pipe.transform_state(len(PATHS[path]))[slot]
    step = tf.function(lambda g: pipe.apply_gradients(zip(g, variables)))
    applied = []
    for value, grads in steps:
        if value is not None:
            state.assign(np.asarray(value, "f4"))
        applied.append(bool(step([tf.constant(g) for g in grads])))
    return applied, [v.numpy() for v in variables], pipe.plan


def _one_large(value: float, shape: tuple = (6, 4)) -> np.ndarray:
    return np.where(np.arange(np.prod(shape)).reshape(shape) == 0, value, 1.0)


def _vector(first: float, second: float = 1.0) -> list[np.ndarray]:
    """``ONES`` with the vector's first two elements replaced."""
    return [ONES[0], np.array([first, second, 1.0, 1.0], "f4")]


def _assert_proof_applies_as_the_check(
        kind: str, path: str, slot: str, steps: list,
        reads: str = "its input's norm and its state's largest element") -> None:
    """The proof, from what it ``reads``, applies the steps a check of the same maths
    applies (one that fails it, checked, applies), and nothing else."""
    (by_proof, weights, plan), (by_check, reference, _) = (
        _steps_from_state(k, path, slot, steps) for k in (kind, checked_copy(kind)))
    assert f"{kind} at transforms[{len(PATHS[path])}]: proved from {reads}" in plan.checks[-1]
    assert by_proof == by_check == [True, True, False, True]
    for a, b in zip(weights, reference):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", PATHS)
def test_amsgrad_applies_exactly_the_steps_a_check_applies(path):
    """amsgrad's proof reads its second moment's largest element: with an element of
    3e35 the proof fails (nu / (1 - beta_2**t) may grow by 2 / (1 - beta_2)), the step
    is checked and applies (at t = 2 it is 1.5e38); with 2e36 it is 6.7e38 at t = 3,
    and both skip it; with 1.0 again both apply."""
    _assert_proof_applies_as_the_check("amsgrad", path, "nu/Variable", [
        (None, ONES), (_one_large(3e35), ONES), (_one_large(2e36), ONES),
        (_one_large(1.0), ONES)])


@pytest.mark.parametrize("path", PATHS)
def test_sm3_applies_exactly_the_steps_a_check_applies(path):
    """sm3's proof reads its cover's largest element: a cover of 3.39e38 and a
    gradient of 1e19 elsewhere fail it (3.39e38 + 1e38), the step is checked and
    applies (each accumulator is finite); a cover of 3e38 under a gradient of 1.5e19
    overflows, and both skip it; with a cover of 1 again both apply."""
    _assert_proof_applies_as_the_check("sm3", path, "cover/Variable_1", [
        (None, ONES), (_one_large(3.39e38, (4,)), _vector(1.0, 1e19)),
        (_one_large(3e38, (4,)), _vector(1.5e19)), (np.ones(4), ONES)])


@pytest.mark.parametrize("kind", ["adamax", "adamaxw"])
@pytest.mark.parametrize("path", PATHS)
def test_infinity_norm_rules_stay_proved_after_a_checked_gradient_past_2_64(kind, path):
    """A gradient of 1e33 fails the proof (its sum of squares overflows); the check
    applies it (neither rule squares it), leaving m near 1e32, past the 2**64 the
    other proofs take a first moment within. The steps after it are proved from
    u, which forgets that gradient more slowly than m does (beta_1 < beta_2), and
    apply exactly as the check applies them. With beta_2 = 0, u forgets it at once
    while m holds it: the next update is infinite. The proof took m within 2**64
    and wrote it; such a config is now checked, and skips it."""
    huge = [np.full((6, 4), 1e33, "f4"), np.full(4, 1e33, "f4")]
    (by_proof, weights, plan), (by_check, reference, _) = (
        _run({"kind": k, "learning_rate": 1.0}, path, [ONES, huge, ONES, ONES], {})
        for k in (kind, checked_copy(kind)))
    assert f"{kind} at transforms[{len(PATHS[path])}]: proved" in plan.checks[-1]
    assert by_proof == by_check == [True, True, True, True]
    for a, b in zip(weights, reference):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)
    if path == "whole":
        return  # its clip's norm of 1e33s overflows: the clip makes them 0
    forgetful = {"learning_rate": 9e5, "beta_1": 0.999, "beta_2": 0.0,
                 **({"weight_decay": 0.0} if kind == "adamaxw" else {})}
    (applied, _, plan), (expected, _, _) = (
        _run({"kind": k, **forgetful}, path, [huge, ONES], {})
        for k in (kind, checked_copy(kind)))
    assert applied == expected == [True, False]
    assert "proved" not in plan.checks[-1]


@pytest.mark.parametrize("path", PATHS)
def test_adabelief_applies_exactly_the_steps_a_check_applies(path):
    """adabelief's proof reads its first moment's largest element: with -1e19 there, a
    gradient of 4e18 makes an error of 1.26e19 (1.6e38 squared): past half the float32
    maximum, so checked, and applied; with -1.8e19 and 1.2e19 the squared error
    overflows: both skip it; with 1 again both apply."""
    _assert_proof_applies_as_the_check("adabelief", path, "mu/Variable_1", [
        (None, ONES), (_one_large(-1e19, (4,)), _vector(4e18)),
        (_one_large(-1.8e19, (4,)), _vector(1.2e19)), (np.ones(4), ONES)],
        reads="its input's norm and its first moment's largest element")


@pytest.mark.parametrize("path", PATHS)
def test_adan_applies_exactly_the_steps_a_check_applies(path):
    """adan's proof reads its previous gradient's largest element: after -1.8e19, a
    gradient of 1.2e19 makes a look-ahead of 1.44e19 (2.1e38 squared): past half the
    float32 maximum, so checked, and applied; 1.7e19 makes 1.98e19, whose square
    overflows: both skip it; with 1 again both apply."""
    _assert_proof_applies_as_the_check("adan", path, "previous_gradient/Variable_1", [
        (None, ONES), (_one_large(-1.8e19, (4,)), _vector(1.2e19)),
        (_one_large(-1.8e19, (4,)), _vector(1.7e19)), (np.ones(4), ONES)],
        reads="its input's norm and its previous gradient's largest element")


@pytest.mark.parametrize("path", PATHS)
def test_yogi_applies_exactly_the_steps_a_check_applies_reading_nothing_of_its_state(path):
    """yogi's proof reads no state: a second moment of 3.4e38 under a gradient of 1e19
    elsewhere shrinks there (the proof holds, both apply); under 1.8446e19, whose
    square (3.4025e38) is above it, it grows past float32: the proof fails, and the
    check skips it as well; with 1 again both apply."""
    _assert_proof_applies_as_the_check("yogi", path, "nu/Variable_1", [
        (None, ONES), (_one_large(3.4e38, (4,)), _vector(1.0, 1e19)),
        (_one_large(3.4e38, (4,)), _vector(1.8446e19)), (np.ones(4), ONES)],
        reads="its input's norm (gradpipe knows its maths)")


@pytest.mark.parametrize("path", PATHS)
def test_proximal_adagrad_applies_exactly_the_steps_a_check_applies(path):
    """proximal_adagrad's proof reads its accumulator's largest element: one of 3.39e38
    and a gradient of 1e19 elsewhere fail it (3.39e38 + 1e38), the step is checked and
    applies (each element is finite); one of 3e38 under a gradient of 1.5e19 overflows,
    and both skip it; with 1 again both apply."""
    _assert_proof_applies_as_the_check("proximal_adagrad", path, "accumulator/Variable_1", [
        (None, ONES), (_one_large(3.39e38, (4,)), _vector(1.0, 1e19)),
        (_one_large(3e38, (4,)), _vector(1.5e19)), (np.ones(4), ONES)])


@pytest.mark.parametrize("kind", ["adam", "adamw", "lamb", "adamax", "nadam", "adamaxw",
                                  "nadamw", "amsgrad"])
@pytest.mark.parametrize("path", ["plain", "whole"])
def test_an_epsilon_that_rounds_to_0_is_checked(kind, path):
    """``epsilon = 1e-50`` is 0 in float32: at a rate of 0 the bound holds, but a zero
    gradient with zero moments gives 0 / 0. Such an epsilon is not proved: the step
    is checked and skipped, and the weights keep their values."""
    variable = tf.Variable([1.0, 2.0])
    pipe = gradpipe.build({"pipeline": {"jit_compile": path != "plain"}, "transforms": [
        *PATHS[path], {"kind": kind, "learning_rate": 0.0, "epsilon": 1e-50}]})
    pipe.build([variable])
    assert "proved" not in pipe.plan.checks[-1]
    assert not bool(pipe.apply_gradients([(tf.constant([0.0, 1.0]), variable)]))
    np.testing.assert_array_equal(variable.numpy(), [1.0, 2.0])


@pytest.mark.parametrize("kind", ["adamaxw", "nadamw"])
@pytest.mark.parametrize("path", PATHS)
def test_a_decay_past_float32_is_skipped_as_a_check_skips_it(kind, path):
    """optax's ``lr * (direction + weight_decay * w)`` at a rate of 1e-3 and a decay
    of 1e20: ordinary weights step (to about -5e16) on both. A weight set to 1e19
    keeps the weights' norm finite, but its decay, 1e39, overflows before the rate
    scales it: the proof's bound takes the sum at a rate of at least 1, and the step
    is skipped by the proof as by the check. With the weight back, the next step
    applies on both."""
    results = []
    for name in (kind, checked_copy(kind)):
        variables = [tf.Variable(np.full((6, 4), 0.5, "f4")), tf.Variable(np.zeros(4, "f4"))]
        pipe = gradpipe.build({"pipeline": {"jit_compile": path != "plain"}, "transforms": [
            *PATHS[path], {"kind": name, "learning_rate": 1e-3, "weight_decay": 1e20}]})
        pipe.build(variables)
        step = tf.function(lambda g, v=variables, p=pipe: p.apply_gradients(zip(g, v)))
        applied = [bool(step(ONES))]
        variables[1].assign([1e19, 0.0, 0.0, 0.0])
        applied.append(bool(step(ONES)))
        variables[1].assign([1.0, 0.0, 0.0, 0.0])
        applied.append(bool(step(ONES)))
        results.append((applied, [v.numpy() for v in variables], pipe.plan))
    (by_proof, weights, plan), (by_check, reference, _) = results
    assert "proved from its input's norm and its weights' norm" in plan.checks[-1]
    assert by_proof == by_check == [True, False, True]
    for a, b in zip(weights, reference):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)
