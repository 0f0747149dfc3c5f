"""Docs cannot drift from the code: built strictly, generated pages fresh."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import ROOT
from gradpipe import hookspecs
from gradpipe.cli import _parser


def test_mkdocs_builds_strict(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                             "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_component_reference_is_generated_from_code():
    result = subprocess.run([sys.executable, "docs/gen_reference.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_ci_runs_the_readme_test_command():
    """.ci/run runs exactly the README's test command, nothing weaker."""
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(python -m pip install[^\n]*)\n```", readme)
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()
    assert "gradpipe run examples/quickstart.toml" in commands[0]


@pytest.mark.parametrize("hook", sorted(n for n in dir(hookspecs)
                                        if n.startswith("gradpipe_register_")))
def test_every_hook_is_documented(hook):
    assert (getattr(hookspecs, hook).__doc__ or "").count(":param register:") == 1
    assert hook in (ROOT / "docs" / "plugin-guide.md").read_text()


def test_every_cli_command_is_documented():
    text = (ROOT / "docs" / "cli.md").read_text()
    commands = _parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in commands:
        assert f"## `gradpipe {name}" in text, name


def test_plugin_guide_snippets_run(tmp_path):
    """Every python/toml snippet of the plugin-author guide runs or validates."""
    import types

    import tomllib

    import gradpipe
    from gradpipe.registry import Provider, get_registry

    text = (ROOT / "docs" / "plugin-guide.md").read_text()
    blocks = re.findall(r"```(python|toml|bash)\n(.*?)```", text, re.S)
    python = [code for lang, code in blocks if lang == "python"]
    module = types.ModuleType("gradpipe_scale_guide")
    exec(compile(python[0], "plugin-guide.md", "exec"), module.__dict__)
    assert module.GRADPIPE_PLUGIN_API == gradpipe.PLUGIN_API_VERSION
    registry = get_registry()
    if ("transform", "scale") not in registry.components:
        record = registry.register_plugin(module, Provider(dist="gradpipe-scale",
                                                           version="0.1.0",
                                                           entry_point="scale"))
        assert record.status == "loaded", record.error
    for lang, code in blocks:
        if lang == "toml":
            data = tomllib.loads(code)
            if "transforms" in data:
                data.get("gradpipe", {}).pop("require", None)  # not pip-installed here
                gradpipe.parse(data)
            else:
                groups = data["project"]["entry-points"]
                assert groups.get("gradpipe", {}).get("scale", "gradpipe_scale") == \
                    "gradpipe_scale"
                assert groups.get("gradpipe.components", {}).get(
                    "transform.scale", "gradpipe_scale") == "gradpipe_scale"
    contract = types.ModuleType("guide_contract")
    exec(compile(python[1], "plugin-guide.md", "exec"), contract.__dict__)
    cases = contract.contract_cases(dist="gradpipe-scale")
    assert cases == [("transform", "scale")]
    for kind, name in cases:
        contract.test_contract(kind, name)  # the parametrized test, called directly
    bash = next(code for lang, code in blocks if lang == "bash")
    assert "gradpipe new-plugin scale" in bash
