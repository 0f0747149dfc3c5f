"""``gradpipe describe``: what a component says about itself.

Finds a component by name (of any kind), gathers its provider, capabilities,
summary, the rows of its config class (:mod:`gradpipe.config_rows`) and an
example, and formats them as text or JSON. Nothing here imports TensorFlow or
builds a component.
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from collections.abc import Mapping
from typing import Any

from .config_rows import field_rows, first_paragraph, summary
from .entry_points import BUILTIN_DIST, KIND_HOOKS
from .errors import GradpipeError
from .hints import did_you_mean
from .toml_source import toml_key, toml_value

#: Where a component of each kind goes in a pipeline file.
TOML_TABLES = {
    "transform": "[[transforms]]",
    "loss_scale": "[loss_scale]",
    "schedule": "[schedules.lr]",
    "convergence": "[[convergence]]",
    "placement": "[placement]",
    "problem": "[problem]",
}


# -- finding a component by name -----------------------------------------------


def find_component(registry: Any, name: str, kind: str | None = None) -> Any:
    """The component ``name`` (``dist>name`` allowed) of ``kind``, or of whichever kind
    has it; a ``GradpipeError`` that suggests a near name when there is none."""
    if kind is not None:
        if kind not in KIND_HOOKS:
            raise GradpipeError(f"unknown component kind {kind!r}"
                                f"{did_you_mean(kind, KIND_HOOKS)}; kinds: "
                                f"{', '.join(KIND_HOOKS)}")
        return registry.get(kind, name)
    dist, bare = _split(name)
    kinds = _kinds_of(registry, bare)
    if not kinds and registry.deferred:
        registry.load_all()  # an incomplete index must not hide a name
        kinds = _kinds_of(registry, bare)
    if len(kinds) > 1:
        raise GradpipeError(
            f"{bare!r} names a component of several kinds ({', '.join(kinds)}); "
            f"say which: " + " or ".join(f"gradpipe describe {k} {name}" for k in kinds))
    if kinds:
        return registry.get(kinds[0], name)
    for k in KIND_HOOKS:  # a plugin that failed to load may be why it is missing
        message = registry.unknown_message(k, bare, dist)
        if message.startswith(f"{k} {bare!r} comes from plugin"):
            raise GradpipeError(message)
    if bare in ("pipeline", "gradpipe"):  # a section of the file, not a component
        raise GradpipeError(f"[{bare}] is a table of the pipeline file, not a component: "
                            "`gradpipe check FILE` prints it with every default filled in, "
                            "and docs/user-guide.md says what each key does")
    owners = {n: k for k in KIND_HOOKS for n in registry.names(k)}
    hint = did_you_mean(bare, owners)
    close = hint.split("'")[1] if hint.startswith(" (did you mean '") else ""
    if close in owners:
        hint = f" (did you mean {close!r}, a {owners[close]}?)"
    raise GradpipeError(f"unknown component {name!r}{hint}; `gradpipe plugins --all` "
                        "lists every installed component")


def _split(name: str) -> tuple[str | None, str]:
    if ">" in name:
        dist, bare = (part.strip() for part in name.split(">", 1))
        return dist, bare
    return None, name.strip()


def _kinds_of(registry: Any, name: str) -> list[str]:
    return [k for k in KIND_HOOKS
            if name in registry.names(k) or registry.shadowed.get((k, name))]


# -- the description ------------------------------------------------------------


def describe(comp: Any, registry: Any = None) -> dict[str, Any]:
    """Everything ``gradpipe describe`` prints about ``comp``, as JSON-ready data."""
    cls = comp.config_cls
    key = (comp.kind, comp.name)
    clashes = registry is not None and bool(registry.shadowed.get(key))
    written = f"{comp.provider.dist}>{comp.name}" if clashes else comp.name
    example = {"kind": written, **getattr(cls, "example", {})}
    return {
        "kind": comp.kind,
        "name": comp.name,
        "provider": {"distribution": comp.provider.dist, "version": comp.provider.version,
                     "entry_point": comp.provider.entry_point,
                     "builtin": comp.provider.dist == BUILTIN_DIST},
        "summary": summary(comp),
        "doc": first_paragraph(cls.__dict__.get("__doc__")),
        "capabilities": comp.capabilities.describe(),
        "fused_kernel": comp.kernel is not None,
        "arguments": [{
            "name": row.name, "type": row.type, "required": row.required,
            "default": None if row.required else _jsonable(row.default),
            "valid": row.valid, "meaning": row.meaning,
            "accepts_schedule": row.schedule,
        } for row in field_rows(cls)],
        "example": _jsonable(example),
        "example_toml": example_toml(comp.kind, example),
    }


def example_toml(kind: str, table: Mapping[str, Any]) -> str:
    """``table`` as the TOML of a pipeline file's table for a component of ``kind``."""
    lines = [TOML_TABLES[kind]]
    lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def format_text(info: Mapping[str, Any], width: int | None = None) -> str:
    """The description as ``gradpipe describe`` prints it."""
    width = width or max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    p = info["provider"]
    origin = "built in" if p["builtin"] else "a plugin"
    out = [f"{info['kind']} {info['name']!r}: {p['distribution']} {p['version']} "
           f"({origin}, entry point {p['entry_point']!r})"]
    doc = "" if re.fullmatch(r"Config of ``[^`]+``\.?", info["doc"]) else info["doc"]
    for text in dict.fromkeys(filter(None, (info["summary"], doc))):
        out += ["", *textwrap.wrap(text, width)]
    caps = list(info["capabilities"]) + (["fused in-place kernel"]
                                         if info["fused_kernel"] else [])
    if caps:
        out += ["", "capabilities: " + ", ".join(caps)]
    args = info["arguments"]
    out += [""]
    if not args:
        out += ["arguments: none"]
    else:
        out += ["arguments (* = required):"]
        header = ("key", "type", "default", "valid", "meaning")
        cells = [(("* " if a["required"] else "  ") + a["name"], a["type"],
                  "required" if a["required"] else _default_text(a["default"]),
                  a["valid"] or "-", a["meaning"]) for a in args]
        widths = [max(len(r[i]) for r in [("  key", *header[1:]), *cells])
                  for i in range(4)]
        indent = sum(widths) + 2 * 4
        if width - indent < 40:  # too narrow: each meaning on its own lines, below
            indent = 6
        wrap_at = width - indent
        head = ["  key", *header[1:4]]
        out.append("  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  meaning")
        for row in cells:
            lead = "  ".join(c.ljust(w) for c, w in zip(row, widths))
            lines = textwrap.wrap(row[4], wrap_at) or [""]
            if indent == 6:
                out.append(lead.rstrip())
                out += [" " * indent + line for line in lines if line]
                continue
            out.append((lead + "  " + lines[0]).rstrip())
            out += [" " * indent + line for line in lines[1:]]
        if any(a["accepts_schedule"] for a in args):
            out += ["", 'float or schedule: a number, "@name" of a [schedules] table, or an '
                    "inline schedule table"]
    if info["kind"] == "transform":
        out += ["", *textwrap.wrap(
            'every transform also takes variables = ["regex", ...] (only the variables '
            'whose path matches, such as "dense_1/") and exclude = ["regex", ...] (not '
            "these): see Choosing variables in docs/transforms.md", width)]
    out += ["", "example:", textwrap.indent(info["example_toml"].rstrip(), "  ")]
    return "\n".join(out).replace("``", "`")  # docstrings' reST literals, for a terminal


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "unset"
    return json.dumps(value) if isinstance(value, (str, list)) else repr(value)
