"""``gradpipe new-plugin NAME``: write a ready-to-install plugin distribution."""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence
from pathlib import Path

from .errors import GradpipeError
from .hookspecs import PLUGIN_API_VERSION

PYPROJECT = '''[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "A gradpipe plugin: {summary}."
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["gradpipe>=0.1"]
keywords = ["gradpipe", "tensorflow", "optimizer"]
classifiers = [
    "Programming Language :: Python :: 3",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
]

[project.optional-dependencies]
test = ["pytest"]

[project.entry-points.gradpipe]
{short} = "{module}"

# the name index: gradpipe imports this module only when a pipeline names
# one of these components ("kind.name"); keep it in step with the module
[project.entry-points."gradpipe.components"]
{index}

[tool.setuptools]
packages = ["{module}"]
'''

MODULE = '''"""{dist}: {summary}, for gradpipe."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from gradpipe.plugin import Transform, hookimpl, hyper, hyperparameter, map_grads
from gradpipe.plugin import no_state, positive

#: The gradpipe plugin API this module is written for.
GRADPIPE_PLUGIN_API = {api}
{components}

@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
{registrations}
'''

#: One example transform of the module; each component gets its own.
COMPONENT = '''

@attrs.frozen(kw_only=True)
class {config}:
    """Config of ``{component}``.

    Attributes:
        factor: multiplies every gradient (a number or a schedule).
    """

    example: ClassVar[dict] = {{"factor": 0.5}}

    factor: Any = hyperparameter(default=1.0, validator=positive())


def {component}(cfg: {config}) -> Transform:
    """Multiply every gradient by ``factor``."""
    factor = hyper(cfg.factor)

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        f = factor()
        return map_grads(lambda g: g * tf.cast(f, g.dtype), grads), state

    return Transform(no_state, update)
'''

CONTRACT_TEST = '''"""{dist} registers its components and they pass the gradpipe contract suite."""

import pytest

from gradpipe.testing import check_component, contract_cases


def test_found_through_its_entry_point():
    assert contract_cases(dist="{dist}") == [
{cases}
    ]


@pytest.mark.parametrize("kind, name", contract_cases(dist="{dist}"))
def test_contract(kind, name):
    check_component(kind, name)
'''

TEST = '''"""``{component}`` does what it says."""

import numpy as np
import tensorflow as tf

import gradpipe


def test_{component}_scales_the_gradient():
    var = tf.Variable([1.0, 1.0])
    pipe = gradpipe.build({{"transforms": [{{"kind": "{component}", "factor": 0.5}},
                                          {{"kind": "sgd", "learning_rate": 1.0}}]}})
    pipe.apply_gradients([(tf.constant([2.0, -2.0]), var)])
    np.testing.assert_allclose(var.numpy(), [0.0, 2.0], rtol=0, atol=1e-7)
'''

README = '''# {dist}

A gradpipe plugin providing {described}. Each multiplies every gradient by
`factor` (a number or a schedule).

```toml
[gradpipe]
require = ["{dist}>=0.1"]

[[transforms]]
kind = "{first}"
factor = 0.5

[[transforms]]
kind = "adam"
```

```bash
pip install ".[test]"     # the plugin, and pytest for its tests
gradpipe plugins          # lists {dist} and its components
pytest                    # its tests, the gradpipe contract suite included
```

The tests need the `test` extra (`pip install ".[test]"`); a plain
`pip install .` installs the plugin alone.

Each component is a config class and a factory in `{module}/__init__.py`,
registered in its `gradpipe_register_transforms` hook, with a test in
`tests/test_<component>.py`; `tests/test_contract.py` runs the gradpipe
contract suite on all of them. `pyproject.toml` names the module once, under
the entry point `gradpipe`, and lists every component in the
`gradpipe.components` index, which lets gradpipe import the module only when
a pipeline names one of them: a component missing from the index fails the
contract test. `gradpipe new-plugin NAME --component A --component B` writes
a plugin of several components.
'''

GITIGNORE = '''__pycache__/
*.py[cod]
*.egg-info/
build/
dist/
.pytest_cache/
.venv/
'''


def new_plugin(name: str, directory: Path, components: Sequence[str] = ()) -> Path:
    """Write the distribution ``gradpipe-NAME`` into ``directory``, with a transform
    for each of ``components`` (default: one named ``NAME``); return its folder."""
    short = _identifier(re.sub(r"^gradpipe[-_]", "", name), "plugin name")
    names = [_identifier(c, "component name") for c in components] or [short]
    repeated = sorted({c for c in names if names.count(c) > 1})
    if repeated:
        raise GradpipeError(f"--component {repeated[0]} is given twice: give each "
                            "component once")
    dist = f"gradpipe-{short.replace('_', '-')}"
    module = f"gradpipe_{short}"
    root = directory / dist
    if root.exists():
        raise GradpipeError(f"{root} already exists; choose another name or directory")
    values = {"dist": dist, "module": module, "short": short, "first": names[0],
              "api": PLUGIN_API_VERSION, "summary": _listed(names, "{}"),
              "described": _listed(names, "`{}`"),
              "index": "\n".join(f'"transform.{c}" = "{module}"' for c in names),
              "components": "".join(COMPONENT.format(component=c, config=_config(c))
                                    for c in names),
              "registrations": "\n".join(f'    register("{c}", {c}, {_config(c)})'
                                         for c in names),
              "cases": "\n".join(f'        ("transform", "{c}"),' for c in sorted(names))}
    files = {
        root / "pyproject.toml": PYPROJECT.format(**values),
        root / "README.md": README.format(**values),
        root / ".gitignore": GITIGNORE,
        root / module / "__init__.py": MODULE.format(**values),
        root / "tests" / "test_contract.py": CONTRACT_TEST.format(**values),
    }
    files.update({root / "tests" / f"test_{c}.py": TEST.format(component=c) for c in names})
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _identifier(text: str, what: str) -> str:
    """``text`` as a Python name: lower case, ``-`` as ``_``."""
    name = text.replace("-", "_").lower()
    if not name.isidentifier() or keyword.iskeyword(name):
        raise GradpipeError(f"{what} {text!r} must be letters, digits, '-' and '_', "
                            "starting with a letter")
    return name


def _listed(names: Sequence[str], form: str) -> str:
    """``the scale transform``, ``the transforms scale, clip_half``."""
    listed = ", ".join(form.format(n) for n in names)
    return f"the {listed} transform" if len(names) == 1 else f"the transforms {listed}"


def _config(component: str) -> str:
    """``ScaleConfig`` for ``scale``, ``ClipHalfConfig`` for ``clip_half``."""
    return "".join(part.capitalize() for part in component.split("_")) + "Config"
