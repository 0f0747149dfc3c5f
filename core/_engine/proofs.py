"""Why some transforms' outputs need no check: the engine's proofs for its own.

A step never writes a non-finite value: before the first assignment it knows
that every transform's updates and new state are finite. For most transforms
it checks them (one sum over each output, ``step_ops.finite_outputs``). For
some of gradpipe's own, whose maths it knows, it proves them instead, from a
few scalars the step has already or computes in a few scalar ops. Each proof
assumes its inputs finite: the step checks the gradients it starts from, and
every earlier transform's outputs are proved or checked in turn.

* ``clip_by_global_norm``: the output is the input times the factor
  ``c * min(1/norm, 1/c)``, finite for a finite input and ``c > 0`` (an
  overflowing norm gives 0): nothing to require at a constant ``c``, a
  scheduled one must be finite and positive.
* ``sgd`` at a constant rate and momentum < 1: ``|m| <= lr * max|g| / (1 - mu)``,
  and a finite sum of squares bounds ``max|g|`` by 2**64, so every value stays
  below the float32 maximum while ``lr * 2**64 / (1 - mu) * (1 + mu)`` does.
  Sparse inputs are checked instead: their rows cost less to check than a bound,
  which would need their duplicate rows summed first.
* ``adam`` with ``epsilon`` a normal float32 (``LEAST_EPSILON``): ``|m|`` stays
  below ``max|g|``, so the step ``alpha * |m| / (sqrt(v) + epsilon)`` stays below
  ``alpha * 2**64 / epsilon``: finite while that is below the float32 maximum.
  (A smaller epsilon rounds to 0: ``0 / (0 + 0)`` at a rate of 0.) At a constant rate and
  beta_1 the config proves it for every step (``alpha <= 2 lr / (1 - beta_1)``);
  under a schedule each step requires its own ``alpha`` below it, and the
  betas in [0, 1).
* ``adagrad`` and ``rmsprop`` (not centred, ``rho`` constant and below 1), with
  ``epsilon >= 1e-30``: their new average of squares ``v`` (adagrad's ``acc +=
  g**2``, rmsprop's ``rho v + (1 - rho) g**2``) is at least ``k g**2`` (``k``
  is 1, and ``1 - rho``), so ``sqrt(v + eps)`` is at least ``sqrt(k) |g|`` or,
  where ``k g**2`` is below ``eps``, ``sqrt(eps)`` (``1e-15`` at least). The
  update ``lr * g / sqrt(v + eps)`` then stays within ``2 * lr / sqrt(k)``, its
  product ``lr * g`` within ``lr * max|g|``: each step requires ``2 * lr *
  max(1 / sqrt(k), sqrt(sum(g**2)))`` below the float32 maximum. The new
  average can overflow too (adagrad's grows; rmsprop's, a weighted mean, can
  round past the maximum), so the state's largest element is read (one pass,
  where a bound would read its least and its largest) and ``max(acc) +
  sum(g**2)``, or ``rho max(v) + (1 - rho) sum(g**2)``, must stay below it.
  With momentum, at a constant rate and momentum ``mu < 1``, rmsprop's ``|m|``
  stays below ``2 * lr / sqrt(1 - rho) / (1 - mu)``, as ``sgd``'s does.
  Centred, ``v - avg**2`` can round below zero: checked.
* TF Addons' ``proximal_adagrad``, from the same read: its accumulator never falls
  below its initial value (a normal float32), which bounds its rate.

``lamb``, ``adafactor`` and ``adamw``, whose steps scale with their weights'
norm, are proved in :mod:`gradpipe._engine.weight_proofs`; ``adamax`` and
``nadam``, whose steps stay within a multiple of the rate, in
:mod:`gradpipe._engine.rate_proofs`; ``proof_table`` names every
proof.

As for ``adam``'s second moment, a proof takes the state the engine wrote (or
restored) as its maths leaves it: an average of squares is not negative.

A proof that knows a bound of every element of its updates returns it beside
its requirements (``Proved``; twice the bound it requires, for the rounding of
the step's maths): a transform after it whose maths the engine bounds takes
its inputs within it, with no pass over them (an average of the weights after
``adam`` reads nothing of adam's step). ``proof_table.BOUND_THEIR_UPDATES``
names them.

Proofs are never taken from a plugin: a plugin's word that its outputs are
finite could be wrong, and a wrong one would write NaN into the weights. The
tests hold each proof against adversarial gradients.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from ..fields import is_constant
from ..transform import hyper
from .bounds import largest_element, squared_bound, weight_norm_bound

#: sqrt of the float32 maximum: an input with a finite sum of squares has no larger element.
LARGEST_ELEMENT = 2.0**64
#: below the float32 maximum (3.4028e38), with room for float32 rounding of the bounds
FLOAT32_BOUND = 3.4e38
#: the largest Adam step size a schedule is assumed to reach (lr 1, beta_1 0.999)
SCHEDULED_ALPHA_BOUND = 1e3


class Proved(NamedTuple):
    """What a proof that bounds its updates returns: the scalars under which its
    outputs are finite, and a bound of every element of its updates (a number or a
    float scalar) under them. A transform after it whose maths the engine bounds
    takes its inputs within that bound, without reading them."""

    required: list[Any]
    largest: Any


#: ``prove(inputs, read_state, variables) -> scalars`` that must be finite (booleans:
#: true) for the outputs to be finite (or ``Proved``: those, and the updates' bound),
#: or ``None`` where this trace cannot be proved (then checked).
Prove = Callable[[list[Any], Callable[[], Any], list[Any]], "list[Any] | Proved | None"]


def extended(result: list[Any] | Proved, more: list[Any]) -> list[Any] | Proved:
    """A proof's answer ``result`` that requires ``more`` too."""
    if isinstance(result, Proved):
        return Proved([*result.required, *more], result.largest)
    return [*result, *more]


