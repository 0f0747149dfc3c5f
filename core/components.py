"""Turning validated specs into live components.

Factories run here, at build time, inside a :func:`build_scope` that tells
``hyper()`` where the step comes from. A factory that raises, or returns an
object that breaks its kind's interface, becomes a ``PluginError`` naming the
plugin; a raw traceback never reaches the user.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .entry_points import KIND_HOOKS
from .errors import ConfigError, GradpipeError, PluginError
from .registry import Registry, get_registry
from .spec import ComponentSpec

#: Attributes each component kind must provide (checked after the factory runs).
INTERFACES: dict[str, tuple[str, ...]] = {
    "transform": ("init", "update"),
    "loss_scale": ("__call__", "update", "get_config"),
    "schedule": ("__call__",),
    "convergence": ("bootstrap", "one_step", "min_num_steps", "name"),
    "placement": ("strategy", "reduce", "loss_divisor", "num_replicas"),
    "problem": ("variables", "loss"),
}


def build_component(spec: ComponentSpec, registry: Registry | None = None) -> Any:
    """Call the factory of ``spec`` and check the result's interface."""
    registry = registry or get_registry()
    comp = registry.get(spec.kind, spec.name if not spec.dist
                        else f"{spec.dist}>{spec.name}")
    try:
        obj = comp.factory(spec.config)
    except GradpipeError:
        raise
    except Exception as exc:
        raise PluginError(
            f"{spec.kind} {spec.name!r} from plugin {comp.provider} failed to build "
            f"at {spec.path or '<inline>'}: {type(exc).__name__}: {exc}"
        ) from exc
    missing = [a for a in INTERFACES[spec.kind] if not hasattr(obj, a)]
    if missing:
        raise PluginError(
            f"{spec.kind} {spec.name!r} from plugin {comp.provider} returned "
            f"{type(obj).__name__}, which lacks {', '.join(missing)}: it breaks the "
            f"{spec.kind} interface"
        )
    return obj


def create(kind: str, table: Mapping[str, Any], *, registry: Registry | None = None
           ) -> Any:
    """Build one component from a TOML-shaped table.

    ``kind`` is ``"transform"``, ``"loss_scale"``, ``"schedule"``,
    ``"convergence"``, ``"placement"`` or ``"problem"``. Hyperparameters given
    as inline schedules follow step 0 unless the component runs inside a
    pipeline; ``"@name"`` references need a pipeline.
    """
    registry = registry or get_registry()
    return build_component(component_spec(kind, table, registry=registry), registry)


def component_spec(kind: str, table: Mapping[str, Any], *,
                   registry: Registry | None = None) -> ComponentSpec:
    """Validate one component table into a spec (no TensorFlow needed)."""
    from .config import _Collector, _SpecBuilder
    from .toml_source import as_toml_values

    if kind not in KIND_HOOKS:
        from .hints import did_you_mean

        raise ConfigError(f"unknown component kind {kind!r}{did_you_mean(kind, KIND_HOOKS)};"
                          f" expected one of {', '.join(KIND_HOOKS)}")
    registry = registry or get_registry()
    out = _Collector(None, {})
    builder = _SpecBuilder(registry, out, None)
    spec = builder.component(kind, as_toml_values(table), kind)
    if out.problems or spec is None:
        raise ConfigError(out.problems)
    return spec
