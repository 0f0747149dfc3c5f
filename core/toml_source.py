"""Reading a pipeline file: its TOML, and the line of every key; a table
written in Python, made of the values TOML has; and a key, a value or a whole
pipeline written back as TOML, for the messages, descriptions and files that
show one.

``tomllib`` keeps no positions, so :func:`line_map` finds them with a light
scan of the text; :func:`line_for` gives a key path's line, or its nearest
enclosing key's, for every problem :mod:`gradpipe.config` reports.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError, Problem

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def read_file(path: str | Path) -> tuple[dict[str, Any], dict[str, int], str]:
    """The file's TOML, the line of each key, and its name; a ConfigError if the
    file cannot be read or is not TOML."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Problem(path="", message=f"cannot read file: {exc}",
                                   file=str(path))]) from None
    data, lines = parse_toml(text, str(path))
    return data, lines, str(path)


def parse_toml(text: str, file: str | None = None) -> tuple[dict[str, Any], dict[str, int]]:
    """TOML text as a mapping and the line of each key; invalid TOML is a
    ConfigError with the line of the fault."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        if line is None:
            match = re.search(r"line (\d+)", str(exc))
            line = int(match.group(1)) if match else None
        message = getattr(exc, "msg", str(exc))
        raise ConfigError([Problem(path="", message=f"invalid TOML: {message}",
                                   file=file, line=line)]) from None
    return data, line_map(text)


def line_map(text: str) -> dict[str, int]:
    """Key path -> line, by a light scan of the TOML text (tomllib keeps none)."""
    lines: dict[str, int] = {}
    table = ""
    counts: dict[str, int] = {}
    key_re = re.compile(r"""^\s*((?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')"""
                        r"""(?:\s*\.\s*(?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*'))*)\s*=""")
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("[["):
            name = _norm_key(stripped[2:stripped.find("]]")])
            counts[name] = counts.get(name, -1) + 1
            table = f"{name}[{counts[name]}]"
            lines.setdefault(table, number)
            lines.setdefault(name, number)  # the array itself: its first table
            continue
        if stripped.startswith("["):
            table = _norm_key(stripped[1:stripped.find("]")])
            lines.setdefault(table, number)
            continue
        match = key_re.match(raw)
        if not match:
            continue
        key = _norm_key(match.group(1))
        full = f"{table}.{key}" if table else key
        lines.setdefault(full, number)
        rest = raw[match.end():]
        if "{" in rest:  # keys of an inline table on the same line
            for inner in re.finditer(r"([A-Za-z0-9_\-]+)\s*=", rest):
                lines.setdefault(f"{full}.{inner.group(1)}", number)
    return lines


def _norm_key(key: str) -> str:
    parts = [p.strip().strip("\"'") for p in key.split(".")]
    return ".".join(parts)


def line_for(lines: Mapping[str, int], path: str) -> int | None:
    """The line of ``path``, or of its nearest enclosing key that has one."""
    probe = path
    while probe:
        if probe in lines:
            return lines[probe]
        cut = max(probe.rfind("."), probe.rfind("["))
        if cut <= 0:
            break
        probe = probe[:cut]
    return lines.get(probe)


def as_toml_values(value: Any) -> Any:
    """A table written in Python as TOML would give it: NumPy scalars as Python
    numbers (a float32 as its shortest decimal, ``np.float32(0.01)`` as 0.01, not
    0.009999999776...), tuples as arrays. Anything else is left for the checks."""
    if isinstance(value, Mapping):
        return {key: as_toml_values(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_toml_values(item) for item in value]
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        kind = getattr(getattr(value, "dtype", None), "kind", "")
        return float(str(value)) if kind == "f" else value.item()
    return value


def toml_key(key: str) -> str:
    """``key`` as a TOML key: bare where it may be, else quoted."""
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else json.dumps(key)


def toml_value(value: Any) -> str:
    """A plain value as TOML writes it inline: a boolean, a number, a string, an
    array or an inline table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):  # an inline table (a schedule given in place)
        return "{ " + ", ".join(f"{toml_key(str(k))} = {toml_value(v)}"
                                for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string


def dumps(table: Mapping[str, Any]) -> str:
    """``table`` as a pipeline file: its tables as ``tomli_w`` writes them, then each
    array of tables (``transforms``, ``convergence``) as ``[[name]]`` sections, one
    per element, as users write them (``tomli_w`` would inline a short one), with
    any table inside an element inline."""
    import tomli_w

    def tables(value: Any) -> bool:
        return isinstance(value, (list, tuple)) and bool(value) and all(
            isinstance(item, Mapping) for item in value)

    arrays = {key: value for key, value in table.items() if tables(value)}
    text = tomli_w.dumps({key: value for key, value in table.items() if key not in arrays})
    for key, items in arrays.items():
        for item in items:
            text += f"\n[[{toml_key(key)}]]\n" + "".join(
                f"{toml_key(str(k))} = {toml_value(v)}\n" for k, v in item.items())
    return text.lstrip("\n")
