"""Adaptive update rules with Keras 3 semantics: ``adagrad``, ``rmsprop``, ``ftrl``.

Formulas follow keras-team/keras ``optimizers/adagrad.py``, ``rmsprop.py`` and
``ftrl.py``. ``adagrad`` is sparse-aware: for IndexedSlices only the touched
rows of the accumulator and the variable change (duplicates summed first),
which is what Keras computes after densifying. ``rmsprop`` and ``ftrl``
densify, as Keras does.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    dedupe,
    dense,
    hookimpl,
    hyper,
    hyperparameter,
    in_range,
    is_sparse,
    non_negative,
    one_minus,
    positive,
    value_of,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class AdagradConfig:
    """Config of ``adagrad``.

    Attributes:
        learning_rate: step size.
        initial_accumulator_value: starting value of the squared-gradient sum.
        epsilon: added inside the square root.
    """

    example: ClassVar[dict] = {"learning_rate": 0.5}


    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    initial_accumulator_value: float = attrs.field(default=0.1, validator=non_negative())
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())


class AdagradState(NamedTuple):
    accumulator: list[Any]


def adagrad(cfg: AdagradConfig) -> Transform:
    """Keras ``Adagrad``: ``acc += g^2``; step ``lr * g / sqrt(acc + eps)``."""
    lr = hyper(cfg.learning_rate)

    def init(variables: list[Any]) -> AdagradState:
        return AdagradState(zeros_like_vars(variables, cfg.initial_accumulator_value))

    def update(grads: list[Any], state: AdagradState, variables: list[Any]) -> Any:
        import tensorflow as tf

        updates: list[Any] = []
        accs: list[Any] = []
        for g, acc in zip(grads, state.accumulator):
            if g is None:
                updates.append(None)
                accs.append(acc)
                continue
            lr_c = tf.cast(lr(), acc.dtype)
            if is_sparse(g):
                g = dedupe(g)
                values = tf.cast(g.values, acc.dtype)
                rows = tf.gather(acc, g.indices) + tf.square(values)
                accs.append(tf.IndexedSlices(rows, g.indices, g.dense_shape))  # rows only
                updates.append(tf.IndexedSlices(lr_c * values / tf.sqrt(rows + cfg.epsilon),
                                                g.indices, g.dense_shape))
                continue
            g = tf.cast(g, acc.dtype)
            acc = acc + tf.square(g)
            accs.append(acc)
            updates.append(lr_c * g / tf.sqrt(acc + cfg.epsilon))
        return updates, AdagradState(accs)

    return Transform(init, update)


@attrs.frozen(kw_only=True)
class RMSpropConfig:
    """Config of ``rmsprop``.

    Attributes:
        learning_rate: step size.
        rho: decay of the squared-gradient average.
        momentum: momentum of the step (0 disables it).
        epsilon: added to the denominator.
        centered: divide by the centred (variance) estimate.
    """

    example: ClassVar[dict] = {"learning_rate": 0.01}


    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    rho: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0))
    momentum: Any = hyperparameter(default=0.0, validator=in_range(0.0, 1.0))
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())
    centered: bool = False


class RMSpropState(NamedTuple):
    velocity: list[Any]
    momentum: list[Any]
    average_gradient: list[Any]


def rmsprop(cfg: RMSpropConfig) -> Transform:
    """Keras ``RMSprop``: ``v = rho v + (1-rho) g^2``; step ``lr g / sqrt(v + eps)``."""
    lr, rho, mom = hyper(cfg.learning_rate), hyper(cfg.rho), hyper(cfg.momentum)
    uses_momentum = not (isinstance(cfg.momentum, float) and cfg.momentum == 0.0)

    def init(variables: list[Any]) -> RMSpropState:
        return RMSpropState(zeros_like_vars(variables),
                            zeros_like_vars(variables) if uses_momentum else [],
                            zeros_like_vars(variables) if cfg.centered else [])

    def update(grads: list[Any], state: RMSpropState, variables: list[Any]) -> Any:
        import tensorflow as tf

        vel, moms, avgs = list(state.velocity), list(state.momentum), list(state.average_gradient)
        updates: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                updates.append(None)
                continue
            dtype = vel[i].dtype
            g = tf.cast(dense(g), dtype)
            r = tf.cast(rho(), dtype)
            vel[i] = r * vel[i] + one_minus(rho, dtype) * tf.square(g)
            if cfg.centered:
                avgs[i] = r * avgs[i] + one_minus(rho, dtype) * g
                denominator = vel[i] - tf.square(avgs[i]) + cfg.epsilon
            else:
                denominator = vel[i] + cfg.epsilon
            increment = tf.cast(lr(), dtype) * g / tf.sqrt(denominator)
            if uses_momentum:
                moms[i] = tf.cast(mom(), dtype) * moms[i] + increment
                increment = moms[i]
            updates.append(increment)
        return updates, RMSpropState(vel, moms, avgs)

    return Transform(init, update)


@attrs.frozen(kw_only=True)
class FtrlConfig:
    """Config of ``ftrl`` (Follow The Regularized Leader, Keras ``Ftrl``).

    Attributes:
        learning_rate: step size (> 0).
        learning_rate_power: how the rate shrinks with the accumulator (<= 0).
        initial_accumulator_value: starting value of the squared-gradient sum.
        l1_regularization_strength: L1 strength.
        l2_regularization_strength: L2 strength.
        l2_shrinkage_regularization_strength: magnitude penalty (L2 shrinkage).
        beta: the beta of the FTRL paper; adds ``beta / (2 lr)`` to L2.
    """

    example: ClassVar[dict] = {"learning_rate": 0.5}


    learning_rate: Any = hyperparameter(default=0.001, validator=positive())
    learning_rate_power: float = attrs.field(default=-0.5)
    initial_accumulator_value: float = attrs.field(default=0.1, validator=non_negative())
    l1_regularization_strength: float = attrs.field(default=0.0, validator=non_negative())
    l2_regularization_strength: float = attrs.field(default=0.0, validator=non_negative())
    l2_shrinkage_regularization_strength: float = attrs.field(default=0.0,
                                                              validator=non_negative())
    beta: float = attrs.field(default=0.0, validator=non_negative())

    @learning_rate_power.validator
    def _power(self, attribute: Any, value: float) -> None:
        if value > 0:
            raise ValueError(f"must be <= 0, got {value}")


class FtrlState(NamedTuple):
    accumulator: list[Any]
    linear: list[Any]


def ftrl(cfg: FtrlConfig) -> Transform:
    """Keras ``Ftrl``: the new variable is solved in closed form; the update is the change."""
    lr = hyper(cfg.learning_rate)
    power = cfg.learning_rate_power

    def init(variables: list[Any]) -> FtrlState:
        return FtrlState(zeros_like_vars(variables, cfg.initial_accumulator_value),
                         zeros_like_vars(variables))

    def update(grads: list[Any], state: FtrlState, variables: list[Any]) -> Any:
        import tensorflow as tf

        accs, lins = list(state.accumulator), list(state.linear)
        updates: list[Any] = []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            dtype = accs[i].dtype
            g = tf.cast(dense(g), dtype)
            w = value_of(var, dtype)
            lr_c = tf.cast(lr(), dtype)
            l2 = cfg.l2_regularization_strength + cfg.beta / (2.0 * lr_c)
            grad_to_use = g + 2 * cfg.l2_shrinkage_regularization_strength * w
            new_acc = accs[i] + tf.square(g)
            lins[i] = lins[i] + grad_to_use - (
                (tf.pow(new_acc, -power) - tf.pow(accs[i], -power)) / lr_c) * w
            quadratic = tf.pow(new_acc, -power) / lr_c + 2 * l2
            l1 = cfg.l1_regularization_strength
            new_w = (tf.clip_by_value(lins[i], -l1, l1) - lins[i]) / quadratic
            accs[i] = new_acc
            updates.append(w - new_w)
        return updates, FtrlState(accs, lins)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    rule = Capabilities(update_rule=True)
    register("adagrad", adagrad, AdagradConfig, capabilities=rule)
    register("rmsprop", rmsprop, RMSpropConfig, capabilities=rule)
    register("ftrl", ftrl, FtrlConfig, capabilities=rule)
