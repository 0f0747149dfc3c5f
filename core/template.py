"""``gradpipe new-plugin NAME``: write a ready-to-install plugin distribution."""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence
from pathlib import Path

from .errors import GradpipeError
from .hookspecs import PLUGIN_API_VERSION
from .template_text import (
    COMPONENT,
    CONTRACT_TEST,
    GITIGNORE,
    IMPORTS,
    MODULE,
    PYPROJECT,
    README,
    RULE,
    RULE_TEST,
    TEST,
)


def new_plugin(name: str, directory: Path, components: Sequence[str] = (),
               rules: Sequence[str] = ()) -> Path:
    """Write the distribution ``gradpipe-NAME`` into ``directory``, with a transform
    for each of ``components`` and an update rule for each of ``rules`` (default: one
    transform named ``NAME``); return its folder."""
    short, transforms, rule_names = component_names(name, components, rules)
    names = transforms + rule_names
    dist = f"gradpipe-{short.replace('_', '-')}"
    module = f"gradpipe_{short}"
    root = directory / dist
    if root.exists():
        raise GradpipeError(f"{root} already exists; choose another name or directory")
    imports = {"Transform", "hookimpl", "hyper", "hyperparameter", "positive"}
    imports.update(*(IMPORTS[kind] for kind, present in (("transform", transforms),
                                                         ("rule", rule_names)) if present))
    values = {"dist": dist, "module": module, "short": short,
              "api": PLUGIN_API_VERSION, "summary": _described(transforms, rule_names, "{}"),
              "described": _described(transforms, rule_names, "`{}`"),
              "behaviour": _behaviour(transforms, rule_names),
              "example": _example(transforms, rule_names),
              "typing": "Any, ClassVar" + (", NamedTuple" if rule_names else ""),
              "imports": "\n".join(f"    {n}," for n in sorted(
                  imports, key=lambda n: (not n[0].isupper(), n))),
              "index": "\n".join(f'"transform.{c}" = "{module}"' for c in names),
              "components": "".join(
                  RULE.format(component=c, config=_config(c), state=_config(c, "State"))
                  if c in rule_names else COMPONENT.format(component=c, config=_config(c))
                  for c in names),
              "registrations": "\n".join(
                  f'    register("{c}", {c}, {_config(c)},\n'
                  "             capabilities=Capabilities(update_rule=True))"
                  if c in rule_names else f'    register("{c}", {c}, {_config(c)})'
                  for c in names),
              "cases": "\n".join(f'        ("transform", "{c}"),' for c in sorted(names))}
    files = {
        root / "pyproject.toml": PYPROJECT.format(**values),
        root / "README.md": README.format(**values),
        root / ".gitignore": GITIGNORE,
        root / module / "__init__.py": MODULE.format(**values),
        root / "tests" / "test_contract.py": CONTRACT_TEST.format(**values),
    }
    files.update({root / "tests" / f"test_{c}.py":
                  (RULE_TEST if c in rule_names else TEST).format(component=c) for c in names})
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def component_names(name: str, components: Sequence[str] = (), rules: Sequence[str] = ()
                    ) -> tuple[str, list[str], list[str]]:
    """The plugin's short name, its transforms' and its update rules' names, as Python
    names (``NAME`` alone: one transform named after the plugin)."""
    short = _identifier(re.sub(r"^gradpipe[-_]", "", name), "plugin name")
    transforms = [_identifier(c, "component name") for c in components]
    rule_names = [_identifier(c, "rule name") for c in rules]
    if not transforms and not rule_names:
        transforms = [short]
    names = transforms + rule_names
    repeated = sorted({c for c in names if names.count(c) > 1})
    if repeated:
        raise GradpipeError(f"{repeated[0]} is given twice: give each component once "
                            "(--component and --rule name one each)")
    return short, transforms, rule_names


def _identifier(text: str, what: str) -> str:
    """``text`` as a Python name: lower case, ``-`` as ``_``."""
    name = text.replace("-", "_").lower()
    if not name.isidentifier() or keyword.iskeyword(name):
        raise GradpipeError(f"{what} {text!r} must be letters, digits, '-' and '_', "
                            "starting with a letter")
    return name


def _described(transforms: Sequence[str], rules: Sequence[str], form: str) -> str:
    """``the scale transform``, ``the transforms a, b and the update rule c``."""
    parts = []
    for names, noun in ((transforms, "transform"), (rules, "update rule")):
        listed = ", ".join(form.format(n) for n in names)
        if names:
            parts.append(f"the {listed} {noun}" if len(names) == 1 else
                         f"the {noun}s {listed}")
    return " and ".join(parts)


def _behaviour(transforms: Sequence[str], rules: Sequence[str]) -> str:
    """What the README says the example components do."""
    said = []
    if transforms:
        said.append(f"{'Each transform' if len(transforms) > 1 else 'The transform'} "
                    "multiplies every gradient by `factor`\n(a number or a schedule).")
    if rules:
        said.append(f"{'Each update rule' if len(rules) > 1 else 'The update rule'} steps by "
                    "the running mean of the gradients,\nbias-corrected as Adam's first "
                    "moment (`learning_rate`, `beta`).")
    return "\n".join(said)


def _example(transforms: Sequence[str], rules: Sequence[str]) -> str:
    """The README's pipeline: the first transform, then the first rule (else adam)."""
    tables = [f'kind = "{c}"\nfactor = 0.5' for c in transforms[:1]]
    tables.append(f'kind = "{rules[0]}"\nlearning_rate = 0.001' if rules else 'kind = "adam"')
    return "".join(f"\n[[transforms]]\n{table}\n" for table in tables).rstrip("\n")


def _config(component: str, suffix: str = "Config") -> str:
    """``ScaleConfig`` for ``scale``, ``ClipHalfConfig`` for ``clip_half``."""
    return "".join(part.capitalize() for part in component.split("_")) + suffix
