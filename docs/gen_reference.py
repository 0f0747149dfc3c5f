"""Generate docs/reference/components.md from the live registry.

    python docs/gen_reference.py            # rewrite the page
    python docs/gen_reference.py --check    # exit 1 if the page is stale

A test runs the check, so the reference can never drift from the code.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import attrs

from gradpipe.fields import HYPER, SCHEDULE, field_types
from gradpipe.registry import KIND_HOOKS, get_registry

PAGE = Path(__file__).parent / "reference" / "components.md"
TITLES = {
    "transform": "Transforms and update rules",
    "loss_scale": "Loss scalers (`[loss_scale]`)",
    "schedule": "Schedules (`[schedules.NAME]` or inline)",
    "convergence": "Convergence criteria (`[[convergence]]`)",
    "placement": "Placements (`[placement]`)",
    "problem": "Problems (`[problem]`, for `gradpipe run`)",
}


def _type(tp: object, field: attrs.Attribute) -> str:
    if field.metadata.get(HYPER):
        return "float or schedule"
    if field.metadata.get(SCHEDULE):
        return "schedule"
    text = getattr(tp, "__name__", None) or str(tp)
    return text.replace("typing.", "").replace("NoneType", "None")


def _default(field: attrs.Attribute) -> str:
    if field.default is attrs.NOTHING:
        return "**required**"
    if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
        return "`" + repr(field.default.factory()) + "`"
    return f"`{field.default!r}`"


def _attribute_docs(cls: type) -> dict[str, str]:
    doc = inspect.getdoc(cls) or ""
    found: dict[str, str] = {}
    current = None
    in_attrs = False
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            in_attrs = True
            continue
        if not in_attrs:
            continue
        stripped = line.strip()
        if line.startswith("    ") and not line.startswith("        ") and ":" in stripped:
            current, text = stripped.split(":", 1)
            found[current] = text.strip()
        elif current and line.startswith("        "):
            found[current] += " " + stripped
    return found


def _fast_path(cls: type) -> str:
    """The step's fast paths this component declares (docs/performance.md)."""
    found = []
    if getattr(cls, "xla_compatible", False):
        found.append('compiles under XLA (`jit_compile = "auto"`)')
    declared = inspect.getattr_static(cls, "preserves_finite", False)
    if isinstance(declared, property):  # depends on the config: say when
        if getattr(cls(), "preserves_finite", False):
            when = (inspect.getdoc(declared) or "").split("\n")[0].rstrip(".")
            found.append(f"updates proved finite by scalars ({when[0].lower()}{when[1:]})")
    elif declared:
        found.append("updates proved finite by scalars")
    if getattr(cls, "elementwise", False):
        found.append('state packed with many small variables (`pack_variables = "auto"`)')
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
            cls = comp.config_cls
            summary = (inspect.getdoc(comp.factory) or inspect.getdoc(cls) or "").split("\n")[0]
            out += [f"### `{name}`", "", summary, ""]
            fast = _fast_path(cls)
            if fast:
                out += [f"Fast path: {fast}.", ""]
            docs = _attribute_docs(cls)
            fields = attrs.fields(cls)
            if not fields:
                out += ["No parameters.", ""]
                continue
            types = field_types(cls)
            out += ["| key | type | default | meaning |", "|---|---|---|---|"]
            for f in fields:
                out.append(f"| `{f.name}` | {_type(types.get(f.name), f)} | {_default(f)} "
                           f"| {docs.get(f.name, '')} |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is stale: run python docs/gen_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
