"""``clippy_adagrad``: TFRS ``ClippyAdagrad`` (Tang et al., KDD 2023, arXiv:2302.09178).

Adagrad whose step for each tensor is shrunk by one factor in (0, 1] so that
no element moves by more than
``variable_relative_threshold * |w| + accumulator_relative_threshold / sqrt(acc)
+ absolute_threshold``. Follows tensorflow/recommenders
``experimental/optimizers/clippy_adagrad.py`` exactly, sparse path included:
duplicate indices are summed first (the Keras-2 base optimizer does that),
and only the touched rows enter the clipping factor.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs

from gradpipe.plugin import (
    Capabilities,
    FieldError,
    Transform,
    dedupe,
    hookimpl,
    hyper,
    hyperparameter,
    is_sparse,
    non_negative,
    value_of,
    zeros_like_vars,
)


@attrs.frozen(kw_only=True)
class ClippyAdagradConfig:
    """Config of ``clippy_adagrad``.

    Attributes:
        learning_rate: step size (1.0 matches the paper).
        initial_accumulator_value: starting value of the accumulators.
        variable_relative_threshold: clipping threshold relative to ``|w|``.
        accumulator_relative_threshold: threshold relative to ``1/sqrt(acc)``.
        absolute_threshold: constant part of the threshold.
        epsilon: added to the accumulator inside the square root.
        export_clipping_factors: keep each variable's clipping factor as state,
            readable with ``pipe.transform_state("clippy_adagrad")``.
        clip_accumulator_update: accumulate ``(g * factor)^2`` instead of ``g^2``.
        use_standard_accumulator_update: accumulate ``g^2`` before the step, as
            classical Adagrad does (the default accumulates after it).
    """

    example: ClassVar[dict] = {"learning_rate": 1.0}


    learning_rate: Any = hyperparameter(default=0.001, validator=non_negative())
    initial_accumulator_value: float = attrs.field(default=0.1, validator=non_negative())
    variable_relative_threshold: float = attrs.field(default=0.1, validator=non_negative())
    accumulator_relative_threshold: float = attrs.field(default=0.0, validator=non_negative())
    absolute_threshold: float = attrs.field(default=1e-7, validator=non_negative())
    epsilon: float = attrs.field(default=1e-7, validator=non_negative())
    export_clipping_factors: bool = False
    clip_accumulator_update: bool = False
    use_standard_accumulator_update: bool = False

    def __attrs_post_init__(self) -> None:
        if self.clip_accumulator_update and self.use_standard_accumulator_update:
            raise FieldError("use_standard_accumulator_update",
                             "clip_accumulator_update and use_standard_accumulator_update "
                             "cannot both be set to True.")


def shrink_by_references(tensor: Any, references: list[Any], relative_factors: list[float],
                         absolute_factor: float) -> tuple[Any, Any]:
    """``(tensor * s, s)`` with the largest ``s <= 1`` keeping every element in bounds."""
    import tensorflow as tf

    max_delta = absolute_factor + sum(tf.abs(r) * f
                                      for r, f in zip(references, relative_factors))
    per_element = tf.where(tensor == 0.0, tf.ones_like(tensor),
                           tf.math.divide_no_nan(max_delta, tf.abs(tensor)))
    scale = tf.minimum(tf.constant(1.0, tensor.dtype), tf.reduce_min(per_element))
    return tensor * scale, scale


class ClippyState(NamedTuple):
    accumulator: list[Any]
    clipping_factor: list[Any]


def clippy_adagrad(cfg: ClippyAdagradConfig) -> Transform:
    """Adagrad with the step shrunk per tensor to stay within the clipping bounds."""
    lr = hyper(cfg.learning_rate)

    def init(variables: list[Any]) -> ClippyState:
        import tensorflow as tf

        factors = ([tf.zeros([], v.dtype if v.dtype.is_floating else tf.float32)
                    for v in variables] if cfg.export_clipping_factors else [])
        return ClippyState(zeros_like_vars(variables, cfg.initial_accumulator_value), factors)

    def update(grads: list[Any], state: ClippyState, variables: list[Any]) -> Any:
        import tensorflow as tf

        accs, factors = list(state.accumulator), list(state.clipping_factor)
        updates: list[Any] = []
        for i, (g, var) in enumerate(zip(grads, variables)):
            if g is None:
                updates.append(None)
                continue
            acc = accs[i]
            dtype = acc.dtype
            sparse = is_sparse(g)
            if sparse:
                g = dedupe(g)
                values = tf.cast(g.values, dtype)
                acc_rows = tf.gather(acc, g.indices)
                # rows of the variable itself: of a whole read, the row write to come
                # would copy the whole table first
                var_rows = tf.cast(tf.gather(var, g.indices), dtype)
            else:
                values = tf.cast(g, dtype)
                acc_rows, var_rows = acc, value_of(var, dtype)
            if cfg.use_standard_accumulator_update:
                acc_rows = acc_rows + tf.square(values)
            precondition = tf.math.rsqrt(acc_rows + cfg.epsilon)
            delta = tf.cast(lr(), dtype) * values * precondition
            clipped, factor = shrink_by_references(
                delta, [var_rows, precondition],
                [cfg.variable_relative_threshold, cfg.accumulator_relative_threshold],
                cfg.absolute_threshold)
            if cfg.export_clipping_factors:
                factors[i] = tf.cast(factor, factors[i].dtype)
            if not cfg.use_standard_accumulator_update:
                acc_update = values * factor if cfg.clip_accumulator_update else values
                acc_rows = acc_rows + tf.square(acc_update)
            if sparse:
                accs[i] = tf.IndexedSlices(acc_rows, g.indices, g.dense_shape)  # rows only
                updates.append(tf.IndexedSlices(clipped, g.indices, g.dense_shape))
            else:
                accs[i] = acc_rows
                updates.append(clipped)
        return updates, ClippyState(accs, factors)

    return Transform(init, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("clippy_adagrad", clippy_adagrad, ClippyAdagradConfig,
             capabilities=Capabilities(update_rule=True))
