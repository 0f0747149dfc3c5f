"""Wrappers of a whole chain: ``lookahead``, ``moving_average`` and ``swa``
(TF Addons ``Lookahead``, ``MovingAverage`` and ``SWA``).

Each follows the update rule and sees the step the chain before it produced,
``u``, and the weights before the step, ``w``; the chain's new weights are
``w - u``. Whatever precedes them (any rule, a third-party transform, clipping,
weight decay) is what they wrap.

* ``lookahead`` (Zhang et al. 2019): every ``sync_period``-th step, the weights
  become ``slow + slow_step_size * (w - u - slow)``, where ``slow`` is where the
  period started; other steps pass ``u`` through.
* ``moving_average``: ``avg -= (avg - (w - u)) * (1 - decay)`` each step
  (``tf.keras.backend.moving_average_update``), with TF Addons' ``start_step``,
  ``dynamic_decay`` and ``num_updates``. The first average starts from the
  weights before the first step, as TF Addons' slot is created from them.
* ``swa`` (Izmailov et al. 2018): from step index ``start_averaging`` on, every
  ``average_period``-th step, the new weights join an equal-weight average.

Their state starts as zeros and takes the weights at the first step that needs
them (``lookahead``: the first step of each period; ``moving_average``: the
first step), not when the pipeline is built: weights loaded between building
and training are the ones averaged, and the state is the same for every
variable layout (it may be packed). Each keeps its own count of applied steps,
so a skipped step (non-finite gradients) does not advance a period.

The averages are not the model's weights until swapped in:
``with averaged_weights(pipe): model.evaluate(...); model.save(...)`` puts them
into the model's variables and the trained ones back afterwards (TF Addons'
``swap_weights`` twice); :func:`assign_averaged_weights` keeps them (TF Addons'
``assign_average_vars``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    GradpipeError,
    Transform,
    at_least,
    dense,
    hookimpl,
    hyper,
    hyperparameter,
    in_range,
    value_of,
    variable_path,
    zeros_like_vars,
)

AVERAGING = ("moving_average", "swa")


class PeriodState(NamedTuple):
    count: Any  # applied steps, int64
    weights: list[Any]  # lookahead's slow weights, or the average


def _init(variables: list[Any]) -> PeriodState:
    import tensorflow as tf

    return PeriodState(tf.constant(0, tf.int64), zeros_like_vars(variables))


def _new_weights(u: Any, var: Any, dtype: Any) -> Any:
    """The chain's new weights, ``w - u``, as the engine will compute them."""
    u = dense(u)
    return value_of(var, dtype) - value_of(u, dtype)


def _each_average(updates: list[Any], state: PeriodState, variables: list[Any],
                  step: Callable[[Any, Any, Any], Any]) -> tuple[list[Any], PeriodState]:
    """Pass the updates through; each average becomes ``step(average, the chain's new
    weights, the variable)``."""
    averages = [avg if u is None else step(avg, _new_weights(u, var, avg.dtype), var)
                for u, var, avg in zip(updates, variables, state.weights)]
    return updates, PeriodState(state.count + 1, averages)


def _count_field(default: int, low: int) -> Any:
    return attrs.field(default=default, validator=at_least(low))


@attrs.frozen(kw_only=True)
class LookaheadConfig:
    """Config of ``lookahead`` (TF Addons ``Lookahead``; its names and defaults).

    Attributes:
        sync_period: steps per period (TF Addons' ``k``); the weights step back
            towards the period's start on its last step.
        slow_step_size: the fraction of the period's progress kept (``alpha``).
    """

    example: ClassVar[dict] = {"sync_period": 5, "slow_step_size": 0.5}

    sync_period: int = _count_field(6, 1)
    slow_step_size: Any = hyperparameter(default=0.5, validator=in_range(0.0, 1.0))


