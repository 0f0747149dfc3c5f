"""The Keras optimizer class of gradpipe, registered with Keras on import.

A model saved with ``pipe.keras_optimizer()`` names its optimizer class
``gradpipe>PipelineOptimizer``. Keras resolves such a name only after the
class is registered, which happens when a process first makes a pipeline's
Keras optimizer, or imports this module. A script that only loads the model
need not: ``import gradpipe`` is enough (:mod:`gradpipe.keras_saving`)::

    import gradpipe  # noqa: F401 (lets Keras load gradpipe's optimizer)
    model = keras.models.load_model("model.keras")

It registers the class of the Keras that ``tf.keras`` resolves to: Keras 3, or
tf-keras under ``TF_USE_LEGACY_KERAS=1``.
"""

from __future__ import annotations

from ._engine.keras_common import which_keras
from ._engine.pipeline import Pipeline

if which_keras() == "tf_keras":
    from ._engine.tf_keras_adapter import optimizer_class
else:
    from ._engine.keras_adapter import optimizer_class

#: The registered optimizer class (``gradpipe>PipelineOptimizer``).
PipelineOptimizer = optimizer_class(Pipeline)

__all__ = ["PipelineOptimizer"]
