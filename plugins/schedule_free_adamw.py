"""``schedule_free_adamw``: Keras 3 ``ScheduleFreeAdamW``
(keras-team/keras ``optimizers/schedule_free_adamw.py``; Defazio et al. 2024).

Three sequences: ``z`` takes the Adam-normalised gradient steps, ``x`` is the
running average of ``z`` (weight ``1/t``), and the model's variables hold
``y = (1 - beta_1) z + beta_1 x``, where gradients are taken. Keras keeps
``z`` in a slot initialised to a copy of the variable and recovers ``x_old``
from ``y`` and ``z``. Here the slot holds ``z - y`` instead (``z_minus_y``,
zeros at the start): ``z = y + z_minus_y`` is the same point, the state does
not depend on the variables' values when it is created (so it may be packed,
and weights loaded after the pipeline was built are not overwritten by
stale copies), and the step is Keras's to float32 rounding.

Evaluating at the averaged point. ``x``, the point the paper evaluates and
returns, is ``y - (1 - beta_1) / beta_1 * (z - y)``, with the ``beta_1`` of
the last step (kept in the state). Keras 3.15's ``ScheduleFreeAdamW`` has no
train/eval switch: ``model.evaluate`` and ``model.save`` see ``y``, the
interpolated training point. The reference implementation
(facebookresearch/schedule_free) has ``optimizer.eval()`` / ``optimizer.train()``,
which swap ``x`` into the parameters and back; :func:`averaged_weights` gives
the same here: ``with averaged_weights(pipe): model.evaluate(...)``, and
:func:`averaged_values` returns ``x`` without touching the variables.

Every element of ``y`` moves every step (towards the average), so an
IndexedSlices gradient is densified: a sparse gradient steps like its dense sum.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    Transform,
    at_least,
    dense,
    hookimpl,
    hyper,
    hyperparameter,
    in_range,
    non_negative,
    path_matches,
    value_of,
    variable_patterns,
    zeros_like_vars,
)
from gradpipe.plugins.weight_averaging import pipeline_of, swapped_in

NAME = "schedule_free_adamw"


@attrs.frozen(kw_only=True)
class ScheduleFreeAdamWConfig:
    """Config of ``schedule_free_adamw`` (Keras ``ScheduleFreeAdamW``; names and
    defaults are Keras's).

    Attributes:
        learning_rate: step size (a number or a schedule).
        beta_1: interpolation between ``z`` and ``x``, in (0, 1] (``y`` divides by it).
        beta_2: decay of the second moment, in [0, 1).
        epsilon: added to the root of the bias-corrected second moment.
        warmup_steps: the rate rises linearly over this many steps
            (``lr * min(t / warmup_steps, 1)``); 0: no warmup.
        weight_decay: Keras's base ``weight_decay`` (``None`` there, 0 here: the
            same step); ``y -= y * weight_decay * learning_rate`` before the step.
        exclude_from_weight_decay: regexes of variable paths that are not decayed.
        keras_tf_momentum_read: reproduce Keras 3.15 on the TensorFlow backend bit
            for bit. Keras writes ``momentum_old = momentum.value`` ("Store
            momentum_old before any updates"), but on the TensorFlow backend
            ``.value`` is the live ``tf.Variable``, so ``x_old`` is recovered from
            the ``z`` of *this* step. Then ``y_t = (1 - 1/t) y_(t-1) + z_t / t``:
            the weights are the plain running average of ``z`` (primal averaging),
            ``beta_1`` has no effect on them, and the ``x`` recovered from them is
            no average of anything. Off (the default): the previous ``z``, as the
            paper, facebookresearch/schedule_free and Keras on JAX (where
            ``.value`` is an immutable array) compute it.
    """

    example: ClassVar[dict] = {"learning_rate": 0.05}

    learning_rate: Any = hyperparameter(default=0.0025, validator=non_negative())
    beta_1: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, low_open=True))
    beta_2: Any = hyperparameter(default=0.999, validator=in_range(0.0, 1.0, high_open=True))
    epsilon: float = attrs.field(default=1e-8, validator=non_negative())
    warmup_steps: int = attrs.field(default=0, validator=at_least(0))
    weight_decay: Any = hyperparameter(default=0.0, validator=non_negative())
    exclude_from_weight_decay: tuple[str, ...] = variable_patterns()
    keras_tf_momentum_read: bool = False


class ScheduleFreeState(NamedTuple):
    count: Any
    last_beta_1: Any  # the beta_1 of the last step: x is y - (1 - b1) / b1 * (z - y)
    z_minus_y: list[Any]
    velocity: list[Any]


def schedule_free_adamw(cfg: ScheduleFreeAdamWConfig) -> Transform:
    """Keras ``ScheduleFreeAdamW``; the update is ``y_old - y_new``."""
    lr, beta_1, beta_2 = hyper(cfg.learning_rate), hyper(cfg.beta_1), hyper(cfg.beta_2)
    decay = hyper(cfg.weight_decay)
    decays_at_all = getattr(decay, "constant", None) != 0.0

    def decays(var: Any) -> bool:
        if not decays_at_all or not cfg.exclude_from_weight_decay:
            return decays_at_all  # the path unread: variables packed into one vector have none
        return not path_matches(cfg.exclude_from_weight_decay, var)

    def init(variables: list[Any]) -> ScheduleFreeState:
        import tensorflow as tf

        # b1 = 1 before the first step: z - y is 0 then, and x is y
        return ScheduleFreeState(tf.constant(0, tf.int64), tf.constant(1.0, tf.float32),
                                 zeros_like_vars(variables), zeros_like_vars(variables))

    def update(grads: list[Any], state: ScheduleFreeState, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1
        offsets, velocities = list(state.z_minus_y), list(state.velocity)
        updates: list[Any] = []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            dtype = offsets[i].dtype
            g = tf.cast(dense(g), dtype)
            y = value_of(var, dtype)
            z_old = y + offsets[i]  # Keras's momentum slot, before this step
            rate = tf.cast(lr(), dtype)
            decayed: Any = 0.0
            if decays(var):  # Keras's base optimizer decays y first, at the full rate
                decayed = y * tf.cast(decay(), dtype) * rate
                y = y - decayed
            step = tf.cast(count, dtype)
            b1, b2 = tf.cast(beta_1(), dtype), tf.cast(beta_2(), dtype)
            eps = tf.cast(cfg.epsilon, dtype)
            if cfg.warmup_steps > 0:
                rate = rate * tf.minimum(step / tf.cast(cfg.warmup_steps, dtype), 1.0)
            # Keras computes 1 - beta from the cast tensors (not in Python floats)
            velocities[i] = velocities[i] + (tf.square(g) - velocities[i]) * (1 - b2)
            denom = tf.sqrt(velocities[i] / (1 - tf.pow(b2, step))) + eps
            z = z_old - rate * g / denom
            weight = 1.0 / step
            x_old = (y - (1 - b1) * (z if cfg.keras_tf_momentum_read else z_old)) / b1
            x = (1 - weight) * x_old + weight * z
            y_new = (1 - b1) * z + b1 * x
            offsets[i] = z - y_new
            updates.append(decayed + (y - y_new))
        return updates, ScheduleFreeState(count, tf.cast(beta_1(), tf.float32), offsets,
                                          velocities)

    return Transform(init, update)


def _slots(pipe: Any, which: int | str) -> tuple[list[Any], list[Any], Any]:
    """The pipeline's model variables, their ``z - y`` slots (in the same order),
    and the ``beta_1`` of the last step."""
    state = pipe.transform_state(which)
    variables = pipe.model_variables
    offsets = [v for name, v in state.items() if name.startswith("z_minus_y/")]
    if len(offsets) != len(variables):
        raise ValueError(f"{which!r} keeps {len(offsets)} z_minus_y slots for "
                         f"{len(variables)} variables; build the pipeline first")
    return variables, offsets, state["last_beta_1"]


def averaged_values(pipe: Any, which: int | str = NAME) -> list[Any]:
    """The averaged point ``x`` (the point schedule-free theory evaluates), one tensor
    per variable of ``pipe.model_variables``, in their dtypes. The variables keep
    ``y``. ``which``: the transform's index or name in the pipeline. ``pipe``: the
    pipeline, or the Keras optimizer that applies it (``model.optimizer``)."""
    import tensorflow as tf

    variables, offsets, b1 = _slots(pipeline_of(pipe), which)
    values = []
    for var, offset in zip(variables, offsets):
        if offset.shape != var.shape:  # a variable the rule does not select: no slot
            values.append(tf.identity(var))
            continue
        dtype = offset.dtype
        b = tf.cast(b1, dtype)
        x = value_of(var, dtype) - (1 - b) / b * tf.convert_to_tensor(offset)
        values.append(tf.cast(x, var.dtype))
    return values


def averaged_weights(pipe: Any, which: int | str = NAME
                     ) -> contextlib.AbstractContextManager[list[Any]]:
    """Put the averaged point ``x`` into the variables; put ``y`` back afterwards.

    The equivalent of the reference implementation's ``optimizer.eval()`` then
    ``optimizer.train()``: evaluate or save inside the block, train outside it.
    A training step inside the block is an error once ``y`` is back."""
    return swapped_in(pipeline_of(pipe), averaged_values(pipe, which))


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register(NAME, schedule_free_adamw, ScheduleFreeAdamWConfig,
             capabilities=Capabilities(update_rule=True))
