"""Exponential moving average of weights for gradpipe, with a swap for evaluation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import attrs

from gradpipe.plugin import Capabilities, Transform, hookimpl, hyper, hyperparameter, in_range

GRADPIPE_PLUGIN_API = 2


@attrs.frozen(kw_only=True)
class EMAConfig:
    """Config of ``ema``.

    Attributes:
        momentum: weight of the old average (Keras ``ema_momentum``).
    """

    momentum: Any = hyperparameter(default=0.99, validator=in_range(0.0, 1.0))


class EMAState(NamedTuple):
    count: Any
    average: list[Any]


def ema(cfg: EMAConfig) -> Transform:
    """Average ``w - update`` (the new weights); pass the updates through."""
    momentum = hyper(cfg.momentum)

    def init(variables: list[Any]) -> EMAState:
        import tensorflow as tf

        return EMAState(tf.constant(0, tf.int64),
                        [tf.identity(tf.convert_to_tensor(v)) for v in variables])

    def update(updates: list[Any], state: EMAState, variables: list[Any]) -> Any:
        import tensorflow as tf

        averages = []
        for u, var, avg in zip(updates, variables, state.average):
            if u is None:
                averages.append(avg)
                continue
            new = tf.convert_to_tensor(var) - tf.cast(tf.convert_to_tensor(u), var.dtype)
            # Keras: momentum 0 while iterations == 0, so the first average is w_1.
            m = tf.where(state.count == 0, tf.zeros([], avg.dtype),
                         tf.cast(momentum(), avg.dtype))
            averages.append(m * avg + (1 - m) * tf.cast(new, avg.dtype))
        return updates, EMAState(state.count + 1, averages)

    return Transform(init, update)


@contextlib.contextmanager
def swap_ema(pipe: Any) -> Iterator[None]:
    """Put the averaged weights into the variables; restore the trained ones after."""
    import tensorflow as tf

    slots = pipe.transform_state("ema")
    variables = pipe.model_variables
    averages = [slots[name] for name in slots if name.startswith("average/")]
    saved = [tf.identity(v) for v in variables]
    for var, avg in zip(variables, averages):
        var.assign(tf.cast(avg, var.dtype))
    try:
        yield
    finally:
        for var, value in zip(variables, saved):
            var.assign(value)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("ema", ema, EMAConfig, capabilities=Capabilities(after_update_rule=True))