def lookahead(cfg: LookaheadConfig) -> Transform:
    """Lookahead around the chain before it."""
    alpha = hyper(cfg.slow_step_size)

    def update(updates: list[Any], state: PeriodState, variables: list[Any]) -> Any:
        import tensorflow as tf

        period = tf.constant(cfg.sync_period, tf.int64)
        starts = tf.equal(state.count % period, 0)  # the first step of a period
        syncs = tf.equal((state.count + 1) % period, 0)  # its last
        out: list[Any] = []
        slows: list[Any] = []
        for u, var, slow in zip(updates, variables, state.weights):
            if u is None:
                out.append(u)
                slows.append(slow)
                continue
            u, dtype = dense(u), slow.dtype
            w = value_of(var, dtype)
            slow = tf.where(starts, w, slow)
            back = slow + tf.cast(alpha(), dtype) * (_new_weights(u, var, dtype) - slow)
            out.append(tf.where(syncs, tf.cast(w - back, u.dtype), u))
            slows.append(slow)
        return out, PeriodState(state.count + 1, slows)

    return Transform(_init, update)


@attrs.frozen(kw_only=True)
class MovingAverageConfig:
    """Config of ``moving_average`` (TF Addons ``MovingAverage``; its names and
    defaults).

    Attributes:
        average_decay: the weight of the old average, in [0, 1].
        num_updates: if set, the decay is ``min(average_decay, (1 + n) / (10 +
            n))`` for this fixed ``n``, as TF Addons computes it once.
        start_step: steps (counted from 0) before which the average is the
            weights themselves (decay 0).
        dynamic_decay: ramp the decay up as ``min(average_decay, (1 + s) / (10 +
            s))``, ``s`` the steps since ``start_step``.
    """

    example: ClassVar[dict] = {"average_decay": 0.9}

    average_decay: Any = hyperparameter(default=0.99, validator=in_range(0.0, 1.0))
    num_updates: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(at_least(0)))
    start_step: int = _count_field(0, 0)
    dynamic_decay: bool = False


def moving_average(cfg: MovingAverageConfig) -> Transform:
    """An exponential moving average of the weights the chain produces."""
    configured = hyper(cfg.average_decay)

    def decay(count: Any) -> Any:
        import tensorflow as tf

        value = configured()
        if cfg.num_updates is not None:
            n = float(cfg.num_updates)
            value = tf.minimum(value, (1.0 + n) / (10.0 + n))
        steps = tf.cast(count, tf.float32) - float(cfg.start_step)
        if cfg.dynamic_decay:
            value = tf.minimum(value, (1.0 + steps) / (10.0 + steps))
        return tf.where(steps < 0, tf.zeros([], tf.float32), value)

    def update(updates: list[Any], state: PeriodState, variables: list[Any]) -> Any:
        import tensorflow as tf

        first = tf.equal(state.count, 0)
        factor = 1.0 - decay(state.count)

        def step(avg: Any, new: Any, var: Any) -> Any:
            avg = tf.where(first, value_of(var, avg.dtype), avg)
            return avg - (avg - new) * tf.cast(factor, avg.dtype)

        return _each_average(updates, state, variables, step)

    return Transform(_init, update)


@attrs.frozen(kw_only=True)
class SWAConfig:
    """Config of ``swa`` (TF Addons ``SWA``; its names and defaults).

    Attributes:
        start_averaging: the step (counted from 0) whose new weights are the
            first in the average.
        average_period: steps between two weights joining the average.
    """

    example: ClassVar[dict] = {"average_period": 10}

    start_averaging: int = _count_field(0, 0)
    average_period: int = _count_field(10, 1)


