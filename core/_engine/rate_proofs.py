"""Proofs of the rules whose step stays within a multiple of their rate: ``adamax``,
``nadam``, the sign rules ``lion``, ``sign_sgd`` and ``signum``, ``rprop``, and
optax's ``amsgrad``, ``yogi`` and ``sm3``.

As :mod:`gradpipe._engine.proofs`' own, each holds for gradpipe's maths only and
assumes its inputs finite (a finite sum of squares bounds every element by
``2**64``); where the rule squares the gradient (a larger one then never applies,
checked or not), the first moment, an average of the gradients, stays within that
too (``adamax``, which does not, is held by its ``u`` instead).
Each requires ``|lr| * K`` below the float32 maximum, once at build for a constant
rate, at each step for a scheduled one (where it fails, the step is checked):

* ``adamax`` with constant betas, ``beta_1 < beta_2``, ``(1 - beta_1) epsilon`` a
  normal float32 and a rate within 1: its step ``lr * m / ((1 - beta_1**t) (u +
  epsilon))`` has ``|m| <= u (1 - beta_1) / (1 - beta_1 / beta_2)`` (``u = max(beta_2
  u, |g|)`` forgets a gradient more slowly than ``m``), so ``K = 4 / (1 - beta_1 /
  beta_2)``, whatever gradients came before: a step the check applied with a
  gradient past ``2**64`` leaves ``m`` past it too (adamax does not square the
  gradient), so its proof does not take ``m`` within ``2**64``. Where ``beta_2 <=
  beta_1``, ``u`` can forget such a gradient while ``m`` holds it, and the step
  overflow later: checked. Its ``lr * m``, computed first, stays within ``|m|`` at a
  rate within 1.
* ``nadam`` with constant betas below 1 in float32 and ``epsilon`` a normal
  float32: Dozat's ``u_t = beta_1 (1 - 0.5 * 0.96**t)`` and their running product
  (after the first step) are at most ``beta_1``, so ``m_hat = u_{t+1} m / (1 -
  prod u) + (1 - u_t) g / (1 - prod u)`` stays within ``2 * 2**64 / (1 -
  beta_1)``; ``sqrt(v_hat) + epsilon`` is at least ``epsilon`` (an overflowing
  ``v_hat`` gives a step of 0), so ``K = 4 / (1 - beta_1) * 2**64 / epsilon``.
* ``lion``, ``sign_sgd`` and ``signum``: their step (``lr * sign(beta_1 m + (1 -
  beta_1) g)``, ``lr * sign(g)``, ``lr * sign(m)``) is the rate times -1, 0 or 1
  (the sign's argument, a weighted mean of values within ``2**64``, is finite), so
  ``K = 1``; scheduled betas must stay in [0, 1].
* ``rprop``, with its rate, factors and step-size limits finite in float32: its
  step is a step size times a sign, and each step size starts at the rate and
  then is the last one, or its product with a factor clipped to the limits (an
  overflowing product clips to ``max_step_size``). A finite input times the
  last step (finite) is never NaN, so nothing is read but the input's norm:
  its rate is a number, never scheduled.
* optax's ``amsgrad``, with constant betas whose ``1 - beta`` is at least
  ``2**-22`` in float32 and ``epsilon`` a normal float32: its step ``lr * m_hat
  / (sqrt(nu_max + epsilon_root) + epsilon)`` has a denominator of at least
  ``epsilon`` (``nu_max``, a maximum of averages of squares, is not negative as
  its maths leaves it) and ``|m_hat| <= 2**64 / (1 - beta_1**t)``, where ``1 -
  beta_1**t`` is at least half of ``1 - beta_1`` in float32 (2 ulps below it at
  most): ``K = 4 / (1 - beta_1) * 2**64 / epsilon`` (``2 * 2**64 / epsilon``
  without ``bias_correction_mu``). Its new second moment ``(1 - beta_2) g**2 +
  beta_2 nu`` can round past the maximum, and its corrected value ``nu / (1 -
  beta_2**t)`` grows by up to ``2 / (1 - beta_2)``: each step reads ``nu``'s
  largest element (one pass, as ``rmsprop``'s proof) and requires ``(beta_2
  max(nu) + (1 - beta_2) sum(g**2)) * 2 / (1 - beta_2)`` below the maximum. The
  running maximum of finite values stays finite.
* optax's ``yogi``, on amsgrad's conditions, its moments starting within ``2**64``:
  its step has amsgrad's bound (its second moment stays at least 0, as its maths
  leaves it: where ``v > g**2`` it loses ``(1 - beta_2) g**2 < v``), and it reads
  nothing of its state: where ``v > g**2`` the new ``v`` is smaller, elsewhere at most
  ``(2 - beta_2) g**2``, which each step requires below the maximum.
* optax's ``sm3``: each element's accumulator is ``g**2`` plus the least of its
  axes' entries (not negative as its maths leaves them), so ``g`` times its
  inverse root stays within 1 (a ``g**2`` that underflows: ``|g| * 1e4``, far
  below), and so does the momentum of it: ``K = 2``, a scheduled momentum in
  [0, 1]. Each step reads the cover's largest element and requires it plus
  ``sum(g**2)``, every new entry's bound, below the maximum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fields import is_constant
from ..transform import hyper
from .bounds import squared_bound
from .proofs import (
    FLOAT32_BOUND,
    LARGEST_ELEMENT,
    LEAST_EPSILON,
    Prove,
    Proved,
    extended,
    float32,
    new_mean_square,
    sparse_or_narrow,
)

#: the least ``(1 - beta_1) * epsilon`` of adamax's proof: a normal float32, so that its
#: denominator ``(1 - beta_1**t) * (u + epsilon)`` cannot round to 0
ADAMAX_LEAST_DENOMINATOR = 2.0**-125


#: the least ``1 - beta`` (float32) of a proof that divides by ``1 - beta**t``: that then
#: stays above half of it, two float32 ulps of ``pow`` below it at most
LEAST_ONE_MINUS_BETA = 2.0**-22


def below_one(beta: Any) -> bool:
    """A constant beta whose ``1 - beta`` float32 does not round to 0."""
    return is_constant(beta) and float32(1.0 - float32(beta)) > 0


def per_rate(config: Any, factor: float) -> float:
    """``K``: ``factor / (1 - beta_1) * 2**64 / epsilon``, the bound of a step (or a
    direction) per unit of rate."""
    return factor / float32(1.0 - float32(config.beta_1)) * (LARGEST_ELEMENT / config.epsilon)


def _rate_provable(config: Any, k: float) -> bool:
    lr = config.learning_rate
    return not is_constant(lr) or lr * k < FLOAT32_BOUND


def _rate_proof(config: Any, k: float,
                more: Callable[[], list[Any]] = lambda: [], step: float | None = None
                ) -> Prove:
    """The proof of a step within ``|lr| * K`` (``k``), or within ``step`` where it is
    given (a rule whose step is not a multiple of its rate): a finite sum of squares
    of the inputs, the scheduled rate's ``|lr| * K`` below the float32 maximum, and
    ``more()``."""
    import tensorflow as tf

    lr = hyper(config.learning_rate)
    scheduled_rate = not is_constant(config.learning_rate)

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> Proved | None:
        if sparse_or_narrow(inputs):
            return None
        required = [squared_bound(inputs), *more()]
        if scheduled_rate:  # in float64, compared with float32's maximum: NaN/Inf fail too
            rate_bound = tf.abs(tf.cast(lr(), tf.float64)) * k
            required.append(rate_bound < FLOAT32_BOUND)
        else:
            rate_bound = abs(config.learning_rate) * k
        return Proved(required, 2 * (rate_bound if step is None else step))  # 2: rounding

    return prove


def rprop_proof(config: Any) -> Prove:
    """``sign_proof`` at its constant rate; its step, a step size times a sign, stays
    within the rate (where each size starts) and the sizes' limits."""
    largest = max(abs(config.learning_rate), abs(config.min_step_size),
                  abs(config.max_step_size))
    return _rate_proof(config, 1.0, step=largest)


