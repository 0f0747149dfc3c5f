"""Large-batch rules: ``larc`` (OpenSeq2Seq), ``lamb`` (Keras 3) and ``lars`` (optax).

``larc`` is a gradient transform placed before an update rule, exactly as
OpenSeq2Seq's ``optimize_loss(larc_params=...)`` applies it; it cannot share a
pipeline with ``clip_by_global_norm`` (the reference raises). ``lamb`` and
``lars`` are update rules with layer-wise trust ratios.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    FieldError,
    Transform,
    dense,
    hookimpl,
    hyper,
    hyperparameter,
    in_range,
    map_grads,
    map_values,
    non_negative,
    norm,
    one_minus,
    one_of,
    positive,
    value_of,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class LarcConfig:
    """Config of ``larc``.

    Attributes:
        eta: the LARC trust coefficient (OpenSeq2Seq ``larc_eta``).
        mode: ``clip`` caps the local rate at the global one; ``scale`` does not.
        min_update: lower bound of the factor.
        epsilon: added to the gradient norm.
        learning_rate: the update rule's learning rate (``"@lr"``); needed by ``clip``.
    """

    example: ClassVar[dict] = {"eta": 0.002, "learning_rate": 0.1}


    eta: float = attrs.field(validator=positive())
    mode: Literal["clip", "scale"] = attrs.field(default="clip",
                                                 validator=one_of("clip", "scale"))
    min_update: float = attrs.field(default=1e-7, validator=non_negative())
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())
    learning_rate: Any = hyperparameter(default=None, validator=positive())

    def __attrs_post_init__(self) -> None:
        if self.mode == "clip" and self.learning_rate is None:
            raise FieldError("learning_rate", "is required in mode 'clip': give the update "
                             "rule's learning rate, e.g. learning_rate = \"@lr\"")


def larc(cfg: LarcConfig) -> Transform:
    """``g *= min(max(eta ||v|| / (lr (||g|| + eps)), min_update), 1)`` (``clip``)."""
    lr = hyper(cfg.learning_rate) if cfg.learning_rate is not None else None

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        return map_grads(scale, grads, variables), state

    def scale(g: Any, var: Any) -> Any:
        import tensorflow as tf

        ratio = cfg.eta * norm(var) / (norm(g) + cfg.epsilon)
        if cfg.mode == "clip":
            assert lr is not None
            rate = lr()
            # At lr = 0 (a warm-up's first step) the reference's ratio / lr is +inf
            # and its factor 1: the gradient passes whole, and a rule's moments see
            # it. sign(ratio) is that limit (0 for zero weights, where the
            # reference's 0/0 is NaN), without dividing by 0.
            scaled = tf.where(rate > 0, tf.math.divide_no_nan(ratio, rate), tf.sign(ratio))
            factor = tf.minimum(tf.maximum(scaled, cfg.min_update), 1.0)
        else:
            factor = tf.maximum(ratio, cfg.min_update)
        return map_values(g, lambda x: tf.saturate_cast(factor, x.dtype) * x)

    return Transform(lambda variables: (), update)


@attrs.frozen(kw_only=True)
class LambConfig:
    """Config of ``lamb`` (Keras 3 ``Lamb``).

    Attributes:
        learning_rate: step size.
        beta_1: decay of the first moment.
        beta_2: decay of the second moment.
        epsilon: added to the root of the second moment.
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}


    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    beta_1: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, high_open=True))
    beta_2: Any = hyperparameter(default=0.999, validator=in_range(0.0, 1.0, high_open=True))
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())


class MomentsState(NamedTuple):
    count: Any
    mu: list[Any]
    nu: list[Any]


