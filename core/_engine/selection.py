"""Which variables each transform sees, and which are never updated.

A transform table may select variables with ``variables`` and ``exclude``
(regular expressions searched in each variable's path), and a config field
made with :func:`gradpipe.fields.variable_patterns` (``adamw``'s
``exclude_from_weight_decay``) holds patterns too. Every pattern must match
some variable. A trainable variable that no update rule selects would never
change; that is an error unless ``[pipeline] freeze`` lists it, because the
usual cause is a pattern meant for something narrower (``exclude = ["bias"]``
on ``adamw``, meant to spare biases the weight decay).
A variable that two update rules select, one of them by pattern, is an error
too: the second would take the first one's step as its gradient.

Pure Python: no TensorFlow.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from ..errors import ConfigError, Problem
from ..fields import PATTERNS
from ..spec import ComponentSpec, PipelineSpec


def _matches(patterns: Any, path: str) -> list[str]:
    return [p for p in patterns if re.search(p, path)]


def _unmatched(patterns: Any, paths: list[str], where: str, spec: PipelineSpec
               ) -> list[Problem]:
    return [spec.problem_at(f"{where}[{i}]", f"pattern {pattern!r} matches no variable; "
                            f"variables are: {', '.join(paths)}")
            for i, pattern in enumerate(patterns) if not any(re.search(pattern, p)
                                                             for p in paths)]


def pattern_fields(config: Any) -> dict[str, tuple[str, ...]]:
    """The config's fields that hold variable patterns, by name."""
    return {f.name: getattr(config, f.name) for f in attrs.fields(type(config))
            if f.metadata.get(PATTERNS)}


def transform_masks(spec: PipelineSpec, paths: list[str]) -> list[list[bool]]:
    """For each transform, whether it sees each variable; checks every pattern."""
    problems = []
    for t in spec.transforms:
        for key in ("variables", "exclude"):
            problems += _unmatched(t.extra.get(key) or (), paths, f"{t.path}.{key}", spec)
        for name, patterns in pattern_fields(t.config).items():
            problems += _unmatched(patterns, paths, f"{t.path}.{name}", spec)
    problems += _unmatched(spec.options.freeze, paths, "pipeline.freeze", spec)
    if problems:
        raise ConfigError(problems)
    return [[_selects(t, path) for path in paths] for t in spec.transforms]


def _selects(t: ComponentSpec, path: str) -> bool:
    include = t.extra.get("variables") or ()
    if include and not _matches(include, path):
        return False
    return not _matches(t.extra.get("exclude") or (), path)


def frozen_variables(spec: PipelineSpec, paths: list[str], masks: list[list[bool]]
                     ) -> list[bool]:
    """Which variables are never updated: those ``[pipeline] freeze`` lists.

    Raises ``ConfigError`` for a variable that no update rule selects and
    ``freeze`` does not list, naming the patterns that left it out.
    """
    frozen = [bool(_matches(spec.options.freeze, path)) for path in paths]
    rules = [(t, mask) for t, mask in zip(spec.transforms, masks)
             if t.capabilities.update_rule]
    if not rules:  # a chain without an update rule subtracts what it computes
        return frozen
    left_out = [j for j, path in enumerate(paths)
                if not frozen[j] and not any(mask[j] for _, mask in rules)]
    if left_out:
        raise ConfigError([_left_out_problem(spec, [t for t, _ in rules],
                                             [paths[j] for j in left_out])])
    return frozen


def check_one_rule_each(spec: PipelineSpec, paths: list[str], masks: list[list[bool]]
                        ) -> None:
    """Raise ``ConfigError`` for variables that two update rules select where one of
    them picks its variables by pattern: the rules would apply in turn (the second
    one's input is the first one's step), which is almost always a pattern that also
    matches another group's layer (``"dense"`` matches ``dense_1``). A chain of rules
    over every variable, none of them selecting, is a chain on purpose."""
    rules = [(t, mask) for t, mask in zip(spec.transforms, masks)
             if t.capabilities.update_rule]
    problems = []
    for a, (first, first_mask) in enumerate(rules):
        for second, second_mask in rules[a + 1:]:
            if not (_selecting(first) or _selecting(second)):
                continue
            both = [p for p, x, y in zip(paths, first_mask, second_mask) if x and y]
            if both:
                shown = ", ".join(both[:4]) + (f" and {len(both) - 4} more"
                                               if len(both) > 4 else "")
                named = first if _selecting(first) else second
                key = "variables" if named.extra.get("variables") else "exclude"
                other = second if named is first else first
                fix = (f"add exclude = {_toml_list(named.extra['variables'])} to "
                       f"{other.name} at {other.path}, or narrow the patterns"
                       if not _selecting(other) and named.extra.get("variables")
                       else "narrow the patterns")
                problems.append(spec.problem_at(
                    f"{named.path}.{key}",
                    f"{shown} {'are' if len(both) > 1 else 'is'} selected by two update "
                    f"rules, {_described(first)} and {_described(second)}: the second "
                    f"would take the first one's step as its gradient. Give each variable "
                    f"one rule: {fix} (a pattern is searched in the path, so "
                    '"dense/" matches dense/kernel but not dense_1/kernel)'))
    if problems:
        raise ConfigError(problems)


def _selecting(t: ComponentSpec) -> bool:
    return bool(t.extra.get("variables") or t.extra.get("exclude"))


def _described(t: ComponentSpec) -> str:
    patterns = [f"{key} = {_toml_list(t.extra[key])}" for key in ("variables", "exclude")
                if t.extra.get(key)]
    return f"{t.name} at {t.path}" + (f" ({', '.join(patterns)})" if patterns else "")


def _left_out_problem(spec: PipelineSpec, rules: list[ComponentSpec],
                      names: list[str]) -> Problem:
    """The error for variables that no update rule selects: why, and both fixes."""
    them = "them" if len(names) > 1 else "it"
    reasons, where = [], None
    for t in rules:
        excluded = sorted({p for n in names for p in _matches(t.extra.get("exclude") or (), n)})
        parts = [f"excludes {them} (exclude = {_toml_list(excluded)})"] if excluded else []
        if t.extra.get("variables") and any(not _matches(t.extra["variables"], n)
                                            for n in names):
            parts.append(f"does not include {them} (variables = "
                         f"{_toml_list(t.extra['variables'])})")
        where = where or f"{t.path}.{'exclude' if excluded else 'variables'}"
        reasons.append(f"{t.name} at {t.path} {' and '.join(parts)}")
    fixes = [f"to spare {them} only the {field.removeprefix('exclude_from_').replace('_', ' ')}"
             f", write {field} = {_toml_list(t.extra['exclude'])} on {t.name} instead of "
             "exclude"
             for t in rules if t.extra.get("exclude")
             for field in pattern_fields(t.config) if field.startswith("exclude_from_")]
    fixes.append(f"to freeze {them} on purpose, list {them} in [pipeline] freeze")
    return spec.problem_at(where or "transforms", (
        f"no update rule updates {' and '.join(names) if len(names) < 3 else ', '.join(names)}"
        f", so {'they' if len(names) > 1 else 'it'} would never change: "
        f"{'; '.join(reasons)}. {'; '.join(fixes).capitalize()}"))


def _toml_list(patterns: Any) -> str:
    return "[" + ", ".join(f'"{p}"' for p in patterns) + "]"
