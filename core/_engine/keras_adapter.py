"""``pipe.keras_optimizer()`` under Keras 3: a Pipeline for compile()/fit().

Keras 3 would clip per replica, all-reduce again inside ``apply_gradients``,
decide finiteness on replica 0 and, under ``mixed_float16``, wrap the
optimizer in a ``LossScaleOptimizer``. The adapter overrides ``apply``
entirely (:mod:`gradpipe._engine.keras_common` says what both adapters share); it
subclasses ``LossScaleOptimizer`` only so that ``compile`` does not wrap it,
and none of that class's state or logic is used.
"""

from __future__ import annotations

from typing import Any

from ..distribute import build_eagerly_once
from ..errors import GradpipeError
from .keras_common import (
    AdapterMethods,
    LearningRateHandle,
    add_keras_loss_scale,
    pipeline_from_toml,
    scale_loss,
)

_CLASS: Any = None


def pipeline_optimizer(pipe: Any, name: str = "gradpipe") -> Any:
    return optimizer_class(type(pipe))(pipeline=pipe, name=name)


def optimizer_class(pipeline_type: type) -> Any:
    """The Keras optimizer class (created once, on first use, so Keras loads lazily);
    it rebuilds a ``pipeline_type`` from the TOML a saved model holds."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import keras

    @keras.saving.register_keras_serializable(package="gradpipe", name="PipelineOptimizer")
    class PipelineOptimizer(AdapterMethods, keras.optimizers.LossScaleOptimizer):
        """A gradpipe Pipeline behind the Keras optimizer interface."""

        def __init__(self, pipeline: Any = None, name: str = "gradpipe",
                     pipeline_toml: str | None = None, **kwargs: Any) -> None:
            # Skip LossScaleOptimizer.__init__: the pipeline does the scaling.
            keras.optimizers.Optimizer.__init__(self, learning_rate=0.0, name=name)
            self.pipeline = pipeline_from_toml(pipeline_type, pipeline, pipeline_toml)

        # -- what Keras calls ----------------------------------------------

        def build(self, var_list: Any) -> None:
            if self.built:
                return
            self._add_compiles_loss_scale()
            keras.optimizers.Optimizer.build(self, var_list)
            self.pipeline.build(list(var_list))

        @property
        def variables(self) -> list[Any]:
            return list(self.pipeline.named_variables().values())

        @property
        def iterations(self) -> Any:
            return self.pipeline.iterations

        @property
        def learning_rate(self) -> Any:
            return LearningRateHandle(self.pipeline)

        @learning_rate.setter
        def learning_rate(self, value: Any) -> None:
            # Keras's own __init__ sets a rate before the pipeline is attached
            if getattr(self, "pipeline", None) is None:
                keras.optimizers.Optimizer.learning_rate.fset(self, value)
            else:
                self.pipeline.learning_rate = value

        @property
        def loss_scale_factor(self) -> float:
            # the pipeline scales the loss (scale_loss below); not None, which Keras's
            # __setattr__ would take for "unchanged" when a LossScaleOptimizer sets None
            return 1.0

        @loss_scale_factor.setter
        def loss_scale_factor(self, value: Any) -> None:
            # Keras's Optimizer.__init__ sets it before the pipeline is attached; a
            # LossScaleOptimizer that wraps this one sets it again
            if getattr(self, "pipeline", None) is not None:
                raise GradpipeError(
                    "a LossScaleOptimizer cannot wrap gradpipe's Keras optimizer: the "
                    "pipeline scales the loss and unscales the gradients itself, so each "
                    "gradient would be divided by both scales. Pass "
                    "pipe.keras_optimizer() to compile as it is; to choose the scaling, "
                    "give the pipeline a [loss_scale] table (kind = \"dynamic\" is "
                    "Keras's)")

        def scale_loss(self, loss: Any) -> Any:
            # fit's train step scales the loss before the step's first apply builds
            # the pipeline: the loss scale compile() would add must exist already
            if not self.built:
                build_eagerly_once(self._add_compiles_loss_scale)
            return scale_loss(self.pipeline, loss)

        def _add_compiles_loss_scale(self) -> None:
            # compile() left us unwrapped: add the loss scaling it would have added
            add_keras_loss_scale(self.pipeline, keras.mixed_precision.global_policy().name,
                                 "keras")

        def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
            variables = (trainable_variables if trainable_variables is not None
                         else self._trainable_variables)
            if not self.built:
                build_eagerly_once(lambda: self.build(variables))
            return self.pipeline.apply_gradients(zip(grads, variables))

        def stateless_apply(self, *args: Any, **kwargs: Any) -> Any:
            raise GradpipeError("gradpipe runs on the TensorFlow backend only")

        # -- saving --------------------------------------------------------

        @classmethod
        def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
            return cls(**config)

    _CLASS = PipelineOptimizer
    return _CLASS
