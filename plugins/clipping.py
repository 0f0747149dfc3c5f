"""Gradient clipping: ``clip_by_global_norm``, ``clip_by_norm``, ``clip_by_value``.

``clip_by_global_norm`` follows OpenSeq2Seq ``optimize_loss`` and Keras
``global_clipnorm``: one norm, in float32, over every gradient, ``None``
skipped and ``IndexedSlices`` kept sparse, then ``g * c * min(1/norm, 1/c)``.
The norm is shared with later transforms and summaries as ``global_norm``.
"""

from __future__ import annotations

from typing import Any, ClassVar

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
    map_grads,
    map_values,
    no_state,
    positive,
    record_squared_norm,
    shared,
    squared_norm,
)


@attrs.frozen(kw_only=True)
class ClipNormConfig:
    """Config of ``clip_by_global_norm`` and ``clip_by_norm``.

    Attributes:
        clip_norm: the largest norm allowed (> 0; a number or a schedule).
    """

    example: ClassVar[dict] = {"clip_norm": 1.0}


    clip_norm: Any = hyperparameter(validator=positive())


@attrs.frozen(kw_only=True)
class ClipGlobalNormConfig(ClipNormConfig):
    __doc__ = ClipNormConfig.__doc__


def clip_by_global_norm(cfg: ClipGlobalNormConfig) -> Transform:
    """Rescale all gradients together so their joint L2 norm is at most ``clip_norm``."""
    clip = hyper(cfg.clip_norm)
    shared_values = shared()
    # Keras computes the factor in float32, with 1/c rounded from float64: so does a
    # constant clip_norm whose reciprocal is a normal float32, bit for bit (unclipped,
    # the factor is then 1 + 2**-23 for some c, as in Keras; OpenSeq2Seq's
    # tf.clip_by_global_norm divides 1 by float32(c) and gets 1 - 2**-24 for c = 1.7).
    # Beyond 2**126, 1/c is denormal in float32 and the factor would drift away from 1,
    # so larger and scheduled values use float64.
    constant = clip.constant
    keras_float32 = constant is not None and constant < 2.0**126

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        norm = tf.sqrt(squared_norm(grads))  # no extra pass: the engine's finite check
        shared_values["global_norm"] = norm
        if keras_float32:
            factor = constant * tf.minimum(1.0 / norm, 1.0 / constant)
        else:
            c, n = tf.cast(clip(), tf.float64), tf.cast(norm, tf.float64)
            factor = tf.cast(c * tf.minimum(1.0 / n, 1.0 / c), tf.float32)
        clipped = map_grads(lambda g: map_values(g, lambda x: x * tf.cast(factor, x.dtype)),
                            grads)
        record_squared_norm(clipped, tf.square(tf.minimum(norm, tf.cast(clip(), tf.float32))))
        return clipped, state

    return Transform(no_state, update)


def clip_by_norm(cfg: ClipNormConfig) -> Transform:
    """Clip each gradient tensor to L2 norm ``clip_norm`` (Keras ``clipnorm``)."""
    clip = hyper(cfg.clip_norm)

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        c = clip()

        def clip_one(g: Any) -> Any:
            g = dedupe(g) if is_sparse(g) else g
            return tf.clip_by_norm(g, tf.cast(c, g.dtype))

        return map_grads(clip_one, grads), state

    return Transform(no_state, update)


@attrs.frozen(kw_only=True)
class ClipValueConfig:
    """Config of ``clip_by_value``.

    Attributes:
        clip_value_min: lower bound of every gradient element.
        clip_value_max: upper bound; must be >= ``clip_value_min``.
    """

    example: ClassVar[dict] = {"clip_value_min": -0.5, "clip_value_max": 0.5}


    clip_value_min: Any = hyperparameter()
    clip_value_max: Any = hyperparameter()

    def __attrs_post_init__(self) -> None:
        lo, hi = self.clip_value_min, self.clip_value_max
        if isinstance(lo, float) and isinstance(hi, float) and lo > hi:
            raise FieldError("clip_value_max",
                             f"must be >= clip_value_min ({lo}), got {hi}")


def clip_by_value(cfg: ClipValueConfig) -> Transform:
    """Clip every gradient element to ``[clip_value_min, clip_value_max]``."""
    lo, hi = hyper(cfg.clip_value_min), hyper(cfg.clip_value_max)

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        low, high = lo(), hi()
        # Clip what the dense gradient holds: duplicate sparse rows are summed first.
        return map_grads(lambda g: map_values(
            dedupe(g) if is_sparse(g) else g,
            lambda x: tf.clip_by_value(x, tf.cast(low, x.dtype), tf.cast(high, x.dtype))
        ), grads), state

    return Transform(no_state, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    clipping = Capabilities(gradient_clipping=True)
    # one factor for all gradients: packed into one vector, the same
    register("clip_by_global_norm", clip_by_global_norm, ClipGlobalNormConfig,
             capabilities=Capabilities(gradient_clipping=True))
    register("clip_by_norm", clip_by_norm, ClipNormConfig, capabilities=clipping)
    register("clip_by_value", clip_by_value, ClipValueConfig, capabilities=clipping)
