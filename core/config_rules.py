"""The checks of a pipeline file that span more than one table.

:mod:`gradpipe.config` validates each table against its component's config
class; what is left for here are the rules between them: the chain's order
and make-up (from the capabilities plugins declared), ``[gradpipe] require``
and ``[lock]``. Each adds its problems to the same collector, so one run
reports every problem in the file. Nothing here imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any, NamedTuple

from .capabilities import Capabilities
from .entry_points import BUILTIN_DIST
from .errors import Problem
from .fields import type_name
from .toml_source import line_for

if TYPE_CHECKING:
    from .registry import Registry


class Collector:
    """Collects problems, each with file and line."""

    def __init__(self, file: str | None, lines: Mapping[str, int]) -> None:
        self.file = file
        self.lines = lines
        self.problems: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path=path, message=message, file=self.file,
                                     line=self.line(path)))

    def line(self, path: str) -> int | None:
        return line_for(self.lines, path)



#: What a user who put a built-in in the wrong place may have meant.
_BUILTIN_ALTERNATIVES = {
    (BUILTIN_DIST, "weight_decay"): "; for decay added to the gradient before the update "
                                    "rule, use 'l2'",
    (BUILTIN_DIST, "l2"): "; for decay after the update rule (decoupled), use "
                          "'weight_decay'",
}


class Link(NamedTuple):
    """A transform table whose kind is known (its values may still be invalid)."""

    path: str
    name: str
    dist: str
    capabilities: Capabilities


def check_chain(transforms: list[Link], out: Collector, complete: bool) -> None:
    """Rules between transforms, from the capabilities their plugins declared.

    ``conflicts = {name: reason}``: the transform cannot share a pipeline with
    ``name``. ``after_update_rule``: it must follow an ``update_rule``;
    ``before_update_rule``: one must follow it. And the
    chain needs an update rule at all. ``complete`` says every table of the
    chain has a known kind; a chain with one unknown cannot be judged as a whole
    (the unknown one may be its rule).
    """
    names = {t.name: t for t in transforms}
    seen_update_rule = False
    for t in transforms:
        for other, reason in t.capabilities.conflicts.items():
            if other in names:
                out.add(f"{t.path}.kind", f"{t.name!r} cannot be combined with {other!r} "
                        f"at {names[other].path}: {reason}")
        if t.capabilities.after_update_rule and not seen_update_rule:
            rules = [f"{r.path} ({r.name!r})" for r in transforms if r.capabilities.update_rule]
            where = (f"move it below {rules[0]}" if rules else
                     "add an update rule such as 'sgd' or 'adam' before it")
            out.add(f"{t.path}.kind", f"{t.name!r} changes the step an update rule computed "
                    f"(its plugin declares after_update_rule), so it must come after one: "
                    f"{where}{_BUILTIN_ALTERNATIVES.get((t.dist, t.name), '')}")
        seen_update_rule = seen_update_rule or t.capabilities.update_rule
    at = [i for i, t in enumerate(transforms) if t.capabilities.update_rule]
    for t in transforms[at[-1] + 1:] if at else []:
        if t.capabilities.before_update_rule:
            last = transforms[at[-1]]
            out.add(f"{t.path}.kind", f"{t.name!r} changes the gradient an update rule reads "
                    f"(its plugin declares before_update_rule), so one must come after it; "
                    f"after the last rule it would change the step instead: move it above "
                    f"{last.path} ({last.name!r}){_BUILTIN_ALTERNATIVES.get((t.dist, t.name), '')}")
    misplaced = any(t.capabilities.after_update_rule for t in transforms)
    if complete and transforms and not seen_update_rule and not misplaced:
        _no_update_rule(transforms, out)


def _no_update_rule(transforms: list[Link], out: Collector) -> None:
    # Without a rule the engine would subtract whatever the chain computes: a
    # clipped gradient at a rate of 1, no learning rate to set or report. Every
    # variable would be one no update rule selects, which the guide calls an error;
    # it is one here, before anything is built, so `gradpipe check` finds it too.
    chain = ", ".join(f"{t.name!r} at {t.path}" for t in transforms)
    verb = "changes" if len(transforms) == 1 else "change"
    out.add("transforms", f"no update rule in the chain: {chain} only {verb} the gradients, "
            "and nothing turns them into a step with a learning rate. Add an update rule "
            "such as 'adam' or 'sgd' as the last transform (a plugin's rule declares "
            "Capabilities(update_rule=True))")


def check_requirements(require: tuple[str, ...], out: Collector) -> None:
    from packaging.requirements import InvalidRequirement, Requirement

    for i, text in enumerate(require):
        path = f"gradpipe.require[{i}]"
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            out.add(path, f"not a valid requirement {text!r}: {exc}")
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            out.add(path, f"plugin {req.name!r} is required ({text!r}) but not "
                    f"installed: pip install '{text}'")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            out.add(path, f"{req.name} {installed} is installed, but the pipeline "
                    f"wants {req.name}{req.specifier}")


def check_lock(lock: Any, registry: Registry, out: Collector) -> None:
    if lock is None:
        return
    if not isinstance(lock, Mapping):
        out.add("lock", f"must be a table of distribution = version, got {type_name(lock)}")
        return
    # The versions of the plugins that are actually loaded come first; metadata
    # covers distributions that provide no component of this pipeline.
    loaded = {r.provider.dist: r.provider.version for r in registry.plugins}
    for dist, version in lock.items():
        try:
            installed = loaded.get(dist) or metadata.version(dist)
        except metadata.PackageNotFoundError:
            out.add(f"lock.{dist}", f"locked {dist} {version} is not installed")
            continue
        if installed != version:
            out.add(f"lock.{dist}", f"locked {dist} {version}, but {installed} is "
                    "installed; reinstall that version or remove the [lock] entry")
