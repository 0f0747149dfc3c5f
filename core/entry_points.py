"""Where plugins come from: the entry points of installed distributions.

Nothing here imports TensorFlow or a plugin: it only reads package metadata.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib import metadata
from typing import Any

#: The distribution that ships the built-in plugins.
BUILTIN_DIST = "gradpipe"

#: Component kind -> the hook that registers components of that kind.
KIND_HOOKS: dict[str, str] = {
    "transform": "gradpipe_register_transforms",
    "loss_scale": "gradpipe_register_loss_scalers",
    "schedule": "gradpipe_register_schedules",
    "convergence": "gradpipe_register_convergence_criteria",
    "placement": "gradpipe_register_placements",
    "problem": "gradpipe_register_problems",
}
HOOK_KINDS = {hook: kind for kind, hook in KIND_HOOKS.items()}


def iter_entry_points(group: str) -> Iterator[tuple[Any, str, str]]:
    """``(entry point, distribution name, version)`` for each entry of ``group``."""
    seen: set[tuple[str, str]] = set()
    found = []
    for dist in metadata.distributions():
        entries = [ep for ep in dist.entry_points if ep.group == group]
        if not entries:
            continue
        # read once per distribution: parsing its metadata costs a millisecond
        info = dist.metadata
        name, version = info["Name"] or "", info["Version"] or ""
        for ep in entries:
            # The same distribution may be visible twice on sys.path (editable
            # installs): load it once.
            if (name, ep.name) in seen:
                continue
            seen.add((name, ep.name))
            found.append((name, ep, version))
    # Built-ins first, then third parties, each in name order: deterministic.
    found.sort(key=lambda f: (f[0] != BUILTIN_DIST, f[0], f[1].name))
    yield from ((ep, name, version) for name, ep, version in found)


def component_index(group: str) -> dict[tuple[str, str], tuple[str, str]]:
    """``(kind, name) -> (distribution, module)`` from ``kind.name = module`` entries."""
    index: dict[tuple[str, str], tuple[str, str]] = {}
    for ep, dist, _ in iter_entry_points(group):
        kind, _, name = ep.name.partition(".")
        if kind in KIND_HOOKS and name:
            index[(kind, name)] = (dist, ep.value)
    return index


def index_problems(group: str, dist: str, provided: set[tuple[str, str]]) -> list[str]:
    """What is wrong with ``dist``'s name index (the ``group`` entries), given the
    ``(kind, name)`` its plugin really registers. A wrong entry never breaks loading
    (the plugin is imported eagerly instead) but costs every user the lazy load."""
    listed: set[tuple[str, str]] = set()
    problems = []
    for ep, owner, _ in iter_entry_points(group):
        if owner != dist:
            continue
        kind, _, name = ep.name.partition(".")
        if kind not in KIND_HOOKS or not name:
            problems.append(f"index entry {ep.name!r} is not \"kind.name\" with kind one "
                            f"of {', '.join(KIND_HOOKS)}; it is ignored")
            continue
        listed.add((kind, name))
        if (kind, name) not in provided:
            problems.append(f"index lists {kind} {name!r}, which the plugin does not "
                            "register")
    if listed:
        problems += [f"index does not list {kind} {name!r}: a pipeline naming it imports "
                     "every deferred plugin first" for kind, name in sorted(provided - listed)]
    return problems


def env_list(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
