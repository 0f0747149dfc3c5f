"""``pipe.keras_optimizer()`` under tf-keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``).

TensorFlow Recommenders models run only on tf-keras, whose ``compile`` accepts
only its own optimizers. This adapter is one: a tf-keras ``Optimizer`` that
is also a ``LossScaleOptimizer`` to ``compile`` (so it is not wrapped under
``mixed_float16``), and whose ``minimize`` and ``apply_gradients`` hand the
step to the pipeline (:mod:`gradpipe._engine.keras_common` says what both adapters
share). ``apply_gradients`` takes the gradients of the scaled loss, as a
tf-keras ``LossScaleOptimizer`` does; without a loss scaler they are the
plain gradients, which is what ``tfrs.models.Model.train_step`` passes.
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
    # tf-keras's LossScaleOptimizer metaclass passes the first argument positionally
    return optimizer_class(type(pipe))(pipe, name=name)


class _CallableList(list):
    """tf-keras reads ``optimizer.variables`` both as a list and as a method."""

    def __call__(self) -> list[Any]:
        return list(self)


def optimizer_class(pipeline_type: type) -> Any:
    """The tf-keras optimizer class (created once, on first use); it rebuilds a
    ``pipeline_type`` from the TOML a saved model holds."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import tensorflow as tf
    import tf_keras

    @tf_keras.saving.register_keras_serializable(package="gradpipe",
                                                 name="PipelineOptimizer")
    class PipelineOptimizer(AdapterMethods, tf_keras.optimizers.Optimizer,
                            tf_keras.mixed_precision.LossScaleOptimizer):
        """A gradpipe Pipeline behind the tf-keras optimizer interface."""

        def __init__(self, pipeline: Any = None, name: str = "gradpipe",
                     pipeline_toml: str | None = None, **kwargs: Any) -> None:
            tf_keras.optimizers.Optimizer.__init__(self, name=name)
            self.pipeline = pipeline_from_toml(pipeline_type, pipeline, pipeline_toml)

        # -- what tf-keras calls -------------------------------------------

        def build(self, var_list: Any) -> None:
            if getattr(self, "_built", False):
                return
            add_keras_loss_scale(self.pipeline,
                                 tf_keras.mixed_precision.global_policy().name, "tf_keras")
            super().build(var_list)
            self.pipeline.build(list(var_list))
            self._built = True

        @property
        def variables(self) -> Any:
            return _CallableList(self.pipeline.named_variables().values())

        @property
        def iterations(self) -> Any:
            return self.pipeline.iterations

        @iterations.setter
        def iterations(self, variable: Any) -> None:
            # tf-keras's __init__ sets its own counter; the pipeline's is the one
            self._iterations = variable

        @property
        def learning_rate(self) -> Any:
            # tf-keras's callbacks assign what they read here (backend.set_value)
            return LearningRateHandle(self.pipeline)

        @learning_rate.setter
        def learning_rate(self, value: Any) -> None:
            self.pipeline.learning_rate = value


        loss_scale = AdapterMethods.dynamic_scale  # tf-keras's name for it

        def get_scaled_loss(self, loss: Any) -> Any:
            return scale_loss(self.pipeline, loss)

        def minimize(self, loss: Any, var_list: Any, tape: Any = None) -> None:
            """What ``fit`` calls: scale the loss (on ``tape``), differentiate, apply."""
            if callable(var_list):
                var_list = var_list()
            var_list = list(var_list)
            self._build_once(var_list)  # the loss scale must exist before scaling
            if callable(loss):
                tape = tf.GradientTape()
                with tape:
                    loss = loss()
            elif tape is None:
                raise GradpipeError("minimize() needs a tape when the loss is a tensor")
            with tape:
                scaled = self.get_scaled_loss(loss)
            grads = tape.gradient(scaled, var_list)
            self.apply_gradients(zip(grads, var_list))

        def apply_gradients(self, grads_and_vars: Any, name: Any = None,
                            skip_gradients_aggregation: bool = False, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            self._build_once([v for _, v in pairs])
            return self.pipeline.apply_gradients(pairs)

        def _build_once(self, var_list: list[Any]) -> None:
            if not getattr(self, "_built", False):
                build_eagerly_once(lambda: self.build(var_list))

        # -- saving --------------------------------------------------------

        @classmethod
        def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
            return cls(None, **config)

    _CLASS = PipelineOptimizer
    return _CLASS
