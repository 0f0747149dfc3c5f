"""Validating pipeline files.

``parse_mapping`` turns a TOML document (read by :mod:`gradpipe.toml_source`,
which also finds each key's line) into a :class:`~gradpipe.spec.PipelineSpec`,
collecting *every* problem in the file (file, key path, line, did-you-mean)
into one :class:`ConfigError`. A file can only name registered components;
nothing in it is ever imported or evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .config_rules import Collector as _Collector
from .config_rules import Link, check_chain, check_lock, check_requirements
from .errors import ConfigError, PluginError, Problem
from .fields import (
    HYPER,
    SCHEDULE,
    FieldError,
    Invalid,
    ScheduleRef,
    check_type,
    field_types,
    valid_patterns,
)
from .fields import type_name as _type_name
from .hints import did_you_mean
from .registry import Registry, get_registry
from .spec import ComponentSpec, GradpipeSection, PipelineOptions, PipelineSpec
from .toml_source import as_toml_values, toml_value

SECTIONS = ("gradpipe", "placement", "loss_scale", "schedules", "pipeline",
            "transforms", "convergence", "problem", "lock")
#: Keys of a transform table that the engine handles, not the component.
TRANSFORM_KEYS = ("variables", "exclude")


def parse_mapping(
    data: Mapping[str, Any],
    *,
    file: str | None = None,
    lines: Mapping[str, int] | None = None,
    registry: Registry | None = None,
) -> PipelineSpec:
    """Validate a TOML-shaped mapping; raise ConfigError listing every problem."""
    registry = registry or get_registry()
    out = _Collector(file, lines or {})
    if not isinstance(data, Mapping):
        raise ConfigError([Problem(path="", message="a pipeline must be a table",
                                   file=file)])
    data = as_toml_values(data)
    for key in data:
        if key not in SECTIONS:
            out.add(str(key), f"unknown section{did_you_mean(str(key), SECTIONS)}; "
                    f"expected one of {', '.join(SECTIONS)}")
    builder = _SpecBuilder(registry, out, data.get("schedules"))
    head = builder.plain(GradpipeSection, data.get("gradpipe", {}), "gradpipe")
    if head is not None:
        check_requirements(head.require, out)
    options = builder.plain(PipelineOptions, data.get("pipeline", {}), "pipeline")
    placement = builder.optional("placement", data, default_kind="default")
    loss_scale = builder.optional("loss_scale", data)
    problem = builder.optional("problem", data)
    schedules = builder.all_schedules()
    transforms = builder.component_list("transform", "transforms", data, required=True)
    convergence = builder.component_list("convergence", "convergence", data)
    tables = data.get("transforms")
    check_chain(builder.links, out, complete=isinstance(tables, list)
                and len(tables) == len(builder.links))
    spec = None
    if not out.problems:
        spec = PipelineSpec(
            gradpipe=head or GradpipeSection(), placement=placement,
            loss_scale=loss_scale, schedules=schedules,
            options=options or PipelineOptions(), transforms=tuple(transforms),
            convergence=tuple(convergence), problem=problem, source=file,
            lines=dict(lines or {}),
        )
        check_lock(data.get("lock"), registry, out)
    if out.problems:
        raise ConfigError(out.problems)
    assert spec is not None
    return spec


class _SpecBuilder:
    """Builds component specs, resolving schedule references once each."""

    def __init__(self, registry: Registry, out: _Collector, schedules: Any) -> None:
        self.registry = registry
        self.out = out
        self.raw_schedules = schedules if isinstance(schedules, Mapping) else {}
        if schedules is not None and not isinstance(schedules, Mapping):
            out.add("schedules", f"must be a table of named schedules, got "
                    f"{_type_name(schedules)}")
        self.resolved: dict[str, ComponentSpec | None] = {}
        self.resolving: list[str] = []
        # every transform whose kind is known, its config valid or not: the chain's
        # order is judged from these, so a table with a bad value still gets told
        # where it belongs, and a rule with a bad value still counts as a rule
        self.links: list[Link] = []

    def plain(self, cls: type, table: Any, path: str) -> Any:
        if not isinstance(table, Mapping):
            self.out.add(path, f"must be a table, got {_type_name(table)}")
            return None
        return self.config(cls, table, path)

    def optional(self, section: str, data: Mapping[str, Any],
                 default_kind: str | None = None) -> ComponentSpec | None:
        kind = "loss_scale" if section == "loss_scale" else section
        if section not in data:
            if default_kind is None:
                return None
            return self.component(kind, {"kind": default_kind}, section)
        return self.component(kind, data[section], section)

    def component_list(self, kind: str, section: str, data: Mapping[str, Any],
                       required: bool = False) -> list[ComponentSpec]:
        items = data.get(section, [])
        if not isinstance(items, list):
            self.out.add(section, f"must be an array of tables ([[{section}]]), "
                         f"got {_type_name(items)}")
            return []
        if required and not items:
            self.out.add(section, "a pipeline needs at least one [[transforms]] entry, "
                         "ending with an update rule such as 'sgd' or 'adam'")
        specs = []
        for i, table in enumerate(items):
            spec = self.component(kind, table, f"{section}[{i}]")
            if spec is not None:
                specs.append(spec)
        return specs

    def all_schedules(self) -> dict[str, ComponentSpec]:
        for name in self.raw_schedules:
            self.schedule_ref(str(name), f"schedules.{name}")
        return {k: v for k, v in self.resolved.items() if v is not None}

    def schedule_ref(self, name: str, path: str) -> ComponentSpec | None:
        if name in self.resolved:
            return self.resolved[name]
        if name in self.resolving:
            cycle = " -> ".join(f"@{n}" for n in
                                [*self.resolving[self.resolving.index(name):], name])
            self.out.add(path, f"schedule references form a cycle: {cycle}")
            return None
        if name not in self.raw_schedules:
            self.out.add(path, f"refers to schedule '@{name}', which is not defined in "
                         f"[schedules]{did_you_mean(name, map(str, self.raw_schedules))}")
            return None
        self.resolving.append(name)
        spec = self.component("schedule", self.raw_schedules[name], f"schedules.{name}")
        self.resolving.pop()
        self.resolved[name] = spec
        return spec

    def component(self, kind: str, table: Any, path: str) -> ComponentSpec | None:
        if not isinstance(table, Mapping):
            named = (f": write {path} = {{ kind = {toml_value(table)} }}"
                     if isinstance(table, str) else "")
            self.out.add(path, f"must be a table with a 'kind' key, got "
                         f"{_type_name(table)}{named}")
            return None
        name = table.get("kind")
        if not isinstance(name, str) or not name:
            self.out.add(f"{path}.kind" if "kind" in table else path,
                         f"needs 'kind', the name of a registered {kind}"
                         f" (one of {', '.join(self.registry.names(kind)) or 'none'})")
            return None
        try:
            comp = self.registry.get(kind, name)
        except PluginError as exc:
            self.out.add(f"{path}.kind", str(exc))
            return None
        if kind == "transform":
            self.links.append(Link(path=path, name=comp.name, dist=comp.provider.dist,
                                   capabilities=comp.capabilities))
        extra: dict[str, Any] = {}
        params = {k: v for k, v in table.items() if k != "kind"}
        if kind == "transform":
            for key in TRANSFORM_KEYS:
                if key in params:
                    value = params.pop(key)
                    try:
                        extra[key] = check_type(tuple[str, ...], value)
                        valid_patterns(None, None, extra[key])
                    except (Invalid, ValueError) as exc:
                        self.out.add(f"{path}.{key}", f"{exc} (regular expressions "
                                     "matched against variable paths)")
        config = self.config(comp.config_cls, params, path, extra_keys=(
            "kind", *(TRANSFORM_KEYS if kind == "transform" else ())), name=comp.name)
        if config is None:
            return None
        return ComponentSpec(kind=kind, name=comp.name, config=config, path=path,
                             dist=comp.provider.dist, version=comp.provider.version,
                             extra=extra, qualified=">" in name,
                             capabilities=comp.capabilities)

    def config(self, cls: type, table: Mapping[str, Any], path: str,
               extra_keys: Any = (), name: str = "") -> Any:
        """``table`` as ``cls``; ``name``: the component's, for its own key hints."""
        fields = {f.name: f for f in attrs.fields(cls)}
        types = field_types(cls)
        values: dict[str, Any] = {}
        ok = True
        allowed = [*fields, *extra_keys]  # a component's table also has its kind
        for key, value in table.items():
            key_path = f"{path}.{key}"
            if key not in fields:
                hint = did_you_mean(str(key), allowed, name)
                self.out.add(key_path, f"unknown key{hint}; "
                             f"valid keys: {', '.join(allowed)}")
                ok = False
                continue
            field = fields[key]
            try:
                values[key] = self.value(field, types.get(key), value, key_path)
            except Invalid as exc:
                self.out.add(key_path, str(exc))
                ok = False
                continue
            if values[key] is _FAILED:
                ok = False
                continue
            if field.validator is not None:
                try:
                    field.validator(None, field, values[key])
                except (ValueError, TypeError) as exc:
                    self.out.add(key_path, _clean(str(exc), key))
                    ok = False
        for name, field in fields.items():
            if field.default is attrs.NOTHING and name not in table:
                self.out.add(f"{path}.{name}", "is required")
                ok = False
        if not ok:
            return None
        try:
            return cls(**values)
        except FieldError as exc:
            self.out.add(f"{path}.{exc.field}", exc.message)
        except (ValueError, TypeError, OverflowError) as exc:
            self.out.add(path, _clean(str(exc), ""))
        return None

    def value(self, field: Any, tp: Any, value: Any, path: str) -> Any:
        if field.metadata.get(HYPER) or field.metadata.get(SCHEDULE):
            if isinstance(value, str):
                if not value.startswith("@"):
                    known = value in (self.raw_schedules or {})
                    raise Invalid(f"must be a number, '@name' or a schedule table, "
                                  f"got string {value!r}"
                                  + (f" (did you mean '@{value}'?)" if known else ""))
                name = value[1:]
                if not name:
                    raise Invalid("'@' must be followed by the name of a schedule")
                if self.schedule_ref(name, path) is None:
                    return _FAILED
                return ScheduleRef(name)
            if isinstance(value, Mapping):
                spec = self.component("schedule", value, path)
                return _FAILED if spec is None else spec
            if isinstance(value, list) and field.metadata.get(SCHEDULE):
                if field.metadata.get(SCHEDULE) != "many":
                    raise Invalid("must be '@name' or a schedule table, not an array")
                if not value:
                    raise Invalid("needs at least one schedule")
                one = field.evolve(metadata={SCHEDULE: "one"})
                items = [self.value(one, tp, item, f"{path}[{i}]")
                         for i, item in enumerate(value)]
                return _FAILED if _FAILED in items else tuple(items)
            if callable(value) and hasattr(value, "get_config"):
                raise Invalid(_schedule_object(value))
            return check_type(float, value)
        return check_type(tp, value)


_FAILED = object()


def _clean(message: str, key: str) -> str:
    """Strip attrs' "'key' must be" prefix so the key is named only once."""
    for prefix in (f"'{key}' ", f"{key}: "):
        if key and message.startswith(prefix):
            return message[len(prefix):]
    return message


def _schedule_object(value: Any) -> str:
    """What to write for a schedule object (a Keras ``LearningRateSchedule``) given
    in a Python table: its config as the inline table of the same kind."""
    name = type(value).__name__
    try:
        config = {k: v for k, v in value.get_config().items() if v is not None}
        items = ", ".join(f"{k} = {toml_value(v)}" for k, v in as_toml_values(config).items())
    except Exception:  # a hint only: the error stands without it
        items = "..."
    return (f"is a schedule object ({name}); a pipeline table holds TOML values: write it "
            f"as a table of the kind named after its class, {{kind = \"{name}\", {items}}} "
            "(see docs/schedules.md), or give the whole Keras optimizer to "
            "gradpipe.from_keras")