class CheckedWhereItFails:
    """A proof whose conditions ordinary training may fail (a weights' norm, a decay
    that shrinks with the step): where they fail, the step checks the outputs, as
    where a bound fails, instead of skipping a step that may be finite."""

    def __init__(self, prove: Prove) -> None:
        self.prove = prove

    def __call__(self, inputs: list[Any], read_state: Callable[[], Any],
                 variables: list[Any]) -> list[Any] | Proved | None:
        return self.prove(inputs, read_state, variables)


def float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def adam_step_size_bound(config: Any) -> float | None:
    """An upper bound of every step's ``alpha`` at a constant rate and beta_1:
    ``2 * lr / (1 - float32(beta_1))`` (the 2 covers alpha's float32 rounding)."""
    lr, b1 = config.learning_rate, config.beta_1
    if not (is_constant(lr) and is_constant(b1)):
        return None
    one_minus_b1 = 1.0 - float32(b1)
    return 2 * lr / one_minus_b1 if one_minus_b1 > 0 else float("inf")


#: the least float32 epsilon a proof takes: the least normal float32. A smaller one
#: rounds to 0 or loses its precision, and ``0 / (0 + epsilon)`` could be 0/0.
LEAST_EPSILON = 2.0**-126


def adam_provable(config: Any) -> bool:
    if float32(config.epsilon) < LEAST_EPSILON:
        return False  # 0/0
    largest = adam_step_size_bound(config)
    largest = SCHEDULED_ALPHA_BOUND if largest is None else largest
    return largest * LARGEST_ELEMENT / config.epsilon < FLOAT32_BOUND


def sgd_provable(config: Any) -> bool:
    lr, mu = config.learning_rate, config.momentum
    return (is_constant(lr) and is_constant(mu) and mu < 1
            and lr * LARGEST_ELEMENT / (1 - mu) * (1 + mu) < FLOAT32_BOUND)


def clip_provable(config: Any) -> bool:
    return True


#: the least epsilon of adagrad's and rmsprop's proofs: its root, 1e-15, holds an
#: underflowing g**2
ROOT_MIN_EPSILON = 1e-30


def adagrad_provable(config: Any) -> bool:
    return config.epsilon >= ROOT_MIN_EPSILON  # the rate is required at each step


