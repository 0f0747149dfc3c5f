"""``--set KEY=VALUE``: change a value of a pipeline file by its key path.

The key path is the one errors print (``transforms[1].learning_rate``,
``schedules.lr.warmup_steps``, ``problem.dim``). The value is read as a TOML
value (``3e-3``, ``true``, ``[100, 200]``, ``"adam"``), or as a bare string
when it is not one (``kind=adamw``). ``KEY=V1,V2,V3`` sweeps the values;
several sweeps form a grid. The file with its overrides goes through the same
validation as the file alone, and a problem at an overridden key names the
``--set`` argument instead of a line.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import tomllib

from .config import parse_mapping
from .errors import ConfigError, Problem
from .hints import did_you_mean
from .spec import PipelineSpec
from .toml_source import read_file

_STEP = re.compile(r"([A-Za-z0-9_\-]+)|\[(\d+)\]")


@attrs.frozen(kw_only=True)
class Override:
    """One ``--set`` argument: a key path and the values it takes (several: a sweep)."""

    argument: str
    path: str
    values: tuple[Any, ...]


def parse_override(argument: str) -> Override:
    """``KEY=VALUE`` or ``KEY=V1,V2,...`` as an :class:`Override`."""
    key, sep, raw = argument.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip():
        raise ConfigError([Problem(path="", file=f"--set {argument}", message=(
            "expected KEY=VALUE, e.g. transforms[1].learning_rate=3e-3, or "
            "KEY=V1,V2,V3 to sweep"))])
    try:
        _steps(key)
    except ValueError as exc:
        raise ConfigError([Problem(path="", file=f"--set {argument}",
                                   message=str(exc))]) from None
    return Override(argument=argument, path=key,
                    values=tuple(_value(part) for part in _split_top_level(raw)))


def grid(overrides: Sequence[Override]) -> list[tuple[tuple[Override, Any], ...]]:
    """Every combination of the overrides' values, in argument order."""
    choices = [[(o, v) for v in o.values] for o in overrides]
    return [tuple(combo) for combo in itertools.product(*choices)]


def label(combo: Sequence[tuple[Override, Any]]) -> str:
    """``learning_rate=0.003 warmup_steps=100``: the swept keys of one combination
    (by their last key, or the whole path where two sweeps share it)."""
    swept = [(o, v) for o, v in combo if len(o.values) > 1]
    short = [o.path.rsplit(".", 1)[-1] for o, _ in swept]
    return " ".join(f"{name if short.count(name) == 1 else o.path}={_show(v)}"
                    for name, (o, v) in zip(short, swept))


def parse_with(file: str | Path, combo: Sequence[tuple[Override, Any]]) -> PipelineSpec:
    """The pipeline file with one combination of overrides, validated."""
    data, lines, name = read_file(file)
    changed = copy.deepcopy(data)
    for override, value in combo:
        _assign(changed, override, value, name)
    try:
        return parse_mapping(changed, file=name, lines=lines)
    except ConfigError as exc:
        raise ConfigError([_blame(p, combo) for p in exc.problems]) from None


def _blame(problem: Problem, combo: Sequence[tuple[Override, Any]]) -> Problem:
    """A problem at (or inside) an overridden key names the ``--set`` argument."""
    for override, value in combo:
        if problem.path == override.path or problem.path.startswith(
                (override.path + ".", override.path + "[")):
            where = f" ({problem.file})" if problem.file else ""
            return attrs.evolve(problem, file=f"--set {override.path}={_show(value)}{where}",
                                line=None)
    return problem


def _assign(data: dict[str, Any], override: Override, value: Any, file: str) -> None:
    steps = _steps(override.path)
    node: Any = data
    walked = ""
    for step in steps[:-1]:
        node = _enter(node, step, walked, override, file)
        walked = _join(walked, step)
    last = steps[-1]
    if isinstance(last, int) or not isinstance(node, dict):
        raise _missing(override, f"{override.path} is not a key of a table")
    node[last] = value


def _enter(node: Any, step: str | int, walked: str, override: Override, file: str) -> Any:
    if isinstance(step, int):
        if not isinstance(node, list):
            raise _missing(override, f"{walked} is not a list")
        if step >= len(node):
            raise _missing(override, f"{file} has {len(node)} {walked} "
                           f"({walked}[0] to {walked}[{len(node) - 1}])")
        return node[step]
    if not isinstance(node, dict) or step not in node:
        keys = list(node) if isinstance(node, dict) else []
        where = f"{walked}." if walked else ""
        return _raise_unknown(override, f"{where}{step}", step, keys, file)
    return node[step]


def _raise_unknown(override: Override, path: str, step: str, keys: list[str],
                   file: str) -> Any:
    have = ", ".join(str(k) for k in keys) or "nothing"
    raise _missing(override, f"{file} has no {path}{did_you_mean(step, keys)}; "
                   f"there it has {have}")


def _missing(override: Override, message: str) -> ConfigError:
    return ConfigError([Problem(path=override.path, message=message,
                                file=f"--set {override.argument}")])


def _steps(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for part in path.split("."):
        matches = list(_STEP.finditer(part))
        if not part or "".join(m.group(0) for m in matches) != part or matches[0].group(2):
            raise ValueError(f"{path!r} is not a key path such as transforms[1].learning_rate "
                             "or schedules.lr.warmup_steps")
        steps += [m.group(1) if m.group(1) else int(m.group(2)) for m in matches]
    return steps


def _join(walked: str, step: str | int) -> str:
    if isinstance(step, int):
        return f"{walked}[{step}]"
    return f"{walked}.{step}" if walked else step


def _split_top_level(raw: str) -> Iterator[str]:
    """Split at commas outside brackets, braces and quotes: ``[1,2],[3,4]`` is two."""
    depth, quote, start = 0, "", 0
    for i, char in enumerate(raw):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            yield raw[start:i].strip()
            start = i + 1
    yield raw[start:].strip()


def _value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word: kind=adamw


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
