"""``proximal_adagrad``: Adagrad with a proximal (FOBOS) step for L1 and L2
regularisation (Duchi and Singer 2009, "Efficient Learning using
Forward-Backward Splitting"), as TF Addons ``tfa.optimizers.ProximalAdagrad``
computes it: that class calls TensorFlow's ``ResourceApplyProximalAdagrad`` and
``ResourceSparseApplyProximalAdagrad`` kernels, whose maths is written here
with TensorFlow ops, in the kernels' order, per element::

    acc  = acc + g^2
    rate = learning_rate * rsqrt(acc)
    v    = w - g * rate                                  # the Adagrad step
    w    = sign(v) * max(|v| - rate * l1, 0) / (1 + l2 * rate)   # l1 > 0
    w    = v / (1 + l2 * rate)                                   # l1 = 0

The prox step soft-thresholds by ``rate * l1`` (elements that cross 0 stop
there) and shrinks by ``1 + rate * l2``. The engine subtracts the update, so
the update is ``w - w_new``; without regularisation it is ``g * rate``,
which subtracts exactly as the kernel does.

There is no epsilon: the accumulator starts at ``initial_accumulator_value``,
which must be positive here. TF Addons accepts 0, where an element whose first
gradient is 0 computes ``0 * rsqrt(0)``, NaN, and a step with a NaN is skipped
whole: training would never move.

Sparse gradients. TF Addons' sparse kernel steps only the rows a gradient
touches (duplicate indices summed first, by Keras's optimizer base class):
that is ``lazy = true``. By default a sparse gradient steps as its dense sum,
whose zero rows are still shrunk by ``l1`` and ``l2``. Without ``l1`` and
``l2`` the two are the same step, and the rows are stepped alone.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    hookimpl,
    hyper,
    hyperparameter,
    non_negative,
    positive,
    rowwise,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class ProximalAdagradConfig:
    """Config of ``proximal_adagrad`` (TF Addons ``ProximalAdagrad``; its names
    and defaults).

    Attributes:
        learning_rate: step size (a number or a schedule), divided by the
            root of each element's accumulator.
        initial_accumulator_value: starting value of the squared-gradient sum
            (> 0: there is no epsilon).
        l1_regularization_strength: L1 strength: each step soft-thresholds the
            element by ``rate * l1``.
        l2_regularization_strength: L2 strength: each step divides the element
            by ``1 + rate * l2``.
        lazy: with a sparse gradient (an embedding's), update only the rows it
            touches, of the variable and of its accumulator, as TF Addons'
            sparse kernel does. Off: a sparse gradient steps as its dense sum,
            whose untouched rows are still shrunk by ``l1`` and ``l2``.
    """

    example: ClassVar[dict] = {"learning_rate": 0.5}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    initial_accumulator_value: float = attrs.field(default=0.1, validator=positive())
    l1_regularization_strength: float = attrs.field(default=0.0, validator=non_negative())
    l2_regularization_strength: float = attrs.field(default=0.0, validator=non_negative())
    lazy: bool = False


class ProximalAdagradState(NamedTuple):
    accumulator: list[Any]


def proximal_adagrad(cfg: ProximalAdagradConfig) -> Transform:
    """TF Addons ``ProximalAdagrad``: an Adagrad step, then the L1/L2 prox step."""
    lr = hyper(cfg.learning_rate)
    l1, l2 = cfg.l1_regularization_strength, cfg.l2_regularization_strength
    regularised = l1 > 0 or l2 > 0
    # unregularised, a zero row's step is exactly 0: stepping the rows alone is exact
    lazy = cfg.lazy or not regularised

    def init(variables: list[Any]) -> ProximalAdagradState:
        return ProximalAdagradState(zeros_like_vars(variables, cfg.initial_accumulator_value))

    def step(g: Any, acc: Any, *value: Any) -> Any:
        import tensorflow as tf

        dtype = acc.dtype
        g = tf.cast(g, dtype)
        acc = acc + tf.square(g)
        rate = tf.cast(lr(), dtype) * tf.math.rsqrt(acc)
        if not regularised:
            return g * rate, (acc,)
        w = tf.cast(value[0], dtype)
        v = w - g * rate
        shrink = 1 + tf.constant(l2, dtype) * rate
        if l1 > 0:  # the kernel's branch on l1 > 0, decided here once
            new = tf.sign(v) * tf.maximum(tf.abs(v) - rate * tf.constant(l1, dtype), 0) / shrink
        else:
            new = v / shrink
        return w - new, (acc,)

    def update(grads: list[Any], state: ProximalAdagradState, variables: list[Any]) -> Any:
        accs = list(state.accumulator)
        updates: list[Any] = []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            u, (accs[i],) = rowwise(step, g, [accs[i]], lazy=lazy,
                                    extra=[var] if regularised else [])
            updates.append(u)
        return updates, ProximalAdagradState(accs)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("proximal_adagrad", proximal_adagrad, ProximalAdagradConfig,
             capabilities=Capabilities(update_rule=True))
