"""Generate the reference pages: components from the live registry, the
command line from its parser, the plugin API from its docstrings.

    python docs/gen_reference.py            # rewrite the pages
    python docs/gen_reference.py --check    # exit 1 if a page is stale

A test runs the check, so the reference can never drift from the code.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

from _generated import write_or_check

from gradpipe._engine.proof_table import PROVED
from gradpipe.cli import _parser
from gradpipe.config_rows import FieldRow, field_rows, summary
from gradpipe.entry_points import KIND_HOOKS
from gradpipe.registry import get_registry

PAGE = Path(__file__).parent / "reference" / "components.md"
CLI_PAGE = Path(__file__).parent / "reference" / "cli.md"
API_PAGE = Path(__file__).parent / "reference" / "plugin-api.md"
TITLES = {
    "transform": "Transforms and update rules",
    "loss_scale": "Loss scalers (`[loss_scale]`)",
    "schedule": "Schedules (`[schedules.NAME]` or inline)",
    "convergence": "Convergence criteria (`[[convergence]]`)",
    "placement": "Placements (`[placement]`)",
    "problem": "Problems (`[problem]`, for `gradpipe run`)",
}


#: How the engine knows each transform's outputs finite (the engine's guard and plan).
FINITE = ("A step writes no NaN or infinity: before its first assignment every "
          "transform's updates and new state are known finite, in one of three ways. "
          "*Proved* from a few scalars for the transforms whose entry says so: gradpipe "
          "knows their maths (the conditions are in the [user guide]"
          "(../user-guide.md#what-one-step-does)). *Bounded* for any other transform, a "
          "plugin's included, whose traced maths the engine can follow: an interval for "
          "every value from the norms of its input and state, and a check of the chain "
          "where a bound fails at run time. *Checked* otherwise (an operation with no "
          "bound, such as a matrix product, or a state whose sign a bound would need): "
          "one sum over its updates and new state. `pipe.plan` names which, and why, "
          "for a built pipeline.")


def _default(row: FieldRow) -> str:
    return "**required**" if row.required else f"`{row.default_text}`"


def _engine_notes(comp: Any) -> str:
    """What the engine knows of this component beyond its config (docs/performance.md)."""
    found = []
    if comp.capabilities.describe():
        found.append("declares " + ", ".join(comp.capabilities.describe()))
    if comp.kind == "transform" and comp.name in PROVED:
        found.append("outputs proved finite from a few scalars, where its config "
                     "permits")
    if comp.kernel is not None:
        found.append("a fused in-place kernel on the plain path")
    return "; ".join(found)


def render() -> str:
    registry = get_registry().load_all()
    out = ["# Component reference", "",
           "Generated from the installed registry by `docs/gen_reference.py`; do not edit.",
           "Every parameter below is a key of the component's TOML table.", ""]
    for kind in KIND_HOOKS:
        names = [n for n in registry.names(kind)
                 if registry.components[(kind, n)].provider.dist == "gradpipe"]
        if not names:
            continue
        out += [f"## {TITLES[kind]}", ""]
        if kind == "transform":
            out += [FINITE, ""]
        for name in names:
            comp = registry.components[(kind, name)]
            out += [f"### `{name}`", "", summary(comp), ""]
            notes = _engine_notes(comp)
            if notes:
                out += [f"Engine: {notes}.", ""]
            rows = field_rows(comp.config_cls)  # shared with `gradpipe describe`
            if not rows:
                out += ["No parameters.", ""]
                continue
            out += ["| key | type | default | meaning |", "|---|---|---|---|"]
            for row in rows:
                cells = [f"`{row.name}`", row.type, _default(row), row.meaning]
                # A "|" inside a cell ("int | float") would split the table's row.
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_cli() -> str:
    """Every command's ``--help``, as the parser prints it at 88 columns."""
    os.environ["COLUMNS"] = "88"
    commands = _parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    out = ["# Command-line reference", "",
           "Generated from the parser by `docs/gen_reference.py`: each command's `--help`.",
           "The [command-line guide](../cli.md) explains what each command does.", ""]
    for name, parser in commands.items():
        out += [f"## `gradpipe {name}`", "", "```text", parser.format_help().rstrip(),
                "```", ""]
    return "\n".join(out).rstrip() + "\n"


