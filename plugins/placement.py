"""The ``default`` placement: no strategy of its own, the current device.

If the pipeline is built inside a user's ``strategy.scope()``, that strategy
is used, and gradients are reduced once across its replicas.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from gradpipe import hookimpl
from gradpipe.fields import one_of


@attrs.frozen(kw_only=True)
class DefaultConfig:
    """Config of ``default``.

    Attributes:
        reduction: ``mean`` divides the loss by the number of replicas and
            sums gradients (CrossShardOptimizer MEAN); ``sum`` does not divide.
    """

    reduction: Literal["mean", "sum"] = attrs.field(default="mean",
                                                    validator=one_of("mean", "sum"))


class CurrentStrategyPlacement:
    """Placement over whatever ``tf.distribute`` strategy is current at build time."""

    def __init__(self, cfg: DefaultConfig) -> None:
        import tensorflow as tf

        self.config = cfg
        self.strategy = tf.distribute.get_strategy()
        self.num_replicas = self.strategy.num_replicas_in_sync

    @property
    def loss_divisor(self) -> int:
        return self.num_replicas if self.config.reduction == "mean" else 1

    def reduce(self, grads: list[Any]) -> list[Any]:
        """SUM all-reduce of the non-None gradients, once, in one batched call."""
        import tensorflow as tf

        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync == 1:
            return grads
        present = [g for g in grads if g is not None]
        reduced = iter(ctx.all_reduce(tf.distribute.ReduceOp.SUM, present))
        return [None if g is None else next(reduced) for g in grads]


@hookimpl
def gradpipe_register_placements(register: Any) -> None:
    register("default", CurrentStrategyPlacement, DefaultConfig)