def forgets_slower(config: Any) -> bool:
    """Constant betas, ``1 - beta_1`` at least ``2**-22`` and ``beta_1 < beta_2`` in
    float32: the running maximum ``u`` of an infinity-norm rule forgets a gradient
    more slowly than its first moment ``m`` does, so ``|m| <= u (1 - beta_1) / (1 -
    beta_1 / beta_2)`` whatever gradients came before (``u >= beta_2**j |g|`` for the
    gradient of ``j`` steps ago, weighted ``(1 - beta_1) beta_1**j`` in ``m``)."""
    b1, b2 = config.beta_1, config.beta_2
    return constant_betas(config, "beta_1") and is_constant(b2) and float32(b1) < float32(b2)


def infinity_norm_k(config: Any) -> float:
    """``K`` of ``m_hat / u`` where ``forgets_slower``: ``4 / (1 - beta_1 / beta_2)``
    (``1 - beta_1**t`` at least half of ``1 - beta_1``, and 2 for rounding)."""
    return 4.0 / (1.0 - float32(config.beta_1) / float32(config.beta_2))


def adamax_provable(config: Any) -> bool:
    """``forgets_slower``, a normal float32 ``(1 - beta_1) epsilon`` and a rate within
    1, so that its ``lr * m``, taken before it divides, stays finite."""
    if not forgets_slower(config) or config.epsilon <= 0:
        return False
    if float32(1.0 - float32(config.beta_1)) * float32(config.epsilon) \
            < ADAMAX_LEAST_DENOMINATOR:
        return False
    lr = config.learning_rate
    return not is_constant(lr) or abs(lr) <= 1


def in_unit_interval(config: Any, *names: str) -> Callable[[], list[Any]]:
    """``more()`` for a proof: each scheduled hyperparameter of ``names`` in [0, 1]."""
    scheduled = [hyper(getattr(config, n)) for n in names
                 if not is_constant(getattr(config, n))]

    def more() -> list[Any]:
        return [(value >= 0) & (value <= 1) for value in (h() for h in scheduled)]

    return more


