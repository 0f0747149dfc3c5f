"""ruff and mypy, as configured in pyproject.toml, are clean; the layout holds."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGES = [ROOT / "core", ROOT / "plugins", *(ROOT / "contrib").glob("*/gradpipe_*")]
MAX_MODULE_LINES = 360  # "about 350": one concern per module


def test_ruff_clean():
    paths = ["core", "plugins", "tests", "contrib", "docs", "benchmarks"]
    result = subprocess.run([sys.executable, "-m", "ruff", "check", *paths], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_clean_on_core_plugins_and_contrib():
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues found in" in result.stdout


def test_no_module_is_long():
    long = {str(p.relative_to(ROOT)): n for package in PACKAGES for p in package.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The gradpipe modules ``module`` imports, inside functions too."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            candidates = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for name in candidates:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name not in (module, "gradpipe"):
                found.add(name)
    return found


def test_the_package_has_no_import_cycle():
    """Data flows one way (file, spec, components, plan, step): no module imports,
    even inside a function, one that imports it back."""
    files = {}
    for path in (ROOT / "core").rglob("*.py"):
        parts = path.relative_to(ROOT / "core").with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        files[".".join(("gradpipe", *parts))] = path
    graph = {m: _imports(p, m, set(files)) for m, p in files.items()}
    state: dict[str, int] = {}

    def cycle_from(module: str, stack: list[str]) -> list[str] | None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := cycle_from(dep, [*stack, dep])):
                return found
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            assert cycle_from(module, [module]) is None
    assert "gradpipe._engine.step" in graph  # the walk saw the private engine too
