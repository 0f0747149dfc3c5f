"""A config class as rows, one per TOML key: type, default, valid range, meaning.

The type and default come from the attrs fields, the valid range from each
field's validator, the meaning from the class docstring's ``Attributes:``
section. ``gradpipe describe`` prints the rows and ``docs/gen_reference.py``
renders them into the component reference. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import attrs

from .fields import HYPER, SCHEDULE, field_types


@attrs.frozen(kw_only=True)
class FieldRow:
    """One key of a config class, as the reference and ``gradpipe describe`` show it.

    Attributes:
        name: the TOML key.
        type: the type in words (``float or schedule``, ``int``, ``tuple[str, ...]``).
        required: the key has no default.
        default: the default value (a factory's product); None when required.
        valid: the valid range in words (``[0, 1)``, ``> 0``); "" when unchecked.
        meaning: the key's line of the class docstring's ``Attributes:`` section.
        schedule: a float that also accepts a schedule (``"@name"`` or a table).
    """

    name: str
    type: str
    required: bool
    default: Any
    valid: str
    meaning: str
    schedule: bool

    @property
    def default_text(self) -> str:
        """The default as Python writes it; "" when required."""
        return "" if self.required else repr(self.default)


def field_rows(cls: type) -> list[FieldRow]:
    """One row per field of the attrs config class ``cls``, in declaration order."""
    docs = attribute_docs(cls)
    types = field_types(cls)
    rows = []
    for field in attrs.fields(cls):
        required = field.default is attrs.NOTHING
        default: Any = None if required else field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = None if default.takes_self else default.factory()
        tp = types.get(field.name)
        rows.append(FieldRow(
            name=field.name, type=type_text(tp, field), required=required,
            default=default, valid=valid_range(field.validator, tp),
            meaning=docs.get(field.name, ""),
            schedule=bool(field.metadata.get(HYPER))))
    return rows


def type_text(tp: object, field: attrs.Attribute) -> str:
    """A field's type in words; hyperparameters read ``float or schedule``."""
    if field.metadata.get(HYPER):
        return "float or schedule"
    if field.metadata.get(SCHEDULE):
        return "schedule"
    text = getattr(tp, "__name__", None) or str(tp)
    return text.replace("typing.", "").replace("NoneType", "None")


def attribute_docs(cls: type) -> dict[str, str]:
    """Key -> its line of the ``Attributes:`` section of the class docstring; a
    subclass's docstring adds to (and overrides) those of the config it extends."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__dict__.get("__doc__")
        if isinstance(doc, str) and klass is not object:
            found.update(_parse_attributes(inspect.cleandoc(doc)))
    return found


def _parse_attributes(doc: str) -> dict[str, str]:
    found: dict[str, str] = {}
    current = None
    in_attrs = False
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            in_attrs = True
            continue
        if not in_attrs:
            continue
        stripped = line.strip()
        if line.startswith("    ") and not line.startswith("        ") and ":" in stripped:
            current, text = stripped.split(":", 1)
            found[current] = text.strip()
        elif current and line.startswith("        "):
            found[current] += " " + stripped
    return found


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring, joined into one line."""
    text = inspect.cleandoc(doc or "").split("\n\n")[0]
    return " ".join(text.split())


def summary(comp: Any) -> str:
    """What the component does in one line: its factory's docstring, else its config's."""
    return (inspect.getdoc(comp.factory) or inspect.getdoc(comp.config_cls) or
            "").split("\n")[0]


# -- valid ranges ---------------------------------------------------------------


def valid_range(validator: Any, tp: Any = None) -> str:
    """The values a field accepts, in words, from its validator (gradpipe's validators
    carry a ``describe``; attrs' own are read; any other check is named), or from a
    ``Literal`` type. "" when nothing narrows the type."""
    text = _validator_text(validator) if validator is not None else ""
    if not text:
        choices = _literal_choices(tp)
        if choices:
            return "one of " + ", ".join(map(repr, choices))
    return text


def _validator_text(v: Any) -> str:
    described = getattr(v, "describe", None)
    if callable(described):
        try:
            described = described()
        except Exception:  # a plugin's describe() that wants arguments: not ours to call
            described = None
    if isinstance(described, str) and described:
        return described
    if getattr(v, "wraps", None) is not None:
        return _validator_text(v.wraps)
    kind = type(v).__name__
    if kind == "_AndValidator":
        return " and ".join(filter(None, (_validator_text(x) for x in v._validators)))
    if kind == "_OptionalValidator":
        inner = v.validator
        if isinstance(inner, (list, tuple)):
            return " and ".join(filter(None, (_validator_text(x) for x in inner)))
        return _validator_text(inner)
    if kind == "_InValidator":
        return "one of " + ", ".join(map(repr, v.options))
    if kind == "_NumberValidator":
        return f"{v.compare_op} {v.bound}"
    if kind == "_InstanceOfValidator":
        return ""  # the type column says it
    doc = inspect.getdoc(v) if inspect.isfunction(v) or inspect.ismethod(v) else None
    if doc:
        return doc.split("\n")[0].strip().rstrip(".")
    name = getattr(v, "__qualname__", None) or getattr(v, "__name__", None) or kind
    name = name.split(".<locals>")[0].rsplit(".", 1)[-1]
    return f"custom check ({name})" if name and name != "check" else "custom check"


def _literal_choices(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    found: tuple[Any, ...] = ()
    for arg in typing.get_args(tp) if _is_union(tp) else ():
        found += _literal_choices(arg)
    return found


def _is_union(tp: Any) -> bool:
    import types

    return typing.get_origin(tp) in (typing.Union, types.UnionType)
