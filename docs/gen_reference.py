"""Generate the reference pages: components from the live registry, the
command line from its parser.

    python docs/gen_reference.py            # rewrite the pages
    python docs/gen_reference.py --check    # exit 1 if a page is stale

A test runs the check, so the reference can never drift from the code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gradpipe._engine.proofs import PROVED
from gradpipe.cli import _parser
from gradpipe.config_rows import FieldRow, field_rows, summary
from gradpipe.entry_points import KIND_HOOKS
from gradpipe.registry import get_registry

PAGE = Path(__file__).parent / "reference" / "components.md"
CLI_PAGE = Path(__file__).parent / "reference" / "cli.md"
TITLES = {
    "transform": "Transforms and update rules",
    "loss_scale": "Loss scalers (`[loss_scale]`)",
    "schedule": "Schedules (`[schedules.NAME]` or inline)",
    "convergence": "Convergence criteria (`[[convergence]]`)",
    "placement": "Placements (`[placement]`)",
    "problem": "Problems (`[problem]`, for `gradpipe run`)",
}


def _default(row: FieldRow) -> str:
    return "**required**" if row.required else f"`{row.default_text}`"


def _engine_notes(comp: Any) -> str:
    """What the engine knows of this component beyond its config (docs/performance.md)."""
    found = []
    if comp.capabilities.describe():
        found.append("declares " + ", ".join(comp.capabilities.describe()))
    if comp.kind == "transform" and comp.name in PROVED:
        found.append("outputs proved finite from scalars (other transforms' are checked)")
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


def main() -> int:
    pages = {PAGE: render(), CLI_PAGE: render_cli()}
    if "--check" in sys.argv:
        stale = [page for page, text in pages.items()
                 if not page.exists() or page.read_text() != text]
        for page in stale:
            print(f"{page} is stale: run python docs/gen_reference.py", file=sys.stderr)
        return 1 if stale else 0
    for page, text in pages.items():
        page.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
