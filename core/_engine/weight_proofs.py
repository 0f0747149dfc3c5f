"""Proofs of the rules whose step scales with their weights' norm: ``lamb``,
``adafactor``, ``adamw``, optax's ``fromage`` and TF Addons' ``conditional_gradient``.

As :mod:`gradpipe._engine.proofs`' own, each holds for gradpipe's maths only,
assumes its inputs finite and reads the weights' norm through
``weight_norm_bound``: the norm of the variables' group, read once per step,
where checking the outputs would read every array the maths writes.

* ``lamb`` with ``epsilon`` a normal float32 and betas at least ``2**-20`` below 1 in float32:
  its moments are Adam's, so ``|m_hat| <= 2**64 / (1 - beta_1)`` and the
  direction ``u = m_hat / (sqrt(v_hat) + epsilon)`` stays within ``D = 2**64 /
  ((1 - beta_1) * epsilon)`` (a ``v_hat`` that overflows gives 0). Its update
  ``ratio * lr * u`` takes the ratio 1 (a zero norm) or ``||w|| / ||u||``. A
  float sum of non-negative terms is never below its largest term, so ``|u_i|
  <= ||u||`` and ``ratio * |u_i| <= ||w||``; ``||u||`` is 0 or at least
  ``2**-74.5`` (the root of the least float32), so the ratio stays below
  ``2**76 ||w||``, and an overflowing ``||u||`` gives the ratio 0. Each step
  requires ``lr * D``, ``lr * 2**76 * ||w||`` and ``||w||**2`` (the maths' own
  sum, in another order) below the float32 maximum,
  ``||w||`` bounded by the norm of the variables' group, which the step reads
  (one pass over the weights, where checking the outputs reads every array).

* ``adafactor`` with ``epsilon_1 > 0``, for variables of rank below 2 (a full
  second moment ``v``): with ``k = 1 - beta_2_t`` as the maths rounds it, the
  new ``v`` is at least ``k (g**2 + epsilon_1)``, so ``|u| = |g| / sqrt(v)``
  stays within ``1 / sqrt(k)`` (where ``g**2`` flushes to 0, ``|g| < 2**-63``
  and ``k epsilon_1 >= 2**-120`` keep it below 1/8), and so does the clipped
  ``u_hat``; an RMS of ``u`` that overflows gives 0. The step ``decayed +
  alpha_t * u_hat``, with ``alpha_t = max(epsilon_2, rms(w')) * rho_t``,
  ``|rho_t| <= min(lr, 1)`` (``|lr|`` for a negative one) and ``|w'| <= ||w|| (1
  + wd lr)``, stays within ``||w|| wd lr + max(epsilon_2, ||w'||) |rho_t| /
  sqrt(k)``. Each step requires that (with ``2 / sqrt(k)``: ``k``'s rounding),
  ``||w'||**2`` (the sum ``rms(w')`` takes) and ``beta_2_t max(v) + k
  (sum(g**2) + epsilon_1)`` (the new moment: one read of its largest element)
  below the float32 maximum, and ``k epsilon_1`` at least ``2**-120``.
  Factored (rank 2 or more), ``(r / mean(r)) c`` underflows to 0 where a row and
  a column of the gradient are 0 (Keras's maths gives 0/0 there): checked.

* ``adamw``: ``adam``'s step (within ``alpha * 2**64 / epsilon``)
  plus its decay ``w * weight_decay * lr``, within ``||w|| |weight_decay * lr|``:
  each step requires ``adam``'s conditions and the sum of the two below the
  float32 maximum (its state is ``adam``'s, proved as ``adam``'s).

* ``fromage``: its update ``rate * g * (n(w) / n(g)) + shrink * w``, with ``n(x) =
  max(||x||, min_norm)``, the ratio 1 where either is 0, ``|rate| < 1`` and
  ``shrink`` in [0, 1] (a rate whose square overflows gives ``rate`` 0). As
  for lamb, ``|g_i| <= ||g||``, so ``|g_i| * ratio <= n(w)`` (twice, for
  rounding), and ``n(g)`` is at least ``min_norm``, or where that rounds to 0,
  0 or at least ``2**-74.5``: the ratio stays below ``R = 2 / min_norm`` (or
  ``2**76``) times ``n(w)``. Each step requires ``max(||w||, min_norm) *
  max(R, 3)`` and ``||w||**2`` (its own norm of the weights, summed in another
  order than the bound's) below the float32 maximum, and a scheduled rate finite.

* ``conditional_gradient`` with ``ord = "fro"`` and ``epsilon`` a normal float32:
  ``s = g / (||g|| + epsilon)`` stays within 2 (twice, for the rounding of
  ``pow``), or where every square of ``g`` underflows (each ``|g_i| <
  2**-74.5``), within ``2**-74 / epsilon``: ``S``, the larger; an overflowing
  norm gives 0. With the rate in [0, 1], its update ``w - (rate w - (1 - rate)
  lambda_ s)`` stays within ``2 ||w|| + |lambda_| S``. Each step requires twice
  that below the float32 maximum, and a scheduled rate in [0, 1]. Its nuclear
  ``ord`` (a singular value decomposition) is checked.

Ordinary training may fail these conditions (a weights' norm past ``1e16 / lr``,
``k epsilon_1`` below ``2**-120`` after 17 steps at ``beta_2_decay = -5``), so
all five are ``CheckedWhereItFails``: a step that fails one is checked, not
skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fields import is_constant
from ..transform import hyper
from .bounds import largest_element, squared_bound, weight_norm_bound
from .proofs import (
    FLOAT32_BOUND,
    LARGEST_ELEMENT,
    LEAST_EPSILON,
    Prove,
    Proved,
    adam_proof,
    float32,
    sparse_or_narrow,
)
from .rate_proofs import in_unit_interval

#: how far below 1 lamb's betas must be in float32: ``1 - beta**t`` then cannot round to 0
LAMB_BETA_GAP = 2.0**-20
#: ``||w|| / ||u||`` where ``||u|| > 0`` stays below this times ``||w||`` (2**74.5, and a
#: factor 2 for the rounding of the two norms)
LAMB_RATIO = 2.0**76


def _lamb_direction_bound(config: Any, beta_1: float) -> float:
    """``D``, the largest element of lamb's direction ``m_hat / (sqrt(v_hat) + eps)``."""
    return LARGEST_ELEMENT / ((1.0 - beta_1) * config.epsilon)


