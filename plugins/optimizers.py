"""Update rules with Keras 3 semantics: ``sgd``, ``adam`` and ``adamw``.

Each rule is the last transform of a chain: its output is the step that is
subtracted from the variable. The formulas follow ``keras.optimizers.SGD`` and
``keras.optimizers.Adam`` exactly (keras-team/keras ``optimizers/sgd.py`` and
``adam.py``), so a pipeline and the Keras optimizer agree to float32 rounding.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe import Transform, hookimpl, hyper, hyperparameter, map_grads, one_minus
from gradpipe.fields import in_range, is_constant, non_negative, variable_patterns
from gradpipe.plugins._tensor import dense as _dense
from gradpipe.plugins._tensor import value_of
from gradpipe.plugins._tensor import zeros_like_vars as _zeros
from gradpipe.transform import require_finite, select_applied, squared_norm

# sqrt of the float32 maximum: an input with a finite sum of squares has no larger element.
_LARGEST_ELEMENT = 2.0**64
# below the float32 maximum (3.4028e38), with room for float32 rounding of the bounded values
_FLOAT32_BOUND = 3.4e38
# the largest Adam step size a schedule is assumed to reach (lr 1, beta_1 0.999)
_SCHEDULED_ALPHA_BOUND = 1e3


# -- SGD ---------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class SGDConfig:
    """Config of ``sgd``.

    Attributes:
        learning_rate: step size (a number or a schedule).
        momentum: heavy-ball momentum in [0, 1]; 0 disables the momentum slot.
        nesterov: use Nesterov momentum.
    """

    example: ClassVar[dict] = {"learning_rate": 0.001, "momentum": 0.9}

    update_rule: ClassVar[bool] = True
    xla_compatible: ClassVar[bool] = True
    predicated: ClassVar[bool] = True
    elementwise: ClassVar[bool] = True

    learning_rate: Any = hyperparameter(default=0.01, validator=non_negative())
    momentum: Any = hyperparameter(default=0.0, validator=in_range(0.0, 1.0))
    nesterov: bool = False

    @property
    def preserves_finite(self) -> bool:
        """When the rate and momentum are constants, momentum < 1.

        |m| <= lr * max|g| / (1 - momentum) and max|g| <= 2**64: finite while that
        bound stays below the float32 maximum (a schedule's history is not known to
        the bound: such updates are checked element by element)."""
        lr, mu = self.learning_rate, self.momentum
        return (isinstance(lr, float) and isinstance(mu, float) and mu < 1
                and lr * _LARGEST_ELEMENT / (1 - mu) * (1 + mu) < _FLOAT32_BOUND)


class SGDState(NamedTuple):
    momentum: list[Any]


def sgd(cfg: SGDConfig) -> Transform:
    """Keras ``SGD``: ``m = momentum*m - lr*g``; ``var += m`` (or the Nesterov form)."""
    lr = hyper(cfg.learning_rate)
    momentum = hyper(cfg.momentum)
    uses_momentum = not (isinstance(cfg.momentum, float) and cfg.momentum == 0.0)

    def init(variables: list[Any]) -> Any:
        return SGDState(_zeros(variables)) if uses_momentum else ()

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        lr_t = lr()
        if not uses_momentum:
            def plain(g: Any) -> Any:
                if isinstance(g, tf.IndexedSlices):  # stays sparse
                    return tf.IndexedSlices(g.values * tf.cast(lr_t, g.values.dtype),
                                            g.indices, g.dense_shape)
                return g * tf.cast(lr_t, g.dtype)
            return map_grads(plain, grads), state
        mu = momentum()
        new_m, updates = [], []
        for g, m in zip(grads, state.momentum):
            if g is None:
                new_m.append(m)
                updates.append(None)
                continue
            g = tf.cast(_dense(g), m.dtype)
            lr_c, mu_c = tf.cast(lr_t, m.dtype), tf.cast(mu, m.dtype)
            m = select_applied(m * mu_c - g * lr_c, m)
            new_m.append(m)
            updates.append(-(m * mu_c - g * lr_c) if cfg.nesterov else -m)
        return updates, SGDState(new_m)

    def apply(grads: list[Any], slots: Any, variables: list[Any]) -> list[Any]:
        """In place with TF's fused kernels, which compute exactly Keras's formulas:
        ``ResourceApplyKerasMomentum`` (``m = m*mu - g*lr; var += m``) or
        ``ResourceApplyGradientDescent`` (``var -= lr*g``)."""
        import tensorflow as tf

        lr_t = lr()
        ops = []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                continue
            dtype = var.dtype
            g = tf.cast(_dense(g), dtype)
            if uses_momentum:
                ops.append(tf.raw_ops.ResourceApplyKerasMomentum(
                    var=var.handle, accum=slots.momentum[i].handle, lr=tf.cast(lr_t, dtype),
                    grad=g, momentum=tf.cast(momentum(), dtype), use_nesterov=cfg.nesterov))
            else:
                ops.append(tf.raw_ops.ResourceApplyGradientDescent(
                    var=var.handle, alpha=tf.cast(lr_t, dtype), delta=g))
        return ops

    return Transform(init, update, apply)


# -- Adam --------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AdamConfig:
    """Config of ``adam``.

    Attributes:
        learning_rate: step size (a number or a schedule).
        beta_1: decay of the first moment, in [0, 1).
        beta_2: decay of the second moment, in [0, 1).
        epsilon: added to the root of the second moment.
        amsgrad: use the running maximum of the second moment.
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    update_rule: ClassVar[bool] = True
    xla_compatible: ClassVar[bool] = True
    predicated: ClassVar[bool] = True
    elementwise: ClassVar[bool] = True

    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    beta_1: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, high_open=True))
    beta_2: Any = hyperparameter(default=0.999,
                                 validator=in_range(0.0, 1.0, high_open=True))
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())
    amsgrad: bool = False

    @property
    def preserves_finite(self) -> bool:
        """When ``epsilon > 0`` and the step size is known to stay small enough.

        |m| stays below the largest input element (2**64), so the step
        ``alpha * |m| / (sqrt(v) + epsilon)`` stays below ``alpha * 2**64 /
        epsilon``: finite while that is below the float32 maximum (0/0 for
        epsilon = 0). The bound must hold for the largest ``alpha`` the config
        allows: ``lr / (1 - beta_1)`` for a constant rate and beta_1, proved
        here once for every step, and 1,000 (a rate of 1 with beta_1 = 0.999)
        for a scheduled one, where every step also requires the bound of its
        own ``alpha`` (a step beyond it is skipped, never applied). Otherwise
        (a rate above about 9e10, or epsilon below about 5e-17) every update
        element is checked instead."""
        if self.epsilon <= 0:
            return False
        largest_alpha = self.constant_step_size_bound
        if largest_alpha is None:
            largest_alpha = _SCHEDULED_ALPHA_BOUND
        return largest_alpha * _LARGEST_ELEMENT / self.epsilon < _FLOAT32_BOUND

    @property
    def constant_step_size_bound(self) -> float | None:
        """An upper bound of every step's ``alpha`` for a constant rate and beta_1:
        ``2 * lr / (1 - float32(beta_1))`` (``None`` if either is scheduled). The
        factor 2 covers alpha's float32 rounding."""
        lr, b1 = self.learning_rate, self.beta_1
        if not (is_constant(lr) and is_constant(b1)):
            return None
        one_minus_b1 = 1.0 - struct.unpack("f", struct.pack("f", b1))[0]
        return 2 * lr / one_minus_b1 if one_minus_b1 > 0 else float("inf")