def adamax_proof(config: Any) -> Prove:
    import tensorflow as tf

    lr = hyper(config.learning_rate)
    scheduled = not is_constant(config.learning_rate)
    return _rate_proof(config, infinity_norm_k(config),
                       lambda: [tf.abs(lr()) <= 1] if scheduled else [])


def nadam_provable(config: Any) -> bool:
    return (below_one(config.beta_1) and below_one(config.beta_2)
            and float32(config.epsilon) >= LEAST_EPSILON
            and _rate_provable(config, per_rate(config, 4.0)))


def nadam_proof(config: Any) -> Prove:
    return _rate_proof(config, per_rate(config, 4.0))


def sign_provable(config: Any) -> bool:
    return _rate_provable(config, 1.0)  # a rate past float32 times a sign of 0: NaN


def rprop_provable(config: Any) -> bool:
    """Every step size ``rprop`` can take, and each factor, finite in float32."""
    return all(abs(value) < FLOAT32_BOUND for value in (
        config.learning_rate, config.eta_minus, config.eta_plus, config.min_step_size,
        config.max_step_size))


def _amsgrad_k(config: Any) -> float:
    if config.bias_correction_mu:
        return per_rate(config, 4.0)
    return 2.0 * LARGEST_ELEMENT / config.epsilon


def constant_betas(config: Any, *names: str) -> bool:
    """Constant betas (``config``'s ``names``) whose ``1 - beta`` is at least ``2**-22``
    in float32: ``1 - beta**t`` then stays at least half of ``1 - beta``."""
    return all(is_constant(b) and float32(1.0 - float32(b)) >= LEAST_ONE_MINUS_BETA
               for b in (getattr(config, n) for n in names))


def _betas_and_epsilon(config: Any) -> bool:
    """``constant_betas`` and a normal float32 ``epsilon``: the denominator of an
    Adam-like step stays at least epsilon."""
    return (constant_betas(config, "beta_1", "beta_2")
            and float32(config.epsilon) >= LEAST_EPSILON)


def amsgrad_provable(config: Any) -> bool:
    return _betas_and_epsilon(config) and _rate_provable(config, _amsgrad_k(config))


def _with_sum_of_squares(rate: Prove, field: str, decay: float, scale: float,
                         growth: float = 1.0) -> Prove:
    """``rate``'s proof, and the state's ``field``, whose new value is ``decay * old +
    scale * g**2`` (``new_mean_square``), times ``growth`` below the float32 maximum."""

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> list[Any] | Proved | None:
        required = rate(inputs, read_state, variables)
        if required is None:  # sparse or float16 inputs: checked
            return None
        found = new_mean_square(inputs, getattr(read_state(), field), decay, scale)
        return extended(required, [] if found is None else [found[1] * growth < FLOAT32_BOUND])

    return prove


def amsgrad_proof(config: Any) -> Prove:
    decay, scale = float32(config.beta_2), float32(1.0 - float32(config.beta_2))
    # nu / (1 - beta_2**t), where 1 - beta_2**t >= (1 - beta_2) / 2
    growth = 2.0 / scale if config.bias_correction_nu else 1.0
    return _with_sum_of_squares(_rate_proof(config, _amsgrad_k(config)), "nu", decay, scale,
                                growth)


def yogi_provable(config: Any) -> bool:
    """amsgrad's conditions, and moments that start within ``2**64``."""
    return (_betas_and_epsilon(config) and config.initial_accumulator_value <= LARGEST_ELEMENT
            and _rate_provable(config, per_rate(config, 4.0)))


def yogi_proof(config: Any) -> Prove:
    """amsgrad's bound of the step, reading nothing of the state: where ``v > g**2`` its
    new second moment shrinks, else it is at most ``(2 - beta_2) g**2``."""
    import tensorflow as tf

    rate = _rate_proof(config, per_rate(config, 4.0))
    growth = 2.0 - float32(config.beta_2)

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> list[Any] | Proved | None:
        required = rate(inputs, read_state, variables)
        if required is None:
            return None
        squared = tf.cast(squared_bound(inputs), tf.float64)
        return extended(required, [squared * growth < FLOAT32_BOUND])

    return prove


#: sm3's step is its rate times a momentum of values within 1 (2: float rounding)
SM3_K = 2.0


def sm3_provable(config: Any) -> bool:
    return _rate_provable(config, SM3_K)


def sm3_proof(config: Any) -> Prove:
    rate = _rate_proof(config, SM3_K, in_unit_interval(config, "momentum"))
    return _with_sum_of_squares(rate, "cover", 1.0, 1.0)


def sign_proof(config: Any, *betas: str) -> Prove:
    """The proof of ``lr`` times a sign, each of ``betas`` (scheduled) in [0, 1]."""
    return _rate_proof(config, 1.0, in_unit_interval(config, *betas))