def lamb_provable(config: Any) -> bool:
    lr, b1, b2 = config.learning_rate, config.beta_1, config.beta_2
    if float32(config.epsilon) < LEAST_EPSILON:
        return False  # 0/0 where a moment is 0
    if any(is_constant(b) and float32(1.0 - float32(b)) < LAMB_BETA_GAP for b in (b1, b2)):
        return False
    if is_constant(lr) and is_constant(b1):  # the step at a ratio of 1, proved once
        return lr * _lamb_direction_bound(config, float32(b1)) < FLOAT32_BOUND
    return True  # each step requires its own


def lamb_proof(config: Any) -> Prove:
    import tensorflow as tf

    lr, beta_1, beta_2 = (hyper(v) for v in (config.learning_rate, config.beta_1,
                                              config.beta_2))
    constant = is_constant(config.learning_rate) and is_constant(config.beta_1)
    scheduled_betas = not (is_constant(config.beta_1) and is_constant(config.beta_2))

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> Proved | None:
        if sparse_or_narrow(inputs):
            return None
        present = [v for g, v in zip(inputs, variables) if g is not None]
        if not present:
            return Proved([], 0.0)
        # in float64, compared with float32's maximum: NaN/Inf fail too
        rate = tf.abs(tf.cast(lr(), tf.float64))
        weights = tf.cast(weight_norm_bound(present), tf.float64)
        # the maths' own sum of the weights' squares, in another order: room to spare
        required = [squared_bound(inputs), rate * weights * LAMB_RATIO < FLOAT32_BOUND,
                    weights * weights < FLOAT32_BOUND]
        b1, b2 = tf.cast(beta_1(), tf.float32), tf.cast(beta_2(), tf.float32)
        gap = tf.cast(1.0 - b1, tf.float64)
        if not constant:
            required.append(rate * (LARGEST_ELEMENT / config.epsilon) < FLOAT32_BOUND * gap)
        if scheduled_betas:
            required.append((b1 >= 0) & (1 - b1 >= LAMB_BETA_GAP)
                            & (b2 >= 0) & (1 - b2 >= LAMB_BETA_GAP))
        # the step: lr D at a ratio of 1, else within lr ||w||; twice, for rounding
        direction = LARGEST_ELEMENT / config.epsilon / gap
        return Proved(required, 2 * rate * tf.maximum(direction, weights))

    return prove


#: the least ``(1 - beta_2_t) * epsilon_1`` adafactor's proof takes: a normal float32
#: with room, so that its second moment cannot round to 0
ADAFACTOR_LEAST_MOMENT = 2.0**-120


def adafactor_provable(config: Any) -> bool:
    return config.epsilon_1 > 0  # 0 / 0 where a gradient and its moment are 0


