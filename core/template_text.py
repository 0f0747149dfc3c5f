"""The files ``gradpipe new-plugin`` writes, as ``str.format`` templates."""

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

from typing import {typing}

import attrs

from gradpipe.plugin import (
{imports}
)

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

#: One example update rule: a bias-corrected running mean, with its own step count.
RULE = '''

class {state}(NamedTuple):
    count: Any  # updates applied (int64): a skipped step does not advance it
    mu: list[Any]  # one running mean per variable


@attrs.frozen(kw_only=True)
class {config}:
    """Config of ``{component}``.

    Attributes:
        learning_rate: step size (a number or a schedule).
        beta: decay of the running mean of the gradients, in [0, 1).
    """

    example: ClassVar[dict] = {{"learning_rate": 0.001}}

    learning_rate: Any = hyperparameter(default=0.001, validator=positive())
    beta: Any = hyperparameter(default=0.9, validator=in_range(0.0, 1.0, high_open=True))


def {component}(cfg: {config}) -> Transform:
    """Step by the running mean of the gradients, bias-corrected as Adam's first moment."""
    lr, beta = hyper(cfg.learning_rate), hyper(cfg.beta)

    def init(variables: list[Any]) -> {state}:
        import tensorflow as tf

        return {state}(tf.constant(0, tf.int64), zeros_like_vars(variables))

    def update(grads: list[Any], state: {state}, variables: list[Any]) -> Any:
        import tensorflow as tf

        count = state.count + 1  # this is the count-th applied update
        step = lr() / (1 - tf.pow(beta(), tf.cast(count, tf.float32)))
        updates, mus = [], []
        for g, m, var in zip(grads, state.mu, variables):
            if g is None:  # no gradient: no update, state as it was
                updates.append(None)
                mus.append(m)
                continue
            dtype = slot_dtype(var)  # float32 for a float16 variable
            b = tf.cast(beta(), dtype)
            # dense(g): an embedding's sparse gradient made dense (the guide's rowwise()
            # updates its rows alone instead)
            m = b * m + (1 - b) * tf.cast(dense(g), dtype)
            updates.append(tf.cast(tf.cast(step, dtype) * m, var.dtype))
            mus.append(m)
        return updates, {state}(count, mus)

    return Transform(init, update)
'''

#: What each kind of component imports from gradpipe.plugin besides what all do.
IMPORTS = {"transform": ("map_grads", "no_state"),
           "rule": ("Capabilities", "dense", "in_range", "slot_dtype", "zeros_like_vars")}

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

RULE_TEST = '''"""``{component}`` steps by its bias-corrected running mean."""

import numpy as np
import tensorflow as tf

import gradpipe


def test_{component}_steps_by_its_bias_corrected_mean():
    var = tf.Variable([1.0, -1.0])
    pipe = gradpipe.build({{"transforms": [
        {{"kind": "{component}", "learning_rate": 0.1, "beta": 0.5}}]}})
    grads = [np.array([1.0, 2.0]), np.array([3.0, -2.0])]
    expected, mean = np.array([1.0, -1.0]), 0.0
    for t, g in enumerate(grads, start=1):
        pipe.apply_gradients([(tf.constant(g, tf.float32), var)])
        mean = 0.5 * mean + 0.5 * g
        expected -= 0.1 * mean / (1 - 0.5 ** t)
    np.testing.assert_allclose(var.numpy(), expected, rtol=1e-6)
    assert int(pipe.transform_state("{component}")["count"]) == 2
'''

README = '''# {dist}

A gradpipe plugin providing {described}.
{behaviour}

```toml
[gradpipe]
require = ["{dist}>=0.1"]
{example}
```

```bash
pip install -e ".[test]"  # the plugin, editable, and pytest for its tests
gradpipe plugins          # lists {dist} and its components
pytest                    # its tests, the gradpipe contract suite included
```

The tests need the `test` extra (`pip install -e ".[test]"`); a plain
`pip install .` installs the plugin alone. Installed editable (`-e`), the
plugin is the code in this folder: an edit is what the tests and gradpipe
run next, with no reinstall (a plain install keeps testing the copy it
made).

Each component is a config class and a factory in `{module}/__init__.py`,
registered in its `gradpipe_register_transforms` hook, with a test in
`tests/test_<component>.py`; `tests/test_contract.py` runs the gradpipe
contract suite on all of them. `pyproject.toml` names the module once, under
the entry point `gradpipe`, and lists every component in the
`gradpipe.components` index, which lets gradpipe import the module only when
a pipeline names one of them: a component missing from the index fails the
contract test. `gradpipe new-plugin NAME --component A --rule B` writes a
plugin of several components: `--component` a transform, `--rule` an update
rule (one with state, a step count and `Capabilities(update_rule=True)`).
'''

GITIGNORE = '''__pycache__/
*.py[cod]
*.egg-info/
build/
dist/
.pytest_cache/
.venv/
'''
