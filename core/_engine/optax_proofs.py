"""Proofs of the rules that follow optax's order of operations: ``adamaxw``,
``nadamw``, ``adan``, ``adabelief``, ``radam``.

optax scales a direction by the rate last: ``lr * (direction + weight_decay *
w)``. Each of these directions stays within a constant ``K`` of the config; the
step then stays within ``max(1, |lr|) * (K + |weight_decay| * ||w||)`` (the
``max``: below a rate of 1 the sum before the product is the larger), required
below the float32 maximum at build where it is constant, else at each step
(where it fails, the step is checked). As :mod:`gradpipe._engine.proofs`' own,
each holds for gradpipe's maths only and assumes its inputs finite, every
element below ``2**64``; where the rule squares its input (so a step with a
larger one is never applied, checked or not), the first moment, a weighted
mean of them, stays within that too. The weights' norm is read only where a
weight decays.

* ``adamaxw`` on ``adamax``'s conditions (``rate_proofs.forgets_slower``: constant
  betas, ``beta_1 < beta_2``) and ``epsilon`` a normal float32: its infinity norm
  ``u = max(|g| + epsilon, beta_2 u)`` is at least ``epsilon`` and forgets a
  gradient more slowly than ``m``, so ``m / u`` stays within ``(1 - beta_1) / (1 -
  beta_1 / beta_2)`` whatever gradients came before (a checked step may leave ``m``
  past ``2**64``: adamaxw does not square the gradient), and its direction,
  ``m / u`` divided by ``1 - beta_1**t`` in that order, within ``K = 4 / (1 -
  beta_1 / beta_2)``.
* ``nadamw`` with constant betas below 1 in float32 and ``epsilon`` a normal
  float32: Nesterov's ``m_hat = beta_1 m / (1 - beta_1**(t+1)) + (1 - beta_1) g
  / (1 - beta_1**t)`` stays within ``2**64 / (1 - beta_1)`` (without Nesterov,
  ``m / (1 - beta_1**t)``, within the same), its denominator
  ``sqrt(v_hat + epsilon_root) + epsilon`` is at least ``epsilon`` (an
  overflowing ``v_hat`` gives 0), so ``K = 4 / (1 - beta_1) * 2**64 /
  epsilon`` (twice for rounding).
* ``adan`` with constant betas whose ``1 - beta`` is at least ``2**-22`` in float32
  and ``epsilon`` a normal float32. Every step it applies, proved or checked, has
  a finite second moment, so its look-ahead ``x = (2 - beta_2) g - (1 - beta_2)
  g_prev`` within ``2**64``: with ``g_prev`` within ``2**64`` (as on the first step,
  where the difference is 0), so is ``g``. Its ``m`` (an average of those) stays
  within ``B = 2**64`` and ``v`` (of their differences) within ``2 B``; ``n``, an
  average of squares, is not negative. Its direction ``(m_hat + (1 - beta_2)
  v_hat) / (sqrt(n_hat + epsilon_root) + epsilon)`` then stays within ``K = (4 / (1
  - beta_1) + 8) * 2**64 / epsilon``. Each step reads the previous gradient's
  largest element and requires ``x**2`` (from it and the input's norm) below half
  the maximum, so that ``n`` stays finite.
* ``adabelief`` with constant betas whose ``1 - beta`` is at least ``2**-22`` and
  ``epsilon`` a normal float32. Its first moment is not held within ``2**64`` by its
  maths (the squared error ``(g - m)**2`` lets ``g`` drift from ``m``), so each step
  reads its largest element ``M``: with ``A = max(M, |g|)``, ``m_hat`` (Nesterov's
  too) stays within ``4 A / (1 - beta_1)``, its second moment, an average of
  squares, is not negative, so ``K = 8 / ((1 - beta_1) epsilon)`` per unit of
  ``A``; the squared error, within ``(|g| + M)**2``, must stay below half the
  maximum.
* ``radam`` with constant betas below 1 in float32, ``epsilon`` a normal float32
  and ``rho_inf = 2 / (1 - beta_2) - 1`` at least 5: ``rho <= rho_inf``, and
  ``(rho - 4)(rho - 2) / rho`` grows with ``rho`` from 4 on, so the
  rectification ``r`` is at most 1 (``rho_inf - 4 >= 1`` keeps its rounding
  small); the step is ``r`` times Adam's direction or, before ``rho`` reaches
  the threshold, ``m_hat`` alone: ``K = 4 / (1 - beta_1) * 2**64 * max(1,
  1 / epsilon)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fields import is_constant
from ..transform import hyper
from .bounds import largest_magnitude_element, squared_bound, weight_norm_bound
from .proofs import (
    FLOAT32_BOUND,
    LARGEST_ELEMENT,
    LEAST_EPSILON,
    Prove,
    Proved,
    float32,
    sparse_or_narrow,
)
from .rate_proofs import (
    below_one,
    constant_betas,
    forgets_slower,
    infinity_norm_k,
    per_rate,
)

#: the least ``rho_inf`` of radam's proof: below, ``r``'s denominator ``(rho_inf -
#: 4)(rho_inf - 2)`` is near 0 and the rounding of ``rho - 4`` can make ``r`` large
RADAM_LEAST_RHO_INF = 5.0


def _adamaxw_direction(config: Any) -> float:
    return infinity_norm_k(config)


def _nadamw_direction(config: Any) -> float:
    return per_rate(config, 4.0)


def _adan_direction(config: Any) -> float:
    # m_hat within 2 B / (1 - beta_1), (1 - beta_2) v_hat within 4 B, B = 2**64; 2: rounding
    return (4.0 / float32(1.0 - float32(config.beta_1)) + 8.0) * LARGEST_ELEMENT \
        / config.epsilon


def _radam_direction(config: Any) -> float:
    return per_rate(config, 4.0) * max(1.0, config.epsilon)


def _provable(config: Any, direction: Callable[[Any], float]) -> bool:
    """The conditions known at build: a constant ``beta_1`` below 1, a normal float32
    epsilon, and the step's bound without decay (``direction(config)`` its ``K``)
    below the float32 maximum at a constant rate."""
    if float32(config.epsilon) < LEAST_EPSILON or not below_one(config.beta_1):
        return False
    lr = config.learning_rate
    return max(1.0, abs(lr) if is_constant(lr) else 1.0) * direction(config) < FLOAT32_BOUND


def decays_weights(config: Any) -> bool:
    """Whether an optax rule decays weights, so that its proof reads their norm."""
    wd = getattr(config, "weight_decay", 0.0)
    return not (is_constant(wd) and wd == 0)


#: ``reads(inputs, state)``: a step's own requirements and a float64 factor of its
#: direction's bound, from what it reads of the state
Reads = Callable[[list[Any], Any], tuple[list[Any], Any]]


def _proof(config: Any, direction: float, reads: Reads | None = None) -> Prove:
    """The step within ``max(1, |lr|) (K + |wd| ||w||)``, ``K`` = ``direction`` (times
    the factor ``reads`` gives, with its requirements, where it is given)."""
    import tensorflow as tf

    lr = hyper(config.learning_rate)
    decay = hyper(config.weight_decay) if decays_weights(config) else None
    per_step = decay is not None or not is_constant(config.learning_rate) or reads is not None

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> Proved | None:
        if sparse_or_narrow(inputs):
            return None
        required, factor = [squared_bound(inputs)], 1.0
        if reads is not None:
            more, factor = reads(inputs, read_state())
            required += more
        if not per_step:  # a constant rate, no decay: proved at build
            return Proved(required, 2 * max(abs(config.learning_rate), 1.0) * direction)
        # in float64, compared with float32's maximum: NaN/Inf fail too
        bound: Any = direction * tf.cast(factor, tf.float64)
        present = [v for g, v in zip(inputs, variables) if g is not None]
        if decay is not None and present:
            weights = tf.cast(weight_norm_bound(present), tf.float64)
            bound += tf.abs(tf.cast(decay(), tf.float64)) * weights
        step = tf.maximum(tf.abs(tf.cast(lr(), tf.float64)), 1.0) * bound
        required.append(step < FLOAT32_BOUND)
        return Proved(required, 2 * step)  # twice: the rounding of the step's maths

    return prove


def _largest(inputs: list[Any], leaves: list[Any]) -> Any:
    """The largest magnitude among ``leaves``' elements (a state's, one per input) whose
    input is given, in float64; 0 where none is."""
    import tensorflow as tf

    present = [tf.cast(largest_magnitude_element(t), tf.float64)
               for g, t in zip(inputs, leaves) if g is not None]
    return tf.reduce_max(tf.stack(present)) if present else tf.constant(0.0, tf.float64)


def _element(inputs: list[Any]) -> Any:
    """A float64 bound of every element of ``inputs``: the root of their sum of squares."""
    import tensorflow as tf

    return tf.sqrt(tf.cast(squared_bound(inputs), tf.float64))


def adamaxw_provable(config: Any) -> bool:
    # |g| + epsilon, the least u, stays finite
    return (forgets_slower(config) and config.epsilon < FLOAT32_BOUND / 2
            and _provable(config, _adamaxw_direction))


def adamaxw_proof(config: Any) -> Prove:
    return _proof(config, _adamaxw_direction(config))


def nadamw_provable(config: Any) -> bool:
    return below_one(config.beta_2) and _provable(config, _nadamw_direction)


def nadamw_proof(config: Any) -> Prove:
    return _proof(config, _nadamw_direction(config))


def adan_provable(config: Any) -> bool:
    return constant_betas(config, "beta_1", "beta_2", "beta_3") and _provable(
        config, _adan_direction)


def adan_proof(config: Any) -> Prove:
    """``_proof``'s, and its squared look-ahead ``x**2``, ``x = g + (1 - beta_2)(g -
    g_prev)``, within half the float32 maximum, from the previous gradient's largest
    element: its second moment, an average of ``x**2``, then stays finite too."""
    c = float32(1.0 - float32(config.beta_2))

    def reads(inputs: list[Any], state: Any) -> tuple[list[Any], Any]:
        x = (1 + c) * _element(inputs) + c * _largest(inputs, state.previous_gradient)
        return [2 * x * x < FLOAT32_BOUND], 1.0

    return _proof(config, _adan_direction(config), reads)


def adabelief_provable(config: Any) -> bool:
    return constant_betas(config, "beta_1", "beta_2") and _provable(
        config, _adabelief_direction)


def _adabelief_direction(config: Any) -> float:
    # m_hat (Nesterov's too) within 4 A / (1 - beta_1), A the largest of |m| and |g|;
    # 2: rounding
    return 8.0 / float32(1.0 - float32(config.beta_1)) / config.epsilon


def adabelief_proof(config: Any) -> Prove:
    """``_proof``'s with ``K`` per unit of ``A``, the largest of the first moment's
    elements (read) and the input's; the squared error ``(g - m)**2`` within half the
    float32 maximum, so that the second moment, an average of it, stays finite."""

    import tensorflow as tf

    def reads(inputs: list[Any], state: Any) -> tuple[list[Any], Any]:
        element, moment = _element(inputs), _largest(inputs, state.mu)
        error = element + moment  # |g - m_new| = beta_1 |g - m| at most
        return [2 * error * error < FLOAT32_BOUND], tf.maximum(element, moment)

    return _proof(config, _adabelief_direction(config), reads)


def radam_provable(config: Any) -> bool:
    if not below_one(config.beta_2):
        return False
    rho_inf = 2.0 / (1.0 - config.beta_2) - 1.0  # as the maths computes it
    return rho_inf >= RADAM_LEAST_RHO_INF and _provable(config, _radam_direction)


def radam_proof(config: Any) -> Prove:
    return _proof(config, _radam_direction(config))