class AdamState(NamedTuple):
    count: Any
    mu: list[Any]
    nu: list[Any]
    nu_max: list[Any]


def adam(cfg: AdamConfig) -> Transform:
    """Keras ``Adam``, bias correction folded into the step size as Keras does."""
    return _adam(cfg, weight_decay=None)


@attrs.frozen(kw_only=True)
class AdamWConfig(AdamConfig):
    """Config of ``adamw``: ``adam`` plus decoupled weight decay (Keras ``AdamW``).

    Attributes:
        weight_decay: decay rate; ``var -= var * weight_decay * learning_rate``.
        exclude_from_weight_decay: regexes of variable paths that are not decayed
            (they are still updated by Adam).
    """

    # reads the variables, and excludes some by path
    elementwise: ClassVar[bool] = False

    weight_decay: Any = hyperparameter(default=0.004, validator=non_negative())
    exclude_from_weight_decay: tuple[str, ...] = variable_patterns()

    @property
    def preserves_finite(self) -> bool:
        """``var * weight_decay * lr`` is unbounded in ``var``: updates are checked."""
        return False


def adamw(cfg: AdamWConfig) -> Transform:
    """Keras ``AdamW``: Adam, then ``+ var * weight_decay * lr`` on non-excluded variables."""
    return _adam(cfg, weight_decay=hyper(cfg.weight_decay))