def rmsprop_provable(config: Any) -> bool:
    rho, mu, lr = config.rho, config.momentum, config.learning_rate
    if (config.centered or config.epsilon < ROOT_MIN_EPSILON or not is_constant(rho)
            or float32(1.0 - rho) <= 0):
        return False
    if is_constant(mu) and mu == 0:
        return True  # the rate is required at each step
    # the momentum sums the past steps, each within 2 lr / sqrt(1 - rho)
    return (is_constant(lr) and is_constant(mu) and mu < 1
            and 2 * lr / math.sqrt(float32(1.0 - rho)) / (1 - mu) * (1 + mu) < FLOAT32_BOUND)


def clip_proof(config: Any) -> Prove:
    import tensorflow as tf

    clip = hyper(config.clip_norm)
    constant = is_constant(config.clip_norm)

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> list[Any]:
        if constant:  # validated > 0: the factor is finite for any finite input
            return []
        c = tf.cast(clip(), tf.float32)  # a schedule's value: finite and positive
        return [c, c > 0]

    return prove


def sparse_inputs(inputs: list[Any]) -> bool:
    """Sparse inputs: their rows are cheaper to check than to bound (a bound needs
    the sum of duplicate rows, which the check does not)."""
    import tensorflow as tf

    return any(isinstance(g, tf.IndexedSlices) for g in inputs)


def sparse_or_narrow(inputs: list[Any]) -> bool:
    """Sparse inputs (``sparse_inputs``) or float16 ones: the proofs' bounds hold for
    float32 and float64."""
    return sparse_inputs(inputs) or any(g is not None and g.dtype.size < 4 for g in inputs)


def sgd_proof(config: Any) -> Prove:
    # sgd_provable's bound of the step (a constant rate and momentum), twice: rounding
    largest = 2 * config.learning_rate * LARGEST_ELEMENT / (1 - config.momentum) * (
        1 + config.momentum)

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> Proved | None:
        return None if sparse_inputs(inputs) else Proved([squared_bound(inputs)], largest)

    return prove


def adam_proof(config: Any, added: Callable[[list[Any]], Any] | None = None) -> Prove:
    """``adam``'s proof; with ``added(variables)``, a float64 bound of a term each step
    adds to every element of the step (``adamw``'s decay), for the variables given
    a gradient."""
    import tensorflow as tf

    lr, beta_1, beta_2 = (hyper(v) for v in (config.learning_rate, config.beta_1,
                                              config.beta_2))
    # a bound of every element of the step, alpha * 2**64 / epsilon: once for every
    # step at a constant rate and beta_1, else this step's
    largest = adam_step_size_bound(config)

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> Proved | None:
        if sparse_or_narrow(inputs):
            return None
        required = [squared_bound(inputs)]
        if largest is not None:
            bound: Any = largest * (LARGEST_ELEMENT / config.epsilon)
        else:
            step = tf.cast(read_state().count + 1, tf.float32)
            alpha = lr() * tf.sqrt(1 - tf.pow(beta_2(), step)) / (1 - tf.pow(beta_1(), step))
            bound = tf.cast(alpha, tf.float64) * (LARGEST_ELEMENT / config.epsilon)
        if added is not None and (present := [v for g, v in zip(inputs, variables)
                                              if g is not None]):
            bound = bound + added(present)
        if isinstance(bound, tf.Tensor):  # in float64, compared with float32's maximum:
            required.append(bound < FLOAT32_BOUND)  # NaN/Inf fail too
        if None in (getattr(beta_1, "constant", None), getattr(beta_2, "constant", None)):
            b1, b2 = beta_1(), beta_2()
            required.append((b1 >= 0) & (b1 < 1) & (b2 >= 0) & (b2 < 1))
        return Proved(required, 2 * bound)  # twice: the rounding of the step's maths

    return prove