#: The sections of the plugin API page: the modules ``gradpipe.plugin`` takes
#: its names from, in the order a plugin author meets them.
API_SECTIONS = {
    "hookspecs": "Registering: hooks and the plugin API",
    "transform": "Writing a transform",
    "tensors": "Tensor helpers, dense and sparse",
    "fields": "Config fields",
    "validators": "Validators",
    "capabilities": "Capabilities",
    "names": "Variable paths",
    "convergence": "Convergence criteria",
    "distribute": "Placements",
    "errors": "Errors",
}


def render_plugin_api() -> str:
    """Every name ``gradpipe.plugin`` exports, with its signature and docstring (or
    the ``#:`` comment above a constant), by the module it comes from."""
    import gradpipe.plugin as api

    source = Path(api.__file__).read_text()
    origin = {alias.name: node.module for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.ImportFrom) and node.module
              for alias in node.names}
    missing = set(api.__all__) - set(origin)
    unknown = set(origin.values()) - set(API_SECTIONS) - {"__future__"}
    if missing or unknown:
        raise SystemExit(f"gradpipe.plugin: names of no module {sorted(missing)}, "
                         f"modules without a section {sorted(unknown)}")
    out = ["# Plugin API reference", "",
           "Generated from `gradpipe.plugin` by `docs/gen_reference.py`: every name it",
           "exports, with its docstring. The [plugin-author guide](../plugin-guide.md)",
           "shows them at work.", ""]
    for module, title in API_SECTIONS.items():
        names = [n for n in api.__all__ if origin[n] == module]
        out += [f"## {title}", ""]
        for name in names:
            heading, doc = _api_entry(name, getattr(api, name), module)
            out += [f"### `{heading}`", "", doc, ""]
    return "\n".join(out).rstrip() + "\n"


def _api_entry(name: str, obj: Any, module: str) -> tuple[str, str]:
    """``(heading, text)`` of one exported name; an undocumented one stops the page."""
    if inspect.isclass(obj) or inspect.isfunction(obj):
        doc = inspect.cleandoc(obj.__doc__ or "")
        heading = f"class {name}{_signature(obj)}" if inspect.isclass(obj) else \
            f"{name}{_signature(obj)}"
    else:  # a constant or a marker: the ``#:`` comment above its assignment
        doc = _doc_comment(name, Path(sys.modules[f"gradpipe.{module}"].__file__ or ""))
        heading = f"{name} = {obj!r}" if isinstance(obj, (int, str)) else name
    if not doc:
        raise SystemExit(f"gradpipe.plugin.{name} is not documented: give it a docstring "
                         "(or a #: comment above a constant)")
    return heading, _markdown(doc)


def _signature(obj: Any) -> str:
    """A function's signature with its types; a class's arguments by name only (its
    fields' types are in its docstring, and a NamedTuple's read as ForwardRefs)."""
    try:
        signature = inspect.signature(obj, eval_str=True)
    except (TypeError, ValueError, NameError):  # an exception's; a type under TYPE_CHECKING
        return "" if inspect.isclass(obj) else str(inspect.signature(obj))
    if inspect.isclass(obj):
        signature = signature.replace(parameters=[
            p.replace(annotation=inspect.Parameter.empty)
            for p in signature.parameters.values()])
    text = re.sub(r"\b(collections\.abc|typing)\.", "", str(signature))
    return re.sub(r" -> None$", "", text)


def _markdown(doc: str) -> str:
    """A docstring as Markdown: reST roles (:func:`x`) as code, and the entries of a
    Google-style ``Attributes:`` or ``Returns:`` section as a list (indented, they
    would read as a code block)."""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", doc)
    out: list[str] = []
    for line in doc.splitlines():
        entry = re.match(r"    (\w+): (.*)", line)
        if entry:
            if out and out[-1] and not out[-1].startswith(("* ", "  ")):
                out.append("")  # Markdown starts a list only after a blank line
            out.append(f"* `{entry.group(1)}`: {entry.group(2)}")
        elif line.startswith("        "):
            out.append("  " + line.strip())  # an entry's next line
        else:
            out.append(line.strip() if line.startswith("    ") else line)
    return "\n".join(out)


def _doc_comment(name: str, path: Path) -> str:
    lines = path.read_text().splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith(f"{name} =")), 0)
    comment = []
    while at > 0 and lines[at - 1].startswith("#:"):
        at -= 1
        comment.insert(0, lines[at][2:].strip())
    return " ".join(comment)


def main() -> int:
    return write_or_check({PAGE: render(), CLI_PAGE: render_cli(),
                           API_PAGE: render_plugin_api()}, "gen_reference.py")


if __name__ == "__main__":
    sys.exit(main())
