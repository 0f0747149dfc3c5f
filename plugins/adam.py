"""``adam`` and ``adamw``: Keras 3 ``Adam`` and ``AdamW`` (keras-team/keras
``optimizers/adam.py``, ``adamw.py``), bias correction folded into the step
size as Keras does, so a pipeline and Keras agree to float32 rounding. The
fused kernel below does ``adam``'s step in place, rounded as Keras rounds it.
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
class AdamConfig:
    """Config of ``adam``.

    Attributes:
        learning_rate: step size (a number or a schedule).
        beta_1: decay of the first moment, in [0, 1).
        beta_2: decay of the second moment, in [0, 1).
        epsilon: added to the root of the second moment.
        amsgrad: use the running maximum of the second moment.
        lazy: with a sparse gradient (an embedding's), update only the rows it
            touches, of the variable and of its moments, as TF Addons' LazyAdam:
            the moments of the other rows are not decayed that step.
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    beta_1: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, high_open=True))
    beta_2: Any = hyperparameter(default=0.999,
                                 validator=in_range(0.0, 1.0, high_open=True))
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())
    amsgrad: bool = False
    lazy: bool = False


@attrs.frozen(kw_only=True)
class AdamWConfig(AdamConfig):
    """Config of ``adamw``: ``adam`` plus decoupled weight decay (Keras ``AdamW``).

    Attributes:
        weight_decay: decay rate; ``var -= var * weight_decay * learning_rate``.
        exclude_from_weight_decay: regexes of variable paths that are not decayed
            (they are still updated by Adam).
    """

    weight_decay: Any = hyperparameter(default=0.004, validator=non_negative())
    exclude_from_weight_decay: tuple[str, ...] = variable_patterns()


class AdamState(NamedTuple):
    count: Any
    mu: list[Any]
    nu: list[Any]
    nu_max: list[Any]


def _step_size(lr: Any, b1: Any, b2: Any, count: Any) -> Any:
    """Keras's ``alpha``: the rate with both bias corrections, at step ``count``."""
    import tensorflow as tf

    step = tf.cast(count, tf.float32)
    return lr * tf.sqrt(1 - tf.pow(b2, step)) / (1 - tf.pow(b1, step))


def adam(cfg: AdamConfig) -> Transform:
    """Keras ``Adam`` (and ``AdamW``), bias correction folded into the step size."""
    lr, beta_1, beta_2 = hyper(cfg.learning_rate), hyper(cfg.beta_1), hyper(cfg.beta_2)
    decay = hyper(cfg.weight_decay) if isinstance(cfg, AdamWConfig) else None
    excluded = cfg.exclude_from_weight_decay if isinstance(cfg, AdamWConfig) else ()

    def decays(var: Any) -> bool:
        return not path_matches(excluded, var)

    def init(variables: list[Any]) -> AdamState:
        import tensorflow as tf

        zeros = zeros_like_vars
        return AdamState(tf.constant(0, tf.int64), zeros(variables), zeros(variables),
                         zeros(variables) if cfg.amsgrad else [])

    def update(grads: list[Any], state: AdamState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1
        alpha = _step_size(lr(), beta_1(), beta_2(), count)

        def step(g: Any, m: Any, v: Any, *rest: Any) -> Any:
            """One variable's step (or its touched rows'); ``rest``: the running
            maximum with ``amsgrad``, then the variable's value where it decays."""
            dtype = m.dtype
            g = tf.cast(g, dtype)
            new = (m + (g - m) * one_minus(beta_1, dtype),
                   v + (tf.square(g) - v) * one_minus(beta_2, dtype))
            # the step from the moments as written: the compiled step writes each once
            m, v = keep_where_skipped(new, (m, v))
            slots, second = [m, v], v
            if cfg.amsgrad:
                second = keep_where_skipped(tf.maximum(rest[0], v), rest[0])
                slots.append(second)
            update = m * tf.cast(alpha, dtype) / (tf.sqrt(second)
                                                  + tf.cast(cfg.epsilon, dtype))
            if decay is not None and len(rest) > cfg.amsgrad:  # Keras: var -= var*wd*lr first
                update += tf.cast(rest[-1], dtype) * tf.cast(decay() * lr(), dtype)
            return update, slots

        updates: list[Any] = []
        mus, nus, maxes = list(state.mu), list(state.nu), list(state.nu_max)
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            slots = [mus[i], nus[i]] + ([maxes[i]] if cfg.amsgrad else [])
            decayed = decay is not None and decays(var)
            update, new = rowwise(step, g, slots, lazy=cfg.lazy,
                                  extra=[var] if decayed else [])
            updates.append(update)
            mus[i], nus[i] = new[0], new[1]
            if cfg.amsgrad:
                maxes[i] = new[2]
        return updates, AdamState(count, mus, nus, maxes)

    return Transform(init, update)


def adam_kernel(cfg: AdamConfig) -> Any:
    """``adam``'s update and ``var -= update`` in place, rounded as Keras 3 rounds it.

    Keras writes ``m.assign_add((g - m) * (1 - beta_1))``, the same for ``v``,
    then ``var.assign_sub(m * alpha / (sqrt(v) + epsilon))``: 12 kernels, each a
    pass over the variable. TF's fused kernels do the same arithmetic in 6:
    ``ResourceApplyGradientDescent(m, 1 - beta_1, m - g)`` computes ``m - (m - g)
    * (1 - beta_1)``, equal to Keras's ``m + (g - m) * (1 - beta_1)`` bit for bit
    (negating a difference or a product is exact), the same for ``v``, and
    ``ResourceApplyAdagradV2(var, v, alpha, epsilon, m, update_slots=False)``
    computes ``var -= m * alpha / (sqrt(v) + epsilon)`` in one pass. Not
    ``ResourceApplyAdam``: it computes ``1 - beta`` in float32, off from Keras by
    1.3e-5 relative for 0.999. The kernels need the variable's dtype to be its
    slots' (half-precision variables, updated through float32 masters, never get
    here)."""
    lr, beta_1, beta_2 = hyper(cfg.learning_rate), hyper(cfg.beta_1), hyper(cfg.beta_2)

    def apply(grads: list[Any], slots: AdamState, variables: list[Any]) -> list[Any]:
        import tensorflow as tf

        count = slots.count.assign_add(1)
        alpha = _step_size(lr(), beta_1(), beta_2(), count)
        ops = [count]
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                continue
            m, v = slots.mu[i], slots.nu[i]
            dtype = m.dtype
            g = tf.cast(dense(g), dtype)
            ops.append(tf.raw_ops.ResourceApplyGradientDescent(
                var=m.handle, alpha=one_minus(beta_1, dtype), delta=m - g))
            ops.append(tf.raw_ops.ResourceApplyGradientDescent(
                var=v.handle, alpha=one_minus(beta_2, dtype), delta=v - tf.square(g)))
            second = v
            if cfg.amsgrad:
                second = slots.nu_max[i]
                ops.append(second.assign(tf.maximum(second, v)))
            ops.append(tf.raw_ops.ResourceApplyAdagradV2(
                var=var.handle, accum=second.handle, lr=tf.cast(alpha, dtype),
                epsilon=tf.cast(cfg.epsilon, dtype), grad=m.read_value(), update_slots=False))
        return ops

    return apply


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    rule = Capabilities(update_rule=True)
    register("adam", adam, AdamConfig, kernel=adam_kernel, capabilities=rule)
    register("adamw", adam, AdamWConfig, capabilities=Capabilities(update_rule=True))
