"""Everything a plugin author imports, in one namespace.

A transform is a config class, a factory and ``init``/``update``; a plugin
module registers it through a hook::

    import attrs
    from gradpipe.plugin import Transform, hookimpl, hyper, hyperparameter, map_grads
    from gradpipe.plugin import no_state, positive

    @attrs.frozen(kw_only=True)
    class ScaleConfig:
        factor: float = hyperparameter(default=1.0, validator=positive())

    def scale(cfg):
        factor = hyper(cfg.factor)
        def update(grads, state, variables):
            return map_grads(lambda g: g * factor(), grads), state
        return Transform(no_state, update)

    @hookimpl
    def gradpipe_register_transforms(register):
        register("scale", scale, ScaleConfig)

The engine (``gradpipe._engine``) is private: how a step runs is its own
business, and ``pipe.plan`` shows what it decided. Importing this module does
not import TensorFlow.
"""

from __future__ import annotations

from .capabilities import Capabilities
from .convergence import Criterion
from .distribute import Placement, split_cpu, validate_group_assignment
from .errors import ConfigError, GradpipeError, PlacementError, PluginError
from .fields import (
    FieldError,
    hyperparameter,
    is_constant,
    schedule_field,
    variable_patterns,
)
from .hookspecs import PLUGIN_API_VERSION, hookimpl
from .names import path_matches, variable_path
from .tensors import (
    all_finite,
    dense,
    is_sparse,
    map_values,
    norm,
    rowwise,
    scatter_add,
    slice_values,
    slot_dtype,
    value_of,
    zeros_like_vars,
)
from .transform import (
    Transform,
    dedupe,
    hyper,
    keep_where_skipped,
    map_grads,
    no_state,
    one_minus,
    record_squared_norm,
    schedule,
    shared,
    squared_norm,
    sum_of_squares,
)
from .validators import (
    at_least,
    greater_than,
    in_range,
    increasing,
    non_negative,
    one_of,
    positive,
)

__all__ = [
    "PLUGIN_API_VERSION",
    "Capabilities",
    "ConfigError",
    "Criterion",
    "FieldError",
    "GradpipeError",
    "Placement",
    "PlacementError",
    "PluginError",
    "Transform",
    "all_finite",
    "at_least",
    "dedupe",
    "dense",
    "greater_than",
    "hookimpl",
    "hyper",
    "hyperparameter",
    "in_range",
    "increasing",
    "is_constant",
    "is_sparse",
    "keep_where_skipped",
    "map_grads",
    "map_values",
    "no_state",
    "non_negative",
    "norm",
    "one_minus",
    "one_of",
    "path_matches",
    "positive",
    "record_squared_norm",
    "rowwise",
    "scatter_add",
    "schedule",
    "schedule_field",
    "shared",
    "slice_values",
    "slot_dtype",
    "split_cpu",
    "squared_norm",
    "sum_of_squares",
    "validate_group_assignment",
    "value_of",
    "variable_path",
    "variable_patterns",
    "zeros_like_vars",
]
