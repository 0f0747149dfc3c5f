"""``sm3``: optax's ``sm3`` (Anil et al. 2019, "Memory-Efficient Adaptive
Optimization"), with momentum.

Adagrad whose accumulator is a cover of the variable's axes: one vector per
axis (a row of sums for a matrix's rows, one for its columns), ``sum(shape)``
numbers instead of ``prod(shape)``. Each step, every element's accumulator is
the least of its axes' entries plus ``g^2``; each axis keeps the largest of its
elements' accumulators. The gradient is scaled by its inverse root (0 where
the accumulator is 0), then ``m = (1 - momentum) g' + momentum m`` is the step.
A vector's or a scalar's cover is itself: plain Adagrad. A per-variable rule:
a sparse gradient is made dense first.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    dense,
    hookimpl,
    hyper,
    hyperparameter,
    in_range,
    non_negative,
    slot_dtype,
    zeros_like_vars,
)
from gradpipe.plugins.optax_family import moment

_EPSILON = 1e-8  # optax's sm3 does not expose its scale_by_sm3's eps


@attrs.frozen(kw_only=True)
class SM3Config:
    """Config of ``sm3``, with optax's defaults.

    Attributes:
        learning_rate: step size (a number or a schedule). optax has no default;
            0.001 is Keras's.
        momentum: decay of the momentum of the scaled gradient, in [0, 1].
    """

    example: ClassVar[dict] = {"learning_rate": 0.1}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    momentum: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0))


class SM3State(NamedTuple):
    cover: list[Any]  # per variable: its axes' vectors, end to end (a scalar's: a scalar)
    momentum: list[Any]


def _covered(g: Any, cover: Any) -> tuple[Any, Any]:
    """Each element's accumulator this step, and the new cover of the axes."""
    import tensorflow as tf

    rank = len(g.shape)
    if rank < 2:
        accumulator = tf.square(g) + cover
        return accumulator, accumulator
    axes = tf.split(cover, list(g.shape))
    least = functools.reduce(tf.minimum, [
        tf.reshape(axis, [1] * i + [-1] + [1] * (rank - i - 1)) for i, axis in enumerate(axes)])
    accumulator = tf.square(g) + least
    return accumulator, tf.concat([
        tf.reduce_max(accumulator, axis=[j for j in range(rank) if j != i])
        for i in range(rank)], axis=0)


def sm3(cfg: SM3Config) -> Transform:
    """optax ``sm3``: Adagrad over a cover of the axes, then momentum."""
    lr, beta = hyper(cfg.learning_rate), hyper(cfg.momentum)

    def init(variables: list[Any]) -> SM3State:
        import tensorflow as tf

        return SM3State([tf.zeros([sum(v.shape)] if v.shape.rank else [], slot_dtype(v))
                         for v in variables], zeros_like_vars(variables))

    def update(grads: list[Any], state: SM3State, variables: list[Any]) -> Any:
        import tensorflow as tf

        covers, momenta = list(state.cover), list(state.momentum)
        updates: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                updates.append(None)
                continue
            g = tf.cast(dense(g), momenta[i].dtype)
            accumulator, covers[i] = _covered(g, covers[i])
            scaled = g * tf.where(accumulator > 0, tf.math.rsqrt(accumulator + _EPSILON),
                                  tf.zeros_like(accumulator))
            momenta[i] = moment(scaled, momenta[i], beta)
            updates.append(momenta[i] * tf.cast(lr(), g.dtype))
        return updates, SM3State(covers, momenta)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("sm3", sm3, SM3Config, capabilities=Capabilities(update_rule=True))
