"""What a build reads off a trace's ops about XLA, against XLA's own lowering.

Under ``jit_compile = "auto"`` a build finds out whether XLA lowers each function
it would compile. Where every op is one whose lowering does not depend on the
values it sees, the answer is read off the trace; anything else is lowered. A
wrong "lowers" would fail at the first step, so each case here is held to XLA's
lowering of the same trace, from specs as the whole step's trial lowers it.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from gradpipe._engine.xla_ops import lowers_by_its_ops


def _from_weights(v):
    """0 or 1 read from the weights: a value XLA cannot know when it compiles."""
    return tf.cast(tf.reduce_max(v) > 1e30, tf.int32)


CASES = {
    # adam's maths: elementwise, with a read of its state and a write
    "elementwise": (True, lambda g, v: v.assign_sub(0.1 * g / (tf.sqrt(g * g) + 1e-7))),
    "fixed axes": (True, lambda g, v: tf.reshape(
        tf.reduce_mean(tf.reshape(g, [4, -1]), axis=1, keepdims=True) * tf.ones([4, 6]),
        g.shape)),
    "a conditional": (True, lambda g, v: tf.cond(
        tf.reduce_all(tf.math.is_finite(g)), lambda: g * 2.0, lambda: tf.zeros_like(g))),
    "shapes": (True, lambda g, v: tf.fill(tf.shape(g), tf.reduce_max(g))),
    "float64": (True, lambda g, v: tf.cast(tf.sqrt(tf.cast(g, tf.float64)), tf.float32)),
    "an axis from the weights": (False, lambda g, v: tf.reverse(
        g, axis=tf.reshape(_from_weights(v), [1]))),
    "a scan's axis from the gradients": (False, lambda g, v: tf.cumsum(
        g, axis=tf.cast(tf.reduce_max(g) > 1e30, tf.int32))),
    "multiples from the weights": (False, lambda g, v: tf.tile(
        g, tf.stack([1 + _from_weights(v), 1]))),
    "numpy": (False, lambda g, v: tf.numpy_function(lambda x: x * 0.5, [g], tf.float32)),
    "a string op": (False, lambda g, v: g * tf.cast(tf.strings.length("ab"), tf.float32)),
    "strings": (False, lambda g, v: g * tf.cast(tf.size(tf.identity(["a", "b"])), tf.float32)),
    "a loop": (False, lambda g, v: tf.while_loop(lambda i, x: i < 3,
                                                 lambda i, x: (i + 1, x * 0.5), (0, g))[1]),
}

OPERANDS_FROM_VALUES = ("an axis from the weights", "a scan's axis from the gradients",
                        "multiples from the weights")


@pytest.mark.parametrize("name", CASES)
def test_a_trace_said_to_lower_lowers(name):
    """Read off the ops: the common maths is answered without lowering, and what is
    answered that way lowers; the rest is left to XLA, which may refuse it."""
    expected, maths = CASES[name]
    variable = tf.Variable(np.ones((4, 6), "f4"))
    function = tf.function(lambda g: maths(g, variable), jit_compile=True, autograph=False)
    spec = tf.TensorSpec([4, 6], tf.float32)
    said = lowers_by_its_ops(function.get_concrete_function(spec).graph)
    assert said is expected
    try:
        lowered = "HloModule" in function.experimental_get_compiler_ir(spec)(stage="hlo")
    except Exception as exc:  # XLA's refusal, as a build's trial sees it
        lowered = False
        assert not said, exc
    if name in OPERANDS_FROM_VALUES:
        assert not lowered  # XLA needs them as constants: answered by lowering, not read
    elif said:
        assert lowered


def test_an_argument_xla_cannot_take_is_left_to_xla():
    """A string argument, unused: every op lowers, but XLA takes no string
    parameter, so the trace is not said to lower."""
    function = tf.function(lambda g, s: g * 2.0, jit_compile=True, autograph=False)
    specs = (tf.TensorSpec([3], tf.float32), tf.TensorSpec([], tf.string))
    assert not lowers_by_its_ops(function.get_concrete_function(*specs).graph)
    with pytest.raises(Exception, match="_Arg"):
        function.experimental_get_compiler_ir(*specs)(stage="hlo")