def lamb(cfg: LambConfig) -> Transform:
    """Adam direction ``u`` rescaled per tensor by ``||w|| / ||u||``, then ``lr * ratio * u``."""
    lr, beta_1, beta_2 = hyper(cfg.learning_rate), hyper(cfg.beta_1), hyper(cfg.beta_2)

    def init(variables: list[Any]) -> MomentsState:
        import tensorflow as tf

        return MomentsState(tf.constant(0, tf.int64), zeros_like_vars(variables),
                            zeros_like_vars(variables))

    def update(grads: list[Any], state: MomentsState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1
        mus, nus, updates = list(state.mu), list(state.nu), list[Any]()
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            dtype = mus[i].dtype
            g = tf.cast(dense(g), dtype)
            step = tf.cast(count, dtype)
            b1, b2 = tf.cast(beta_1(), dtype), tf.cast(beta_2(), dtype)
            mus[i] = mus[i] + (g - mus[i]) * one_minus(beta_1, dtype)
            nus[i] = nus[i] + (tf.square(g) - nus[i]) * one_minus(beta_2, dtype)
            m_hat = mus[i] / (1.0 - tf.pow(b1, step))
            v_sqrt = tf.sqrt(nus[i] / (1.0 - tf.pow(b2, step))) + cfg.epsilon
            direction = m_hat / v_sqrt
            w_norm = tf.sqrt(tf.reduce_sum(tf.square(value_of(var, dtype))))
            u_norm = tf.sqrt(tf.reduce_sum(tf.square(direction)))
            one = tf.ones_like(w_norm)
            ratio = tf.where(w_norm > 0, tf.where(u_norm > 0, w_norm / u_norm, one), one)
            updates.append(ratio * tf.cast(lr(), dtype) * direction)
        return updates, MomentsState(count, mus, nus)

    return Transform(init, update)


@attrs.frozen(kw_only=True)
class LarsConfig:
    """Config of ``lars`` (You et al. 2017, as ``optax.lars`` composes it).

    Attributes:
        learning_rate: step size.
        momentum: momentum of the trace.
        weight_decay: added to the gradient before the trust ratio.
        trust_coefficient: scales ``||w|| / ||g||``.
        epsilon: added to the gradient norm.
        nesterov: Nesterov form of the momentum.
    """

    example: ClassVar[dict] = {"learning_rate": 1.0, "trust_coefficient": 0.02}


    learning_rate: Any = hyperparameter(default=0.1, validator=non_negative())
    momentum: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0))
    weight_decay: Any = hyperparameter(default=0.0, validator=non_negative())
    trust_coefficient: float = attrs.field(default=0.001, validator=positive())
    epsilon: float = attrs.field(default=0.0, validator=non_negative())
    nesterov: bool = False


class TraceState(NamedTuple):
    trace: list[Any]


def lars(cfg: LarsConfig) -> Transform:
    """``u = lr * tc ||w|| / (||g + wd w|| + eps) * (g + wd w)``; momentum trace of ``u``."""
    lr, mom, wd = hyper(cfg.learning_rate), hyper(cfg.momentum), hyper(cfg.weight_decay)

    def init(variables: list[Any]) -> TraceState:
        return TraceState(zeros_like_vars(variables))

    def update(grads: list[Any], state: TraceState, variables: list[Any]) -> Any:
        import tensorflow as tf

        traces, updates = list(state.trace), list[Any]()
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            dtype = traces[i].dtype
            w = value_of(var, dtype)
            g = tf.cast(dense(g), dtype) + tf.cast(wd(), dtype) * w
            w_norm, g_norm = tf.norm(w), tf.norm(g)
            ratio = cfg.trust_coefficient * w_norm / (g_norm + cfg.epsilon)
            ratio = tf.where(tf.logical_or(w_norm == 0, g_norm == 0), tf.ones_like(ratio), ratio)
            u = tf.cast(lr(), dtype) * ratio * g
            m = tf.cast(mom(), dtype)
            traces[i] = u + m * traces[i]
            updates.append(u + m * traces[i] if cfg.nesterov else traces[i])
        return updates, TraceState(traces)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("larc", larc, LarcConfig, capabilities=Capabilities(before_update_rule=True,
                                                                 conflicts={
        "clip_by_global_norm": "LARC and gradient norm clipping should not be used "
                               "together (OpenSeq2Seq raises AttributeError)"}))
    rule = Capabilities(update_rule=True)
    register("lamb", lamb, LambConfig, capabilities=rule)
    register("lars", lars, LarsConfig, capabilities=rule)
