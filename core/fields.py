"""Field helpers and validators for component config classes.

Component configs are frozen, keyword-only ``attrs`` classes. gradpipe builds
them from TOML tables itself (never ``cls(**table)``): it checks each value
against the field's annotated type, runs the field's validator on its own so
the error names the exact key, and only then constructs the instance, whose
``__attrs_post_init__`` may check rules that span several fields by raising
:class:`FieldError`.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .hints import did_you_mean
from .validators import (  # noqa: F401 (re-exported: gradpipe.fields.positive etc.)
    Check,
    at_least,
    greater_than,
    in_range,
    increasing,
    non_negative,
    one_of,
    positive,
)

HYPER = "gradpipe_hyper"
SCHEDULE = "gradpipe_schedule"
PATTERNS = "gradpipe_variable_patterns"


class FieldError(ValueError):
    """Raised from a config's ``__attrs_post_init__`` to blame one key."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


@attrs.frozen
class ScheduleRef:
    """A reference ``"@name"`` to a schedule in the ``[schedules]`` table."""

    name: str

    def __str__(self) -> str:
        return f"@{self.name}"


def is_constant(value: Any) -> bool:
    """Whether a ``hyperparameter()`` field holds a plain number, not a schedule
    (TOML integers stay ints)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _skip_schedules(validator: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """Range checks apply to plain numbers; a schedule is checked on its own."""
    if validator is None:
        return None

    def check(inst: Any, attribute: Any, value: Any) -> None:
        if is_constant(value):
            validator(inst, attribute, value)

    # What it accepts is what the validator it wraps accepts (gradpipe describe).
    return Check(check, getattr(validator, "describe", None), wraps=validator)


def hyperparameter(*, default: Any = attrs.NOTHING, validator: Any = None) -> Any:
    """A float hyperparameter that may also be a schedule.

    In TOML it accepts a number, ``"@name"`` (a schedule from
    ``[schedules.name]``) or an inline schedule table. The validator applies
    to plain numbers. Turn it into a callable with :func:`gradpipe.hyper`.
    """
    return attrs.field(
        default=default, validator=_skip_schedules(validator), metadata={HYPER: True}
    )


def schedule_field(*, default: Any = attrs.NOTHING, many: bool = False) -> Any:
    """A field holding a whole schedule (``"@name"`` or a table), e.g. for warmup;
    with ``many``, a non-empty array of them (``sequence``)."""
    return attrs.field(default=default, metadata={SCHEDULE: "many" if many else "one"})


def variable_patterns(*, default: tuple[str, ...] = ()) -> Any:
    """Regular expressions matched (``re.search``) against variable paths
    (``sequential/dense/bias``), e.g. Keras's ``exclude_from_weight_decay``.

    Each must compile (checked with the file), and each must match at least one
    variable of the model the pipeline is built for (checked at build): a
    pattern that matches nothing is most often a typo.
    """
    return attrs.field(default=default, validator=valid_patterns,
                       metadata={PATTERNS: True})


def valid_patterns(inst: Any, attribute: Any, value: Sequence[str]) -> None:
    for i, pattern in enumerate(value):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"item {i}: invalid regular expression {pattern!r}: "
                             f"{exc}") from None


valid_patterns.describe = "regular expressions"  # type: ignore[attr-defined]


# -- type checking of TOML values -------------------------------------------


class Invalid(Exception):
    """A TOML value does not have the type a field expects."""


def type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)


def check_type(tp: Any, value: Any) -> Any:
    """Check ``value`` from TOML against the annotation ``tp``; return it normalized."""
    import types
    import typing

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return check_type(arg, value)
            except Invalid as exc:
                errors.append(str(exc))
        raise Invalid(errors[0] if len(errors) == 1 else " or ".join(errors))
    if origin is typing.Literal:
        if value not in args:
            raise Invalid(
                f"must be one of {', '.join(map(repr, args))}, got {value!r}"
                + did_you_mean(str(value), [str(a) for a in args])
            )
        return value
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        if not isinstance(value, list):
            raise Invalid(f"must be an array, got {type_name(value)}")
        item = args[0] if args else Any
        out = []
        for i, v in enumerate(value):
            try:
                out.append(check_type(item, v))
            except Invalid as exc:
                raise Invalid(f"item {i}: {exc}") from None
        return tuple(out)
    if tp is bool:
        if not isinstance(value, bool):
            raise Invalid(f"must be true or false, got {type_name(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"must be an integer, got {type_name(value)} {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(f"must be a number, got {type_name(value)} {value!r}")
        if not math.isfinite(value):
            raise Invalid(f"must be finite, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise Invalid(f"must be a string, got {type_name(value)}")
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise Invalid(f"unsupported value {value!r} for type {tp!r}")


def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of an attrs class (string annotations included)."""
    import typing

    cached = cls.__dict__.get("__gradpipe_types__")
    if cached is not None:
        return dict(cached)
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        hints = {}
    types = {a.name: hints.get(a.name, a.type if not isinstance(a.type, str) else Any)
             for a in attrs.fields(cls)}
    with contextlib.suppress(TypeError, AttributeError):
        type.__setattr__(cls, "__gradpipe_types__", types)
    return dict(types)


def config_class_problems(cls: type) -> list[str]:
    """What is wrong with a config class's defaults and ``example``, checked the way a
    TOML value is (type, then validator): a plugin's mistake found when it registers,
    not blamed on a user's file later."""
    types = field_types(cls)
    fields = {f.name: f for f in attrs.fields(cls)}
    problems = []
    for name, field in fields.items():
        default = field.default
        if default is attrs.NOTHING:
            continue
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            if default.takes_self:
                continue
            default = default.factory()
        problem = _value_problem(field, types[name], default)
        if problem:
            problems.append(f"the default of {name!r} {problem}")
    example = getattr(cls, "example", {})
    if not isinstance(example, dict):
        return [*problems, f"example must be a dict of keys to values, got {example!r}"]
    for name, value in example.items():
        if name not in fields:
            problems.append(f"example sets {name!r}, which is not a key"
                            f"{did_you_mean(str(name), fields)}")
            continue
        problem = _value_problem(fields[name], types[name], value)
        if problem:
            problems.append(f"example[{name!r}] {problem}")
    missing = [n for n, f in fields.items() if f.default is attrs.NOTHING and n not in example]
    if missing:
        problems.append(f"required {', '.join(map(repr, missing))} but no example value: "
                        "declare `example: ClassVar[dict] = {...}`")
    return problems


def _value_problem(field: Any, tp: Any, value: Any) -> str | None:
    """Why ``value`` (a Python default or example value) would fail as a TOML value."""
    if value is None:  # "not set": TOML has no null, so no user value is compared to it
        return None
    if field.metadata.get(SCHEDULE):
        return None  # schedule tables: checked when a pipeline builds them
    if field.metadata.get(HYPER):
        if isinstance(value, dict) or (isinstance(value, str) and value.startswith("@")):
            return None  # a schedule: checked when a pipeline builds it
        tp = float
    try:
        check_type(tp, _as_toml(value))
        if field.validator is not None:
            field.validator(None, field, value)
    except Invalid as exc:
        return str(exc)
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def _as_toml(value: Any) -> Any:
    """A Python default as TOML would give it (tuples are arrays)."""
    if isinstance(value, (tuple, list)):
        return [_as_toml(v) for v in value]
    return value
