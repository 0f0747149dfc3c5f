"""``cocob``: COCOB-Backprop (Orabona and Tommasi 2017, "Training Deep Networks
without Learning Rates Through Coin Betting", arXiv:1705.07795), as TF Addons
``tfa.optimizers.COCOB`` computes it.

There is no learning rate: each element bets a fraction of its "wealth" on the
sign of the negative gradient. Per element, with ``t`` steps of gradients ``g``:

* ``L = max(L, |g|)``, the largest gradient seen (TF Addons' slot ``lr``,
  started at 1e-8 so that nothing divides by 0);
* ``G = G + g`` (``gradients_sum``) and ``S = S + |g|`` (``grad_norm_sum``);
* ``R = max(R - g x, 0)``, the reward, ``x`` the element's offset from where
  it started (``tilde_w``);
* ``x_new = -G / (L max(S + L, alpha L)) * (R + L)``, and the variable moves
  by ``x_new - x``: TF Addons writes ``w = w - x + x_new``.

``alpha`` caps the first bets (the paper's ``alpha = 100``): while ``S`` is
small the denominator is ``alpha L^2``, so an element's first step is
``-sign(g) / alpha``, whatever the gradient's scale.

The state holds the offset ``x`` from the starting point, never the starting
point itself (no copy of the variable): the start is whatever the variable
holds when the first step is applied, so weights loaded after the pipeline
was built are where the betting starts. The update is ``x - x_new``, not
TF Addons' ``w - ((w - x) + x_new)``: the same step to float32 rounding, and
exactly 0 where the gradient is 0.

Sparse gradients. TF Addons raises ``NotImplementedError`` for them. Here a
zero gradient leaves every slot as it was and gives ``x_new = x`` (the same
operations on the same numbers as the step that wrote ``x``), so an element
no gradient touches would not move under the dense step either: the rows of
an IndexedSlices gradient (duplicates summed) are stepped alone, and that is
exactly the step of its dense sum. No ``lazy`` key is needed.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import Capabilities, Transform, at_least, hookimpl, rowwise, zeros_like_vars

# TF Addons' initial value of the largest-gradient slot ``lr``
INITIAL_SCALE = 1e-8


@attrs.frozen(kw_only=True)
class CocobConfig:
    """Config of ``cocob`` (TF Addons ``COCOB``; its name and default).

    Attributes:
        alpha: caps the first steps: the bet's denominator is at least
            ``alpha`` times the largest gradient squared, so the first step is
            ``1 / alpha``. At least 1 (TF Addons' check); 100, the paper's, by
            default.
    """

    example: ClassVar[dict] = {"alpha": 100.0}

    alpha: float = attrs.field(default=100.0, validator=at_least(1.0))


class CocobState(NamedTuple):
    """TF Addons' five slots, by its names."""

    lr: list[Any]  # the largest |g| seen (the paper's L), from 1e-8
    grad_norm_sum: list[Any]
    gradients_sum: list[Any]
    tilde_w: list[Any]  # the offset from the starting point
    reward: list[Any]


def cocob(cfg: CocobConfig) -> Transform:
    """COCOB-Backprop: per-element coin betting, no learning rate."""

    def init(variables: list[Any]) -> CocobState:
        return CocobState(zeros_like_vars(variables, INITIAL_SCALE), zeros_like_vars(variables),
                          zeros_like_vars(variables), zeros_like_vars(variables),
                          zeros_like_vars(variables))

    def step(g: Any, scale: Any, norm_sum: Any, grad_sum: Any, offset: Any,
             reward: Any) -> Any:
        import tensorflow as tf

        g = tf.cast(g, scale.dtype)
        # TF Addons' operations, in its order
        scale = tf.maximum(scale, tf.abs(g))
        grad_sum = grad_sum + g
        norm_sum = norm_sum + tf.abs(g)
        reward = tf.maximum(reward - g * offset, 0)
        bound = tf.maximum(norm_sum + scale, tf.cast(cfg.alpha, scale.dtype) * scale)
        new_offset = -grad_sum / (scale * bound) * (reward + scale)
        return offset - new_offset, (scale, norm_sum, grad_sum, new_offset, reward)

    def update(grads: list[Any], state: CocobState, variables: list[Any]) -> Any:
        slots = [list(s) for s in state]
        updates: list[Any] = []
        for i, g in enumerate(grads):
            if g is None:
                updates.append(None)
                continue
            # lazy is exact here: see the module's docstring
            u, new = rowwise(step, g, [s[i] for s in slots], lazy=True)
            updates.append(u)
            for s, value in zip(slots, new):
                s[i] = value
        return updates, CocobState(*slots)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("cocob", cocob, CocobConfig, capabilities=Capabilities(update_rule=True))
