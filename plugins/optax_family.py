"""What the rules that follow optax share (``adabelief``, ``amsgrad``, ``yogi``,
``radam``, ``signum``, ``adamaxw``, ``nadamw``): optax's moment updates, bias
correction and decoupled weight decay, written in optax's order of operations
(``(1 - b) * g + b * m``, where Keras writes ``m + (g - m) * (1 - b)``), so that
float32 results round as optax's do.

A rule is two functions of one variable's gradient and slots: ``advance`` gives
the new slots, ``direction`` the step from the new slots (optax's ``scale_by_*``).
:func:`moments_rule` turns them into a transform: it keeps the step count, runs
them row by row for a sparse gradient with ``lazy = true``, adds optax's
``add_decayed_weights`` where the config has a ``weight_decay``, and scales by
the learning rate. This module registers nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import attrs

from gradpipe.plugin import (
    Transform,
    hyper,
    hyperparameter,
    in_range,
    keep_where_skipped,
    non_negative,
    one_minus,
    path_matches,
    rowwise,
    variable_patterns,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class MomentsConfig:
    """The keys optax's Adam-like rules share, in gradpipe's (Keras's) names.

    Attributes:
        learning_rate: step size (a number or a schedule). optax has no default;
            0.001 is Keras's.
        beta_1: decay of the first moment (optax's ``b1``), in [0, 1).
        beta_2: decay of the second moment (optax's ``b2``), in [0, 1).
        epsilon: added to the root of the second moment (optax's ``eps``).
        lazy: with a sparse gradient (an embedding's), update only the rows it
            touches, of the variable and of its slots; the other rows' moments are
            not decayed that step. Off: a sparse gradient steps as its dense sum.
    """

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    beta_1: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, high_open=True))
    beta_2: Any = hyperparameter(default=0.999, validator=in_range(0.0, 1.0, high_open=True))
    epsilon: float = attrs.field(default=1e-8, validator=non_negative())
    lazy: bool = False


@attrs.frozen(kw_only=True)
class DecayedMomentsConfig(MomentsConfig):
    """The keys of optax's rules that decay weights (``adamw`` and its kin).

    Attributes:
        weight_decay: decoupled decay rate, in optax's order:
            ``var -= learning_rate * (step + weight_decay * var)``.
        exclude_from_weight_decay: regexes of variable paths that are not decayed
            (optax's ``mask``); they are still updated by the rule.
    """

    weight_decay: Any = hyperparameter(default=1e-4, validator=non_negative())
    exclude_from_weight_decay: tuple[str, ...] = variable_patterns()


def moment(new: Any, old: Any, beta: Callable[[], Any]) -> Any:
    """optax's ``update_moment``: ``(1 - beta) * new + beta * old``."""
    import tensorflow as tf

    dtype = old.dtype
    return one_minus(beta, dtype) * new + tf.cast(beta(), dtype) * old


def correction(beta: Callable[[], Any], count: Any) -> Any:
    """``1 - beta ** count`` in float32, as optax computes it before it divides."""
    import tensorflow as tf

    return 1.0 - tf.pow(beta(), tf.cast(count, tf.float32))


def debiased(x: Any, corrected: Any) -> Any:
    """optax's ``bias_correction``: ``x / (1 - beta ** count)``, divided in ``x``'s dtype."""
    import tensorflow as tf

    return x / tf.cast(corrected, x.dtype)


def first_moment(m: Any, g: Any, beta_1: Callable[[], Any], count: Any,
                 nesterov: bool) -> Any:
    """optax's bias-corrected first moment; with ``nesterov``,
    ``b1 * m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1 ** t)``."""
    import tensorflow as tf

    if not nesterov:
        return debiased(m, correction(beta_1, count))
    dtype = m.dtype
    return (tf.cast(beta_1(), dtype) * debiased(m, correction(beta_1, count + 1))
            + one_minus(beta_1, dtype) * debiased(g, correction(beta_1, count)))


class MomentsState(NamedTuple):
    """The state of the rules with a first and a second moment (optax's ``mu``, ``nu``)."""

    count: Any
    mu: list[Any]
    nu: list[Any]


Advance = Callable[[Any, Sequence[Any], Any], Sequence[Any]]
Direction = Callable[[Any, Sequence[Any], Any], Any]


def moments_rule(cfg: Any, state_cls: type[NamedTuple], fills: Sequence[float],
                 advance: Advance, direction: Direction, *, scaled: bool = True) -> Transform:
    """A transform of optax's shape: ``count`` and one slot per variable for each
    of ``fills`` (their initial values), in ``state_cls(count, *slots)``;
    ``advance(g, slots, count)`` gives the new slots and ``direction(g, slots,
    count)`` the step from them. Decoupled weight decay and the learning rate
    follow: ``update = lr * (direction + weight_decay * var)``; not ``scaled``, the
    step is the direction itself (``rprop``'s holds its own step sizes)."""
    lr = hyper(cfg.learning_rate)
    decay = hyper(cfg.weight_decay) if hasattr(cfg, "weight_decay") else None
    if decay is not None and decay.constant == 0:
        decay = None
    excluded = getattr(cfg, "exclude_from_weight_decay", ())

    def init(variables: list[Any]) -> Any:
        import tensorflow as tf

        return state_cls(tf.constant(0, tf.int64),
                         *[zeros_like_vars(variables, fill) for fill in fills])

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1

        def step(g: Any, *rest: Any) -> Any:
            slots, value = rest[:len(fills)], rest[len(fills):]
            dtype = slots[0].dtype
            g = tf.cast(g, dtype)
            # the step from the slots as written: the compiled step writes each once
            new = keep_where_skipped(tuple(advance(g, slots, count)), tuple(slots))
            u = direction(g, new, count)
            if value:  # optax: add_decayed_weights, then scale_by_learning_rate
                u = u + tf.cast(decay(), dtype) * tf.cast(value[0], dtype)  # type: ignore[misc]
            return (u * tf.cast(lr(), dtype) if scaled else u), new

        lists = [list(slot) for slot in state[1:]]
        updates: list[Any] = []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            decays = decay is not None and not path_matches(excluded, var)
            u, new = rowwise(step, g, [slot[i] for slot in lists], lazy=cfg.lazy,
                             extra=[var] if decays else [])
            updates.append(u)
            for slot, value in zip(lists, new):
                slot[i] = value
        return updates, state_cls(count, *lists)

    return Transform(init, update)
