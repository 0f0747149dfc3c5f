"""gradpipe: validated gradient pipelines for TensorFlow 2 / Keras 3, from TOML.

Importing gradpipe does not import TensorFlow; building a pipeline does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .api import build, create, load, parse
from .errors import ConfigError, GradpipeError, PlacementError, PluginError
from .fields import FieldError, hyperparameter, schedule_field
from .from_keras import from_keras
from .hookspecs import PLUGIN_API_VERSION, hookimpl, hookspec
from .keras_saving import register_on_keras_import
from .transform import Transform, hyper, map_grads, no_state, one_minus, schedule, shared

if TYPE_CHECKING:
    from ._engine.pipeline import Pipeline

__version__ = "0.1.0"

# A model saved with pipe.keras_optimizer() then loads after `import gradpipe` alone;
# Keras (and so TensorFlow) is still imported only by whoever imports it.
register_on_keras_import()

__all__ = [
    "PLUGIN_API_VERSION",
    "ConfigError",
    "FieldError",
    "GradpipeError",
    "Pipeline",
    "PlacementError",
    "PluginError",
    "Transform",
    "__version__",
    "build",
    "create",
    "from_keras",
    "hookimpl",
    "hookspec",
    "hyper",
    "hyperparameter",
    "load",
    "map_grads",
    "no_state",
    "one_minus",
    "parse",
    "schedule",
    "schedule_field",
    "shared",
]


#: Public modules, imported on first use as attributes of ``gradpipe`` (``gradpipe.plugin``,
#: ``gradpipe.testing``, ``gradpipe.keras``): ``import gradpipe`` stays free of TensorFlow.
PUBLIC_MODULES = ("capabilities", "convergence", "distribute", "entry_points", "errors",
                  "fields", "hookspecs", "keras", "names", "plugin", "registry", "spec",
                  "tensors", "testing", "transform")


def __getattr__(name: str) -> Any:
    # Pipeline imports TensorFlow; load it only when it is asked for.
    if name == "Pipeline":
        from ._engine.pipeline import Pipeline

        return Pipeline
    if name in PUBLIC_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'gradpipe' has no attribute {name!r}")