def swa(cfg: SWAConfig) -> Transform:
    """Stochastic weight averaging of the weights the chain produces."""

    def update(updates: list[Any], state: PeriodState, variables: list[Any]) -> Any:
        import tensorflow as tf

        since = state.count - cfg.start_averaging
        joins = tf.logical_and(since >= 0, tf.equal(since % cfg.average_period, 0))
        members = tf.cast(tf.maximum(since // cfg.average_period, 0), tf.float32)

        def step(avg: Any, new: Any, var: Any) -> Any:
            n = tf.cast(members, avg.dtype)
            return tf.where(joins, (avg * n + new) / (n + 1), avg)

        return _each_average(updates, state, variables, step)

    return Transform(_init, update)


def averaged_values(pipe: Any, which: int | str | None = None) -> list[Any]:
    """The average of each of ``pipe.model_variables``, in its dtype (a variable
    the averaging transform does not select: its own value). ``which``: the
    ``moving_average`` or ``swa`` transform, by index or name, if not the only
    one. ``pipe``: the pipeline, or the Keras optimizer that applies it
    (``model.optimizer``)."""
    import tensorflow as tf

    pipe = pipeline_of(pipe)
    index = _averaging_transform(pipe, which)
    slots = pipe.transform_state(index)
    first = getattr(pipe.spec.transforms[index].config, "start_averaging", 0)
    applied = int(slots["count"].numpy()) if "count" in slots else 0  # built or not
    if applied <= first:  # before the first step, or SWA's first member
        name = pipe.spec.transforms[index].name
        raise GradpipeError(
            f"{name} has no average yet: no step applied" if applied == 0 and first == 0
            else f"{name} has no average yet: {applied} steps applied, and step {first} "
                 "(from 0) is its first member (start_averaging)")
    names = _slot_names(pipe.model_variables)
    values = []
    for var, name in zip(pipe.model_variables, names):
        average = slots.get(f"weights/{name}")
        if average is None or average.shape != var.shape:  # a variable it does not select
            values.append(tf.identity(var))
        else:
            values.append(tf.cast(tf.convert_to_tensor(average), var.dtype))
    return values


def pipeline_of(pipe: Any) -> Any:
    """The pipeline: ``pipe`` itself, or the one a gradpipe Keras optimizer applies
    (``model.optimizer``, after ``load_model`` too)."""
    return getattr(pipe, "pipeline", pipe)


@contextlib.contextmanager
def swapped_in(pipe: Any, values: list[Any]) -> Iterator[list[Any]]:
    """``values`` in ``pipe.model_variables`` inside the block, their own values again
    after it. A step applied inside the block trains the values swapped in, and
    putting the weights back undoes it: an error, once the weights are back."""
    import tensorflow as tf

    variables = pipe.model_variables
    kept = [tf.identity(v) for v in variables]
    before = int(pipe.iterations.numpy())
    for var, value in zip(variables, values):
        var.assign(value)
    try:
        yield variables
    finally:
        for var, value in zip(variables, kept):
            var.assign(value)
    steps = int(pipe.iterations.numpy()) - before
    if steps:
        raise GradpipeError(
            f"{steps} step{'s' * (steps > 1)} applied inside averaged_weights() trained "
            "the weights swapped in, and the block's end put the trained weights back, "
            "undoing the step's change of them (the rules' state kept it): train outside "
            "the block; evaluate or save inside it")


def averaged_weights(pipe: Any, which: int | str | None = None
                     ) -> contextlib.AbstractContextManager[list[Any]]:
    """Put the averages into the model's variables; put the trained weights back
    when the block ends. Evaluate or save inside it; train outside it."""
    return swapped_in(pipeline_of(pipe), averaged_values(pipe, which))


def assign_averaged_weights(pipe: Any, which: int | str | None = None) -> None:
    """Replace the model's weights by their averages for good (TF Addons'
    ``assign_average_vars``), as after the last step of training."""
    for var, value in zip(pipeline_of(pipe).model_variables, averaged_values(pipe, which)):
        var.assign(value)


def _averaging_transform(pipe: Any, which: int | str | None) -> int:
    """The index of the ``moving_average`` or ``swa`` transform ``which`` names."""
    names = [t.name for t in pipe.spec.transforms]
    found = [i for i, name in enumerate(names) if name in AVERAGING]
    if which is not None:
        found = [i for i in found if which in (i, names[i])]
    if len(found) == 1:
        return found[0]
    listed = ", ".join(f"{i}: {name}" for i, name in enumerate(names))
    if which is not None:
        raise GradpipeError(f"which={which!r} names no moving_average or swa transform "
                            f"of this pipeline ({listed})")
    raise GradpipeError(
        f"the pipeline has {len(found)} averaging transforms (moving_average or swa) "
        f"among {listed}; " + ("put one after the update rule" if not found
                               else "pass which=<index> to pick one"))


def _slot_names(variables: list[Any]) -> list[str]:
    from gradpipe.names import slot_name, unique_names

    return unique_names([slot_name(variable_path(v)) for v in variables])


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    after = Capabilities(after_update_rule=True)
    register("lookahead", lookahead, LookaheadConfig, capabilities=after)
    register("moving_average", moving_average, MovingAverageConfig, capabilities=after)
    register("swa", swa, SWAConfig, capabilities=after)
