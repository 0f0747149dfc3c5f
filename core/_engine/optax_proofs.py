"""Proofs of the rules that follow optax's order of operations: ``adamaxw``,
``nadamw``, ``adan``, ``radam``.

optax scales a direction by the rate last: ``lr * (direction + weight_decay *
w)``. Each of these directions stays within a constant ``K`` of the config; the
step then stays within ``max(1, |lr|) * (K + |weight_decay| * ||w||)`` (the
``max``: below a rate of 1 the sum before the product is the larger), required
below the float32 maximum at build where it is constant, else at each step
(where it fails, the step is checked). As :mod:`gradpipe._engine.proofs`' own,
each holds for gradpipe's maths only and assumes its inputs finite, every
element below ``2**64``; the first moment, a weighted mean of them, stays
within that too. The weights' norm is read only where a weight decays.

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
from .bounds import squared_bound, weight_norm_bound
from .proofs import (
    FLOAT32_BOUND,
    LARGEST_ELEMENT,
    LEAST_EPSILON,
    Prove,
    float32,
    sparse_or_narrow,
)
from .rate_proofs import (
    LEAST_ONE_MINUS_BETA,
    below_one,
    forgets_slower,
    in_unit_interval,
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


def _proof(config: Any, direction: float, scheduled: tuple[str, ...] = ()) -> Prove:
    """The step within ``max(1, |lr|) (K + |wd| ||w||)``, ``K`` = ``direction``; each of
    the ``scheduled`` betas (optax's ``beta_2`` of adamaxw) in [0, 1]."""
    import tensorflow as tf

    lr = hyper(config.learning_rate)
    decay = hyper(config.weight_decay) if decays_weights(config) else None
    per_step = decay is not None or not is_constant(config.learning_rate)
    betas_in_unit_interval = in_unit_interval(config, *scheduled)

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> list[Any] | None:
        if sparse_or_narrow(inputs):
            return None
        required = [squared_bound(inputs), *betas_in_unit_interval()]
        if per_step:  # in float64, compared with float32's maximum: NaN/Inf fail too
            bound: Any = tf.constant(direction, tf.float64)
            present = [v for g, v in zip(inputs, variables) if g is not None]
            if decay is not None and present:
                weights = tf.cast(weight_norm_bound(present), tf.float64)
                bound += tf.abs(tf.cast(decay(), tf.float64)) * weights
            rate = tf.maximum(tf.abs(tf.cast(lr(), tf.float64)), 1.0)
            required.append(rate * bound < FLOAT32_BOUND)
        return required

    return prove


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
    return (all(is_constant(b) and float32(1.0 - float32(b)) >= LEAST_ONE_MINUS_BETA
                for b in (config.beta_1, config.beta_2, config.beta_3))
            and _provable(config, _adan_direction))


def adan_proof(config: Any) -> Prove:
    """``_proof``'s, and its squared look-ahead ``x**2``, ``x = g + (1 - beta_2)(g -
    g_prev)``, within half the float32 maximum, from the previous gradient's largest
    element: its second moment, an average of ``x**2``, then stays finite too."""
    import tensorflow as tf

    step = _proof(config, _adan_direction(config))
    c = float32(1.0 - float32(config.beta_2))

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> list[Any] | None:
        required = step(inputs, read_state, variables)
        previous = [p for g, p in zip(inputs, read_state().previous_gradient) if g is not None]
        if required is None or not previous:
            return required
        largest = tf.reduce_max(tf.stack([tf.cast(tf.reduce_max(tf.abs(p)), tf.float64)
                                          for p in previous]))
        element = tf.sqrt(tf.cast(squared_bound(inputs), tf.float64))
        x = (1 + c) * element + c * largest
        return [*required, 2 * x * x < FLOAT32_BOUND]

    return prove


def radam_provable(config: Any) -> bool:
    if not below_one(config.beta_2):
        return False
    rho_inf = 2.0 / (1.0 - config.beta_2) - 1.0  # as the maths computes it
    return rho_inf >= RADAM_LEAST_RHO_INF and _provable(config, _radam_direction)


def radam_proof(config: Any) -> Prove:
    return _proof(config, _radam_direction(config))