def _adam(cfg: Any, weight_decay: Any) -> Transform:
    import re

    from gradpipe.names import variable_path

    lr, beta_1, beta_2 = hyper(cfg.learning_rate), hyper(cfg.beta_1), hyper(cfg.beta_2)
    exclude = getattr(cfg, "exclude_from_weight_decay", ())
    # preserves_finite proved the step-size bound for every step of a constant rate and
    # beta_1 (alpha <= lr / (1 - beta_1)): checking it again each step would be dead work
    bound_always_holds = cfg.constant_step_size_bound is not None and cfg.preserves_finite

    def decays(var: Any) -> bool:
        return weight_decay is not None and not any(
            re.search(p, variable_path(var)) for p in exclude)

    def step_size(count: Any, b1: Any, b2: Any) -> Any:
        """Keras's ``alpha``: the rate with both bias corrections, at step ``count``."""
        import tensorflow as tf

        step = tf.cast(count, tf.float32)
        return lr() * tf.sqrt(1 - tf.pow(b2, step)) / (1 - tf.pow(b1, step))

    def init(variables: list[Any]) -> AdamState:
        import tensorflow as tf

        return AdamState(tf.constant(0, tf.int64), _zeros(variables), _zeros(variables),
                         _zeros(variables) if cfg.amsgrad else [])

    def update(grads: list[Any], state: AdamState, variables: list[Any]) -> Any:
        import tensorflow as tf

        b1, b2 = beta_1(), beta_2()  # once: a scheduled beta is evaluated per call
        count = state.count + 1
        alpha32 = step_size(count, b1, b2)
        count = select_applied(count, state.count)
        if cfg.epsilon > 0:  # what makes every update finite (see preserves_finite)
            require_finite(squared_norm(grads))
            if not bound_always_holds:
                # the bound in float64, compared with float32's maximum: NaN/Inf fail too
                bound = tf.cast(alpha32, tf.float64) * (_LARGEST_ELEMENT / cfg.epsilon)
                require_finite(bound < _FLOAT32_BOUND)
            if beta_1.constant is None or beta_2.constant is None:  # validated if constant
                require_finite((b1 >= 0) & (b1 < 1) & (b2 >= 0) & (b2 < 1))
        updates, mus, nus = [], [], []
        maxes = list(state.nu_max)
        for i, (g, m, v) in enumerate(zip(grads, state.mu, state.nu)):
            if g is None:
                updates.append(None)
                mus.append(m)
                nus.append(v)
                continue
            dtype = m.dtype
            g = tf.cast(_dense(g), dtype)
            # The step is computed from the state as written, skipped or not: then XLA
            # needs no copy of the old state (see select_applied).
            m, v = select_applied((m + (g - m) * one_minus(beta_1, dtype),
                                   v + (tf.square(g) - v) * one_minus(beta_2, dtype)), (m, v))
            mus.append(m)
            nus.append(v)
            denom_v = v
            if cfg.amsgrad:
                maxes[i] = select_applied(tf.maximum(maxes[i], v), maxes[i])
                denom_v = maxes[i]
            step_update = m * tf.cast(alpha32, dtype) / (tf.sqrt(denom_v)
                                                          + tf.cast(cfg.epsilon, dtype))
            var = variables[i]
            if decays(var):  # Keras: var -= var * wd * lr before the Adam step
                step_update += value_of(var, dtype) * tf.cast(weight_decay() * lr(), dtype)
            if dtype.size < 4:  # the bounds above hold for float32 and float64 only
                require_finite(tf.reduce_all(tf.math.is_finite(step_update)))
            updates.append(step_update)
        return updates, AdamState(count, mus, nus, maxes)

    def apply(grads: list[Any], slots: AdamState, variables: list[Any]) -> list[Any]:
        """``update`` and the subtraction done in place, rounded as Keras 3 rounds it.

        Keras writes ``m.assign_add((g - m) * (1 - beta_1))``, the same for ``v``,
        then ``var.assign_sub(m * alpha / (sqrt(v) + epsilon))``: 12 kernels, each a
        pass over the variable's size. TF's fused kernels do the same arithmetic in 6:
        ``ResourceApplyGradientDescent(m, 1 - beta_1, m - g)`` computes ``m - (m - g)
        * (1 - beta_1)``, equal to Keras's ``m + (g - m) * (1 - beta_1)`` bit for bit
        (negating a difference or a product is exact), the same for ``v``, and
        ``ResourceApplyAdagradV2(var, v, alpha, epsilon, m, update_slots=False)``
        computes ``var -= m * alpha / (sqrt(v) + epsilon)`` in one pass. TF orders
        each kernel after the previous one on the same variable. Not
        ``ResourceApplyAdam``: it computes ``1 - beta`` in float32, off from Keras
        by 1.3e-5 relative for 0.999; Keras semantics win. The kernels need the
        variable's dtype to be its slots': float16 and bfloat16 variables never get
        here, as they have float32 masters (``gradpipe.in_place.can_apply_in_place``)."""
        import tensorflow as tf

        count = slots.count.assign_add(1)
        alpha32 = step_size(count, beta_1(), beta_2())
        ops = [count]
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                continue
            m, v = slots.mu[i], slots.nu[i]
            dtype = m.dtype
            g = tf.cast(_dense(g), dtype)
            ops.append(tf.raw_ops.ResourceApplyGradientDescent(
                var=m.handle, alpha=one_minus(beta_1, dtype), delta=m - g))
            ops.append(tf.raw_ops.ResourceApplyGradientDescent(
                var=v.handle, alpha=one_minus(beta_2, dtype), delta=v - tf.square(g)))
            denom_v = v
            if cfg.amsgrad:
                denom_v = slots.nu_max[i]
                ops.append(denom_v.assign(tf.maximum(denom_v, v)))
            ops.append(tf.raw_ops.ResourceApplyAdagradV2(
                var=var.handle, accum=denom_v.handle, lr=tf.cast(alpha32, dtype),
                epsilon=tf.cast(cfg.epsilon, dtype), grad=m.read_value(), update_slots=False))
        return ops

    # adamw subtracts its decay with the Adam step, in one update: no in-place form
    return Transform(init, update, apply if weight_decay is None else None)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("sgd", sgd, SGDConfig)
    register("adam", adam, AdamConfig)
    register("adamw", adamw, AdamWConfig)
