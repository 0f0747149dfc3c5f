"""A bound reads the range of only the state leaves its maths needs it of.

A bounded transform's state is held within intervals read at every step: the
norm of the leaves (one pass over each) or a leaf's range, its least and
largest element (two passes). The build finds the fewest leaves whose range
the bounds need, and the plan names them. These tests hold a rule of two
leaves, a first moment (its norm suffices) and a running mean of squares under
a root (its range keeps the root's argument from below 0), against a float32
reference in numpy: a step is applied exactly when every update and new state
is finite, on the compiled and on the plain path.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gradpipe
from conftest import bounded_step, checked_copy, register_transform
from gradpipe.plugin import Capabilities, Transform


def _moments(variables):
    return {"m": [tf.zeros_like(v) for v in variables],
            "v": [tf.zeros_like(v) for v in variables]}


def _update(grads, state, variables):
    updates, ms, vs = [], [], []
    for g, m, v in zip(grads, state["m"], state["v"]):
        if g is None:
            updates.append(None)
            ms.append(m)
            vs.append(v)
            continue
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * tf.square(g)
        updates.append(m / (tf.sqrt(v) + 1e-7))
        ms.append(m)
        vs.append(v)
    return updates, {"m": ms, "v": vs}


def _reference(g, m, v):
    m = np.float32(0.9) * m + np.float32(0.1) * g
    v = np.float32(0.999) * v + np.float32(0.001) * (g * g)
    return m / (np.sqrt(v) + np.float32(1e-7)), m, v


READ = "from its input's norm, the range of its v and the norm of the rest of its state"


@functools.cache
def _step(jit: bool):
    """The rule on a variable of 3 and its traced step, built once for all examples."""
    register_transform("reads_moments", lambda cfg: Transform(_moments, _update),
                       capabilities=Capabilities(update_rule=True))
    return bounded_step("reads_moments", jit)


ELEMENTS = st.sampled_from([0.0, 1e-30, 1.0, -3.0, 60.0, 1e10, 1e19, -2e19, 1e38, -3e38])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(jit=st.booleans(), m=st.lists(ELEMENTS, min_size=3, max_size=3),
       v=st.lists(ELEMENTS, min_size=3, max_size=3),
       grads=st.lists(st.lists(ELEMENTS, min_size=3, max_size=3), min_size=1, max_size=3))
# a second moment below 0 (written from outside): the root of its new value is NaN
@example(jit=True, m=[1.0, 0.0, 0.0], v=[-3.0, 0.0, 0.0], grads=[[1.0, 0.0, 0.0]])
@example(jit=False, m=[1.0, 0.0, 0.0], v=[-3.0, 0.0, 0.0], grads=[[1.0, 0.0, 0.0]])
# a first moment too large for the norm of the state: checked instead, applied
@example(jit=True, m=[1e38, 1e38, 0.0], v=[1.0, 1.0, 1.0], grads=[[0.0, 0.0, 0.0]])
@example(jit=False, m=[1e38, 1e38, 0.0], v=[1.0, 1.0, 1.0], grads=[[0.0, 0.0, 0.0]])
def test_a_step_is_applied_exactly_when_its_outputs_are_finite(jit, m, v, grads):
    pipe, (var, *padding), step = _step(jit)
    assert f"reads_moments at transforms[0]: bounded: its traced maths, {READ}" in \
        str(pipe.plan), pipe.plan
    slots = pipe.transform_state(0)
    m_slot, v_slot = (next(s for name, s in slots.items() if f"/{key}/" in f"/{name}/")
                      for key in ("m", "v"))
    for each in [var, *padding, *slots.values()]:
        each.assign(tf.zeros_like(each))
    m, v = np.array(m, "f4"), np.array(v, "f4")
    m_slot.assign(m)
    v_slot.assign(v)
    with np.errstate(all="ignore"):
        for g in grads:
            g = np.array(g, "f4")
            update, new_m, new_v = _reference(g, m, v)
            finite = all(np.isfinite(x).all() for x in (update, new_m, new_v))
            before = m_slot.numpy(), v_slot.numpy(), var.numpy()
            assert bool(step(tf.constant(g))) == finite, (g, m, v, update)
            if finite:
                m, v = new_m, new_v
                np.testing.assert_allclose(m_slot.numpy(), m, rtol=1e-5)
                np.testing.assert_allclose(v_slot.numpy(), v, rtol=1e-5)
            else:  # skipped whole: nothing written
                for slot, old in zip((m_slot, v_slot, var), before):
                    np.testing.assert_array_equal(slot.numpy(), old)


@pytest.mark.parametrize("kind, ranged", [("adabelief", "nu"), ("adan", "n"), ("sm3", "cover"),
                                          ("amsgrad", "nu_max")])
def test_the_plan_names_the_leaves_whose_range_a_built_in_rule_reads(kind, ranged):
    """optax's rules, bounded as a plugin's maths would be (the engine proves its own),
    read the range of the one leaf under their root; the plan says which."""
    kind = checked_copy(kind)
    pipe = gradpipe.build({"transforms": [{"kind": kind}], "pipeline": {"jit_compile": True}})
    pipe.build([tf.Variable(tf.zeros([4, 3]))])
    assert (f"{kind} at transforms[0]: bounded: its traced maths, from its input's norm, "
            f"the range of its {ranged} and the norm of the rest of its state") \
        in str(pipe.plan), pipe.plan


@pytest.mark.parametrize("chain, reads", [
    # a gradient over its own norm: that norm's bound keeps the quotient finite
    ([{"kind": "novograd"}], "its input's norm and its state's norm, which also bound "
                             "the norms and sums it computes"),
    ([{"kind": "clip_by_norm", "clip_norm": 1.0}, {"kind": "sgd"}],
     "its input's norm and its state's norm, which also bound the norms and sums it "
     "computes"),
    # a trust ratio divides by a norm whose bound holds 0: it takes the norm's value;
    # sgd's proof bounds its updates, so lars's input needs no norm
    ([{"kind": "sgd"}, {"kind": "lars"}], "its input's bound (from sgd at transforms[0]), "
                                          "its state's norm, the weights' norm and the "
                                          "norms and sums it computes, computed again"),
])
def test_a_norm_the_maths_computes_is_bounded_not_computed_again_where_that_holds(
        chain, reads):
    """A per-variable norm inside a transform's maths costs the guard a pass over the
    variable where the bound takes its value; its bound, from the input's norm, costs a
    few scalar ops. The build takes the value only where the bound fails without it."""
    pipe = gradpipe.build({"transforms": chain, "pipeline": {"jit_compile": True}})
    pipe.build([tf.Variable(tf.zeros([4, 3]))])
    kind = next(t["kind"] for t in chain if t["kind"] != "sgd")
    assert f"{kind} at transforms[{[t['kind'] for t in chain].index(kind)}]: bounded: its " \
        f"traced maths, from {reads} (checked" in str(pipe.plan), pipe.plan


@pytest.mark.parametrize("chain, reads", [
    # an average of the weights the chain produces, w - u, after a proof's bound of u
    ([{"kind": "adam"}, {"kind": "moving_average"}],
     "its input's bound (from adam at transforms[0]), its state's norm and the weights' "
     "norm"),
    # decoupled decay reads the weights; adam's maths alone does not
    (["adamw"], "its input's norm, the range of its nu, the norm of the rest of its state "
                "and the weights' norm"),
    (["adam"], "its input's norm, the range of its nu and the norm of the rest of its "
               "state (checked"),
])
def test_the_plan_says_where_a_bound_reads_the_weights(chain, reads):
    """A bound whose maths reads a variable's value holds it within the weights' norm,
    one more read each step: the plan names it where the maths reads the weights."""
    chain = [{"kind": checked_copy(t)} if isinstance(t, str) else t for t in chain]
    pipe = gradpipe.build({"transforms": chain, "pipeline": {"jit_compile": True}})
    pipe.build([tf.Variable(tf.zeros([4, 3]))])
    assert f"bounded: its traced maths, from {reads}" in pipe.plan.checks[-1], pipe.plan
