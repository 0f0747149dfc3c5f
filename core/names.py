"""The names a pipeline's state goes by, and matching saved names to a rebuilt model's.

Every state variable has a stable name (``slots/1_adam/mu/sequential.dense.kernel``):
the transform, the slot and the path of the model variable it belongs to. A
checkpoint and a ``.keras`` file store the state under these names, never by
position. A model built again is not always named as it was: Keras numbers
layers per process (``dense`` becomes ``dense_2`` in a second instance) and
may rebuild ``sequential_3.dense.kernel`` as ``dense.kernel``.
:func:`match_saved_names` pairs the names one restore sees; what it cannot
pair is reported by the caller, never loaded by position.

Pure Python: no TensorFlow.
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"_(\d+)$")


#: Set by the engine on each shard of a variable split over parameter servers: the
#: path of the variable it belongs to, so that patterns match a shard as its variable.
SHARD_PATH = "_gradpipe_path"


def variable_path(var: Any) -> str:
    """The path patterns match: Keras ``path`` (``dense/kernel``), else the TF name."""
    name = getattr(var, "path", None) or getattr(var, SHARD_PATH, None) or var.name
    return re.sub(r":\d+$", "", name)


def path_matches(patterns: tuple[str, ...] | list[str], var: Any) -> bool:
    """Whether any of ``patterns`` (regular expressions, ``re.search``) matches the
    variable's path: what ``exclude_from_weight_decay`` and the like select."""
    if not patterns:
        return False  # the path unread: variables packed into one vector have none
    path = variable_path(var)
    return any(re.search(p, path) for p in patterns)


def scope_name(i: int, name: str) -> str:
    """The name scope of transform ``i``'s ops (how XLA errors name a transform)."""
    return f"transforms_{i}_{name}"


def slot_name(path: str) -> str:
    """A checkpoint-safe key for a variable path; ``/`` becomes ``.`` so the path's
    components stay recognisable (``sequential.dense.kernel``)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", path.replace("/", "."))


def unique_names(names: list[str]) -> list[str]:
    """Suffix repeated names (two ``Variable:0`` objects) so that each is unique."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        n = seen.get(name, 0)
        seen[name] = n + 1
        out.append(name if n == 0 else f"{name}_{n}")
    return out


def _split(name: str) -> tuple[str, str]:
    """``slots/1_adam/mu/sequential.dense.kernel`` -> (``slots/1_adam/mu``, the path)."""
    head, _, tail = name.rpartition("/")
    return head, tail


def _unnumbered(name: str) -> tuple[str, str]:
    """The name with Keras's automatic numbering taken off each path component."""
    head, tail = _split(name)
    return head, ".".join(_NUMBER.sub("", part) for part in tail.split("."))


def _numbering(name: str) -> tuple[int, ...]:
    """Each path component's number (0 where it has none: Keras's first instance)."""
    parts = _split(name)[1].split(".")
    return tuple(int(m.group(1)) if (m := _NUMBER.search(p)) else 0 for p in parts)


def match_saved_names(expected: list[str], saved: list[str]) -> dict[str, str]:
    """Saved name -> expected name, allowing the model's scope and numbering to differ.

    1. Numbering: names equal once Keras's automatic numbering is taken off
       (``sequential_1.dense_2.kernel`` and ``sequential.dense.kernel``) form a
       group; where a group has as many saved names as expected ones, they are
       paired in the order of their numbers, which is the order the layers were
       created in. A group of the same names pairs each name with itself.
    2. Equal names match.
    3. A saved name and an expected one with the same transform and slot match
       when one variable path ends the other at a ``.`` boundary
       (``sequential_3.dense.kernel`` and ``dense.kernel``) and the match is unique.

    Numbering comes first: saved ``dense_1, dense_2`` restored into a model
    whose layers are ``dense_2, dense_3`` pairs the first layers, where equal
    names would pair the saved second layer with the new first one.
    """
    matches: dict[str, str] = {}
    groups: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for name in saved:
        groups.setdefault(_unnumbered(name), ([], []))[0].append(name)
    for name in expected:
        groups.setdefault(_unnumbered(name), ([], []))[1].append(name)
    for old, new in groups.values():
        if old and len(old) == len(new):
            matches.update(zip(sorted(old, key=_numbering), sorted(new, key=_numbering)))
    taken = set(matches.values())
    for name in saved:
        if name not in matches and name in expected and name not in taken:
            matches[name] = name
            taken.add(name)
    for name in sorted(set(saved) - set(matches)):
        head, tail = _split(name)
        candidates = [e for e in expected if e not in taken and _split(e)[0] == head and (
            f".{_split(e)[1]}".endswith(f".{tail}") or f".{tail}".endswith(f".{_split(e)[1]}"))]
        if len(candidates) == 1:
            matches[name] = candidates[0]
            taken.add(candidates[0])
    return matches


def layout_difference(expected: dict[str, Any], found: dict[str, Any]) -> str:
    """What differs between two name -> shape layouts, in words ("" if nothing)."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    reshaped = sorted(k for k in set(expected) & set(found) if expected[k] != found[k])
    parts = []
    if missing:
        parts.append(f"missing from the saved state: {', '.join(missing)}")
    if unexpected:
        parts.append(f"saved but not in this pipeline: {', '.join(unexpected)}")
    if reshaped:
        parts.append("different shapes: " + ", ".join(
            f"{k} {found[k]} saved vs {expected[k]}" for k in reshaped))
    return "; ".join(parts)


def matched_layout(expected: dict[str, Any], saved: dict[str, Any]
                   ) -> tuple[dict[str, str], str]:
    """Pair a saved name -> shape layout with this one: (saved -> expected name,
    what still differs in words, "" when every name pairs with an equal shape)."""
    matched = match_saved_names(list(expected), list(saved))
    found = {matched.get(name, name): shape for name, shape in saved.items()}
    return matched, layout_difference(expected, found)


def leaf_names(state: Any, paths: list[str]) -> tuple[list[str], list[int | None]]:
    """Readable names for the leaves of a state nest (``mu/dense_kernel``), and the
    variable each leaf belongs to (an index into ``paths``; ``None``: no one)."""
    names: list[str] = []
    owners: list[int | None] = []

    def walk(node: Any, prefix: str, owner: int | None = None) -> None:
        if isinstance(node, dict):
            for k in sorted(node):
                walk(node[k], f"{prefix}{k}/", owner)
        elif isinstance(node, tuple) and hasattr(node, "_fields"):
            for field in node._fields:
                walk(getattr(node, field), f"{prefix}{field}/", owner)
        elif isinstance(node, (list, tuple)):
            per_variable = len(node) == len(paths)
            for i, item in enumerate(node):
                walk(item, f"{prefix}{paths[i] if per_variable else i}/",
                     i if per_variable else owner)
        else:
            names.append(prefix.rstrip("/") or "value")
            owners.append(owner)

    walk(state, "")
    return names, owners