def adafactor_proof(config: Any) -> Prove:
    import tensorflow as tf

    lr, decay = hyper(config.learning_rate), hyper(config.weight_decay)

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> Proved | None:
        if sparse_or_narrow(inputs):
            return None
        present = [(g, v) for g, v in zip(inputs, variables) if g is not None]
        if any(len(v.shape) >= 2 for _, v in present):
            return None  # factored: checked
        if not present:
            return Proved([], 0.0)
        state = read_state()

        def f64(x: Any) -> Any:
            return tf.cast(x, tf.float64)

        step = tf.cast(state.count + 1, tf.float32)
        kept = f64(1 - (1 - tf.pow(step, config.beta_2_decay)))  # k, rounded as the maths
        squared = squared_bound(inputs)
        largest = tf.reduce_max(tf.stack([f64(largest_element(m)) for g, m in
                                          zip(inputs, state.v) if g is not None]))
        given = f64(lr())
        rate, wd = tf.abs(given), tf.abs(f64(decay()))
        rho = tf.where(given >= 0, tf.minimum(given, 1.0), rate)  # |min(lr, 1 / sqrt(t))|
        weights = f64(weight_norm_bound([v for _, v in present]))
        decayed = weights * (1 + wd * rate)  # ||w'||
        step_bound = (weights * wd * rate + tf.maximum(decayed, config.epsilon_2) * rho
                      * (2 / tf.sqrt(kept)))  # twice: k rounds in 1 - (1 - t**d)
        # in float64, compared with float32's maximum: NaN/Inf fail too
        return Proved([squared, kept * config.epsilon_1 >= ADAFACTOR_LEAST_MOMENT,
                       (1 - kept) * largest + kept * (f64(squared) + config.epsilon_1)
                       < FLOAT32_BOUND, decayed * decayed < FLOAT32_BOUND,
                       step_bound < FLOAT32_BOUND], 2 * step_bound)  # 2: rounding

    return prove


def adamw_proof(config: Any) -> Prove:
    import tensorflow as tf

    lr, decay = hyper(config.learning_rate), hyper(config.weight_decay)

    def decay_bound(present: list[Any]) -> Any:
        """``||w|| |weight_decay * lr|``, in float64."""
        weights = tf.cast(weight_norm_bound(present), tf.float64)
        return weights * tf.abs(tf.cast(decay(), tf.float64) * tf.cast(lr(), tf.float64))

    return adam_proof(config, decay_bound)


def fromage_provable(config: Any) -> bool:
    return abs(config.min_norm) < FLOAT32_BOUND  # a float32 min_norm, not inf


def fromage_proof(config: Any) -> Prove:
    import tensorflow as tf

    lr, scheduled = hyper(config.learning_rate), not is_constant(config.learning_rate)
    least = float32(config.min_norm)
    ratio = max(2.0 / least if least > 0 else LAMB_RATIO, 3.0)
    # its own norm of the weights, summed in another order, must not overflow either
    return _within_weights(lambda weights: tf.maximum(tf.maximum(weights, least) * ratio,
                                                      weights * weights),
                           lambda: [tf.abs(tf.cast(lr(), tf.float64)) < FLOAT32_BOUND]
                           if scheduled else [])


def conditional_gradient_provable(config: Any) -> bool:
    return config.ord == "fro" and float32(config.epsilon) >= LEAST_EPSILON


def conditional_gradient_proof(config: Any) -> Prove:
    import tensorflow as tf

    radius = hyper(config.lambda_)
    direction = max(2.0, 2.0**-74 / float32(config.epsilon))  # S, the largest |s_i|
    return _within_weights(
        lambda weights: 2 * (2 * weights + tf.abs(tf.cast(radius(), tf.float64)) * direction),
        in_unit_interval(config, "learning_rate"))


def _within_weights(bound: Callable[[Any], Any], more: Callable[[], list[Any]]) -> Prove:
    """The proof of a step within ``bound(n)``, ``n`` the weights' norm (float64),
    below the float32 maximum, with the inputs' norm finite and ``more()``."""
    import tensorflow as tf

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> Proved | None:
        if sparse_or_narrow(inputs):
            return None
        present = [v for g, v in zip(inputs, variables) if g is not None]
        required = [squared_bound(inputs), *more()]
        if not present:
            return Proved(required, 0.0)
        # in float64, compared with float32's maximum: NaN/Inf fail too
        step = bound(tf.cast(weight_norm_bound(present), tf.float64))
        return Proved([*required, step < FLOAT32_BOUND], 2 * step)  # 2: rounding

    return prove
