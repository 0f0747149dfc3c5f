"""``adafactor``: Keras 3 ``Adafactor`` (keras-team/keras ``optimizers/adafactor.py``).

Shazeer & Stern 2018. For a variable of rank >= 2 the second moment is kept
factored, as Keras keeps it: a row mean ``r`` (the last axis averaged away)
and a column mean ``c`` (the second-to-last axis averaged away), from which
``v = (r / mean(r)) outer c`` is rebuilt every step. A variable of rank < 2
keeps a full ``v``. The step is ``alpha_t * u / max(1, rms(u) / clip_threshold)``
with ``u = g / sqrt(v)`` and ``alpha_t = max(epsilon_2, rms(w)) * rho_t``.

The step depends on the whole variable (its RMS, the factored means, the RMS
of ``u``), so an IndexedSlices gradient is densified first, which is also what
Keras computes: the step of a sparse gradient equals that of its dense sum.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    dense,
    hookimpl,
    hyper,
    hyperparameter,
    non_negative,
    path_matches,
    positive,
    slot_dtype,
    value_of,
    variable_patterns,
)


@attrs.frozen(kw_only=True)
class AdafactorConfig:
    """Config of ``adafactor`` (Keras ``Adafactor``; names and defaults are Keras's).

    Attributes:
        learning_rate: step size (a number or a schedule); the step uses
            ``rho_t = min(learning_rate, 1 / sqrt(t))``.
        beta_2_decay: the second-moment decay is ``1 - t ** beta_2_decay``.
        epsilon_1: added to the squared gradient.
        epsilon_2: lower bound of the variable's RMS in the step size.
        clip_threshold: the update is scaled down to an RMS of at most this.
        relative_step: Keras's flag for the relative step size. Keras 3 takes
            ``rho_t = min(learning_rate, 1 / sqrt(t))`` whatever its value, so it
            changes nothing in Keras either; kept so that a Keras config reads as is.
        weight_decay: Keras's base ``weight_decay`` (``None`` there, 0 here: the
            same step); ``var -= var * weight_decay * learning_rate`` before the step.
        exclude_from_weight_decay: regexes of variable paths that are not decayed.
    """

    example: ClassVar[dict] = {"learning_rate": 0.1, "epsilon_2": 0.01}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    beta_2_decay: float = attrs.field(default=-0.8)
    epsilon_1: float = attrs.field(default=1e-30, validator=non_negative())
    epsilon_2: float = attrs.field(default=1e-3, validator=non_negative())
    clip_threshold: float = attrs.field(default=1.0, validator=positive())
    relative_step: bool = True
    weight_decay: Any = hyperparameter(default=0.0, validator=non_negative())
    exclude_from_weight_decay: tuple[str, ...] = variable_patterns()

    @beta_2_decay.validator
    def _decay(self, attribute: Any, value: float) -> None:
        # t ** beta_2_decay must shrink with t, or the decay 1 - t ** d is <= 0
        if value >= 0:
            raise ValueError(f"must be < 0, got {value}")


class AdafactorState(NamedTuple):
    count: Any
    r: list[Any]  # rank >= 2: mean over the last axis; else a scalar placeholder
    c: list[Any]  # rank >= 2: mean over the second-to-last axis; else a placeholder
    v: list[Any]  # rank < 2: the full second moment; else a scalar placeholder


def _factored(var: Any) -> bool:
    return len(var.shape) >= 2


def _rms(x: Any) -> Any:
    import tensorflow as tf

    return tf.sqrt(tf.reduce_mean(tf.square(x)))


def adafactor(cfg: AdafactorConfig) -> Transform:
    """Keras ``Adafactor``: factored second moments for rank >= 2, clipped RMS-scaled steps."""
    lr, decay = hyper(cfg.learning_rate), hyper(cfg.weight_decay)
    decays_at_all = getattr(decay, "constant", None) != 0.0

    def decays(var: Any) -> bool:
        if not decays_at_all or not cfg.exclude_from_weight_decay:
            return decays_at_all  # the path unread: variables packed into one vector have none
        return not path_matches(cfg.exclude_from_weight_decay, var)

    def init(variables: list[Any]) -> AdafactorState:
        import tensorflow as tf

        r, c, v = [], [], []
        for var in variables:
            dtype, shape = slot_dtype(var), list(var.shape)
            placeholder = tf.zeros([], dtype)
            if _factored(var):
                r.append(tf.zeros(shape[:-1], dtype))
                c.append(tf.zeros(shape[:-2] + shape[-1:], dtype))
                v.append(placeholder)
            else:
                r.append(placeholder)
                c.append(placeholder)
                v.append(tf.zeros(shape, dtype))
        return AdafactorState(tf.constant(0, tf.int64), r, c, v)

    def update(grads: list[Any], state: AdafactorState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1
        rs, cs, vs = list(state.r), list(state.c), list(state.v)
        updates: list[Any] = []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            dtype = vs[i].dtype
            g = tf.cast(dense(g), dtype)
            w = value_of(var, dtype)
            rate = tf.cast(lr(), dtype)
            decayed = 0.0
            if decays(var):  # Keras's base optimizer decays first, at the full rate
                decayed = w * tf.cast(decay(), dtype) * rate
                w = w - decayed
            step = tf.cast(count, dtype)
            # Keras also takes min(lr, 1/sqrt(t)) when relative_step and the rate is
            # constant; rho_t takes the same minimum anyway, so the step is the same.
            rho_t = tf.minimum(rate, 1 / tf.sqrt(step))
            alpha_t = tf.maximum(tf.cast(cfg.epsilon_2, dtype), _rms(w)) * rho_t
            regulated = tf.square(g) + tf.cast(cfg.epsilon_1, dtype)
            beta_2_t = 1 - tf.pow(step, tf.cast(cfg.beta_2_decay, dtype))
            if _factored(var):
                rs[i] = beta_2_t * rs[i] + (1 - beta_2_t) * tf.reduce_mean(regulated, -1)
                cs[i] = beta_2_t * cs[i] + (1 - beta_2_t) * tf.reduce_mean(regulated, -2)
                second = (tf.expand_dims(rs[i] / tf.reduce_mean(rs[i], -1, keepdims=True), -1)
                          * tf.expand_dims(cs[i], -2))
            else:
                vs[i] = beta_2_t * vs[i] + (1 - beta_2_t) * regulated
                second = vs[i]
            u = g / tf.sqrt(second)
            u_hat = u / tf.maximum(tf.ones([], dtype),
                                   _rms(u) / tf.cast(cfg.clip_threshold, dtype))
            updates.append(decayed + alpha_t * u_hat)
        return updates, AdafactorState(count, rs, cs, vs)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("adafactor", adafactor, AdafactorConfig,
             capabilities=Capabilities(update_rule=True))