def new_mean_square(inputs: list[Any], leaves: list[Any], decay: float, scale: float
                    ) -> tuple[Any, Any] | None:
    """The inputs' sum of squares and a bound of every element of a state's new ``decay
    * v + scale * g**2`` (``leaves``: ``v``, one per input, not negative as its maths
    leaves it; their largest element read), both in float64, to compare with
    float32's maximum (NaN/Inf fail too); ``None`` where no input is given."""
    import tensorflow as tf

    largest = [tf.cast(largest_element(v), tf.float64)
               for g, v in zip(inputs, leaves) if g is not None]
    if not largest:
        return None
    squared = tf.cast(squared_bound(inputs), tf.float64)
    return squared, decay * tf.reduce_max(tf.stack(largest)) + scale * squared


def mean_square_proof(config: Any, average: str, decay: float, scale: float) -> Prove:
    """The proof of ``lr * g / sqrt(v + eps)`` where the new ``v``, the state's field
    ``average``, is ``decay * v + scale * g**2``."""
    import tensorflow as tf

    lr = hyper(config.learning_rate)
    # rmsprop's momentum sums the steps: a constant below 1 where it is not 0
    # (rmsprop_provable); its update stays within 1 / (1 - momentum) of a step
    momentum = getattr(config, "momentum", 0.0)

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> Proved | None:
        if sparse_or_narrow(inputs):
            return None
        found = new_mean_square(inputs, getattr(read_state(), average), decay, scale)
        if found is None:
            return Proved([], 0.0)
        squared, new_average = found
        # 2 * lr / sqrt(scale) bounds the update, lr * |g| its product lr * g computed first
        rate = tf.cast(lr(), tf.float64)
        step = 2 * rate * tf.maximum(tf.sqrt(squared), 1 / math.sqrt(scale))
        return Proved([step < FLOAT32_BOUND, new_average < FLOAT32_BOUND],
                      2 * tf.abs(rate) / math.sqrt(scale) / (1 - momentum))

    return prove


def _least_accumulator(config: Any) -> float:
    """``proximal_adagrad``'s least accumulator element, as its maths leaves it (it
    starts at ``initial_accumulator_value`` and only grows): the smaller of that
    value and its float32 rounding, which the accumulator holds."""
    start = config.initial_accumulator_value
    return min(start, float32(start))


def proximal_adagrad_provable(config: Any) -> bool:
    """A normal float32 least accumulator: ``rsqrt`` of a subnormal one, flushed to 0
    on a CPU, is infinite, and ``0 * inf`` is NaN."""
    return _least_accumulator(config) >= LEAST_EPSILON


def proximal_adagrad_proof(config: Any) -> Prove:
    """``rate = lr * rsqrt(acc + g**2)`` stays within ``lr / sqrt(least)``, and ``g *
    rate`` within ``lr`` (``acc + g**2`` is at least ``g**2``): without regularisation
    the update ``g * rate`` stays within ``2 lr``. With it, the update ``w - new`` stays
    within ``2 (||w|| + 2 lr)``: ``v = w - g * rate`` is within ``||w|| + 2 lr``, and
    the prox step only shrinks it, by ``rate * l1`` and ``1 + rate * l2``, both finite
    while ``rate * max(l1, l2)`` is. The new accumulator must not overflow either."""
    import tensorflow as tf

    lr = hyper(config.learning_rate)
    l1, l2 = config.l1_regularization_strength, config.l2_regularization_strength
    regularised, strength = l1 > 0 or l2 > 0, max(1.0, l1, l2)
    rate = max(1.0, 1.0 / math.sqrt(_least_accumulator(config)))

    def prove(inputs: list[Any], read_state: Callable[[], Any], variables: list[Any]
              ) -> Proved | None:
        if sparse_or_narrow(inputs):
            return None
        found = new_mean_square(inputs, read_state().accumulator, 1.0, 1.0)
        if found is None:
            return Proved([], 0.0)
        _, new_accumulator = found
        step = 2 * tf.abs(tf.cast(lr(), tf.float64))
        required = [step * (rate * strength) < FLOAT32_BOUND, new_accumulator < FLOAT32_BOUND]
        if regularised:
            present = [v for g, v in zip(inputs, variables) if g is not None]
            weights = tf.cast(weight_norm_bound(present), tf.float64)
            step = 2 * (weights + 2 * step)
            required.append(step < FLOAT32_BOUND)
        return Proved(required, 2 * step)  # 2: rounding

    return prove
