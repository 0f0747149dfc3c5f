"""``gradpipe new-plugin NAME``: write a ready-to-install plugin distribution."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import GradpipeError
from .hookspecs import PLUGIN_API_VERSION

PYPROJECT = '''[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "A gradpipe plugin: the {component} transform."
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
{component} = "{module}"

# the name index: gradpipe imports this module only when a pipeline names
# one of these components ("kind.name"); keep it in step with the module
[project.entry-points."gradpipe.components"]
"transform.{component}" = "{module}"

[tool.setuptools]
packages = ["{module}"]
'''

MODULE = '''"""{dist}: the ``{component}`` gradient transform for gradpipe."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from gradpipe.plugin import Transform, hookimpl, hyper, hyperparameter, map_grads
from gradpipe.plugin import no_state, positive

#: The gradpipe plugin API this module is written for.
GRADPIPE_PLUGIN_API = {api}


@attrs.frozen(kw_only=True)
class Config:
    """Config of ``{component}``.

    Attributes:
        factor: multiplies every gradient (a number or a schedule).
    """

    example: ClassVar[dict] = {{"factor": 0.5}}

    factor: Any = hyperparameter(default=1.0, validator=positive())


def {component}(cfg: Config) -> Transform:
    """Multiply every gradient by ``factor``."""
    factor = hyper(cfg.factor)

    def update(grads: list[Any], state: Any, variables: list[Any]) -> Any:
        import tensorflow as tf

        f = factor()
        return map_grads(lambda g: g * tf.cast(f, g.dtype), grads), state

    return Transform(no_state, update)


@hookimpl
def gradpipe_register_transforms(register: Any) -> None:
    register("{component}", {component}, Config)
'''

TEST = '''"""{dist} passes the gradpipe contract suite and does what it says."""

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from gradpipe.testing import check_component, contract_cases


def test_found_through_its_entry_point():
    assert contract_cases(dist="{dist}") == [("transform", "{component}")]


@pytest.mark.parametrize("kind, name", contract_cases(dist="{dist}"))
def test_contract(kind, name):
    check_component(kind, name)


def test_scales_the_gradient():
    var = tf.Variable([1.0, 1.0])
    pipe = gradpipe.build({{"transforms": [{{"kind": "{component}", "factor": 0.5}},
                                          {{"kind": "sgd", "learning_rate": 1.0}}]}})
    pipe.apply_gradients([(tf.constant([2.0, -2.0]), var)])
    np.testing.assert_allclose(var.numpy(), [0.0, 2.0], rtol=0, atol=1e-7)
'''

README = '''# {dist}

A gradpipe plugin providing the `{component}` transform, which multiplies every
gradient by `factor` (a number or a schedule).

```toml
[gradpipe]
require = ["{dist}>=0.1"]

[[transforms]]
kind = "{component}"
factor = 0.5

[[transforms]]
kind = "adam"
```

```bash
pip install ".[test]"     # the plugin, and pytest for its tests
gradpipe plugins          # lists {dist} and the {component} transform
pytest                    # its tests, the gradpipe contract suite included
```

The tests need the `test` extra (`pip install ".[test]"`); a plain
`pip install .` installs the plugin alone.

`pyproject.toml` lists each component twice: under the entry point `gradpipe`
(the module) and in the `gradpipe.components` index, which lets gradpipe
import the module only when a pipeline names a component. Add a new
component to both.
'''

GITIGNORE = '''__pycache__/
*.py[cod]
*.egg-info/
build/
dist/
.pytest_cache/
.venv/
'''


def new_plugin(name: str, directory: Path) -> Path:
    """Write the distribution ``gradpipe-NAME`` into ``directory``; return its folder."""
    short = re.sub(r"^gradpipe[-_]", "", name).replace("-", "_").lower()
    if not short.isidentifier():
        raise GradpipeError(f"plugin name {name!r} must be letters, digits, '-' and '_', "
                            "starting with a letter")
    dist = f"gradpipe-{short.replace('_', '-')}"
    module = f"gradpipe_{short}"
    component = short
    root = directory / dist
    if root.exists():
        raise GradpipeError(f"{root} already exists; choose another name or directory")
    values = {"dist": dist, "module": module, "component": component,
              "api": PLUGIN_API_VERSION}
    files = {
        root / "pyproject.toml": PYPROJECT,
        root / "README.md": README,
        root / ".gitignore": GITIGNORE,
        root / module / "__init__.py": MODULE,
        root / "tests" / f"test_{short}.py": TEST,
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(**values))
    return root
