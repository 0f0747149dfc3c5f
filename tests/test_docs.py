"""Docs cannot drift from the code: built strictly, generated pages fresh."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import forked
from conftest import ROOT
from gradpipe import hookspecs
from gradpipe.cli import _parser


@pytest.mark.slow
@pytest.mark.subprocess
def test_every_python_block_of_the_docs_runs(tmp_path):
    """Each page's ```python blocks run in order in one namespace, from a folder that
    holds the examples and a pipe.toml, the file the pages call yours. A fragment on
    purpose follows a <!-- no-run --> line."""
    import json
    import shutil

    pages = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    pages = [p for p in pages if "```python" in p.read_text()]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copy(ROOT / "examples" / "quickstart.toml", tmp_path / "pipe.toml")
    result = forked.run([sys.executable, str(ROOT / "tests" / "workers" / "doc_blocks.py"),
                         str(tmp_path / "out.json"), *map(str, pages)], cwd=tmp_path,
                        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    failed = {page: error for page, error in json.loads(
        (tmp_path / "out.json").read_text()).items() if error}
    assert not failed, "\n\n".join(failed.values())
    assert sum(p.read_text().count("<!-- no-run -->") for p in pages) <= 3


def test_mkdocs_builds_strict(tmp_path):
    result = forked.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                         "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                        text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_component_reference_is_generated_from_code():
    result = forked.run([sys.executable, "docs/gen_reference.py", "--check"], cwd=ROOT,
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
    declares = types.ModuleType("guide_capabilities")
    declares.__dict__.update(module.__dict__)  # the snippet continues the module above
    exec(compile(next(c for c in python if "Capabilities(" in c), "plugin-guide.md",
                 "exec"), declares.__dict__)
    seen = []
    declares.register_a_rule(lambda *args, **kwargs: seen.append(kwargs["capabilities"]))
    assert seen[0].update_rule
    contract = types.ModuleType("guide_contract")
    exec(compile(next(c for c in python if "contract_cases" in c), "plugin-guide.md",
                 "exec"), contract.__dict__)
    cases = contract.contract_cases(dist="gradpipe-scale")
    assert cases == [("transform", "scale")]
    for kind, name in cases:
        contract.test_contract(kind, name)  # the parametrized test, called directly
    bash = next(code for lang, code in blocks if lang == "bash")
    assert "gradpipe new-plugin scale" in bash


def test_plugin_guide_criterion_stops_minimize():
    """The guide's Criterion subclass registers, passes the contract suite, and stops
    ``minimize`` at the first step whose loss is at most its threshold."""
    import types

    import numpy as np
    import tensorflow as tf

    import gradpipe
    from gradpipe.registry import Provider, get_registry
    from gradpipe.testing import check_component

    text = (ROOT / "docs" / "plugin-guide.md").read_text()
    python = re.findall(r"```python\n(.*?)```", text, re.S)
    module = types.ModuleType("gradpipe_guide_criterion")
    exec(compile(python[0], "plugin-guide.md", "exec"), module.__dict__)
    del module.gradpipe_register_transforms  # the transform is registered above
    exec(compile(next(c for c in python if "Criterion)" in c), "plugin-guide.md", "exec"),
         module.__dict__)
    registry = get_registry()
    if ("convergence", "loss_below") not in registry.components:
        record = registry.register_plugin(module, Provider(
            dist="gradpipe-guide-criterion", version="0.1.0", entry_point="criterion"))
        assert record.status == "loaded", record.error
    check_component("convergence", "loss_below")

    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 0.1}],
                           "convergence": [{"kind": "loss_below", "threshold": 0.05}]})
    x = tf.Variable([1.0, -2.0])
    result = pipe.minimize(lambda: tf.reduce_sum(x * x), [x], max_steps=100)
    losses = result.trace.numpy()
    # sgd at rate 0.1 multiplies x by 0.8 per step: the loss 5 * 0.64**k
    expected = 5.0 * 0.64 ** np.arange(result.steps)
    np.testing.assert_allclose(losses[:result.steps], expected, rtol=1e-5)
    first = int(np.argmax(expected <= 0.05))
    assert result.converged and result.criterion == "loss_below"
    assert result.steps == first + 1


@pytest.mark.slow
def test_plugin_guide_step_count_is_that_of_applied_updates(tmp_path):
    """The guide's bias-corrected rule keeps its step count in its state: it passes
    the contract suite, counts applied updates only (accumulation, a skipped step),
    and a checkpoint carries the count, so a resumed run corrects as one that was
    never stopped."""
    import types

    import numpy as np
    import tensorflow as tf

    import gradpipe
    from gradpipe.plugin import hookimpl
    from gradpipe.registry import Provider, get_registry
    from gradpipe.testing import check_component

    text = (ROOT / "docs" / "plugin-guide.md").read_text()
    python = re.findall(r"```python\n(.*?)```", text, re.S)
    module = types.ModuleType("gradpipe_guide_step_count")
    exec(compile(python[0], "plugin-guide.md", "exec"), module.__dict__)
    exec(compile(next(c for c in python if "count = state.count + 1" in c),
                 "plugin-guide.md", "exec"), module.__dict__)

    @hookimpl
    def gradpipe_register_transforms(register):
        module.register_debiased_momentum(register)

    module.gradpipe_register_transforms = gradpipe_register_transforms
    registry = get_registry()
    if ("transform", "debiased_momentum") not in registry.components:
        record = registry.register_plugin(module, Provider(
            dist="gradpipe-guide-step-count", version="0.1.0", entry_point="step_count"))
        assert record.status == "loaded", record.error
    check_component("transform", "debiased_momentum")

    lr, beta = 0.1, 0.5
    table = {"pipeline": {"accumulation_steps": 2},
             "transforms": [{"kind": "debiased_momentum", "learning_rate": lr,
                             "beta": beta}]}

    def fresh():
        var = tf.Variable([1.0, -2.0])
        pipe = gradpipe.build(table)
        pipe.build([var])
        return pipe, var

    def feed(pipe, var, *grads):
        for g in grads:
            pipe.apply_gradients([(tf.constant(g), var)])

    pipe, var = fresh()
    feed(pipe, var, [1.0, 2.0], [3.0, 2.0], [float("nan"), 0.0])  # one update, one skip
    count = pipe.transform_state("debiased_momentum")["count"]
    assert int(count.numpy()) == int(pipe.iterations.numpy()) == 1
    path = tf.train.Checkpoint(pipeline=pipe, var=var).save(str(tmp_path / "ck"))
    resumed, var2 = fresh()
    tf.train.Checkpoint(pipeline=resumed, var=var2).restore(path).assert_consumed()
    for p, v in ((pipe, var), (resumed, var2)):
        feed(p, v, [-1.0, 0.0], [1.0, 4.0])  # the second update
        assert int(p.transform_state("debiased_momentum")["count"].numpy()) == 2

    mean_1, mean_2 = np.array([2.0, 2.0]), np.array([0.0, 2.0])
    m_1 = (1 - beta) * mean_1
    m_2 = beta * m_1 + (1 - beta) * mean_2
    expected = (np.array([1.0, -2.0]) - lr * m_1 / (1 - beta)
                - lr * m_2 / (1 - beta ** 2))
    np.testing.assert_allclose(var.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(var2.numpy(), expected, rtol=1e-6)


def test_every_name_gradpipe_plugin_exports_is_documented():
    """Each name of gradpipe.plugin has a docstring of its own (a constant: a #:
    comment) and an entry in the generated plugin API reference that says what it
    is; the guide points there."""
    import inspect

    import gradpipe.plugin as api

    page = (ROOT / "docs" / "reference" / "plugin-api.md").read_text()
    entries = dict(re.findall(r"^### `(?:class )?(\w+)[^\n]*\n\n(.+?)(?=^##|\Z)", page,
                              re.S | re.M))
    problems = [f"{name}: no docstring" for name in api.__all__
                if (inspect.isclass(getattr(api, name)) or inspect.isfunction(getattr(
                    api, name))) and not (getattr(api, name).__doc__ or "").strip()]
    problems += [f"{name}: not in docs/reference/plugin-api.md" for name in api.__all__
                 if not entries.get(name, "").strip()]
    assert not problems, problems
    assert set(entries) == set(api.__all__)
    assert "(reference/plugin-api.md)" in (ROOT / "docs" / "plugin-guide.md").read_text()


def test_cli_guide_names_every_option_of_every_command():
    """docs/cli.md cannot drift from the parser: each command's heading lists every
    option the parser has (the generated reference prints each one's --help)."""
    text = (ROOT / "docs" / "cli.md").read_text()
    commands = _parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, parser in commands.items():
        heading = next(line for line in text.splitlines()
                       if line.startswith(f"## `gradpipe {name}"))
        options = {o for action in parser._actions for o in action.option_strings
                   if o.startswith("--") and o != "--help"}
        assert options, name
        missing = sorted(o for o in options if o not in heading)
        assert not missing, f"gradpipe {name}: {missing} not in {heading!r}"


def test_run_help_gives_each_problems_own_default_steps():
    """`gradpipe run --help` states the step count each built-in problem runs."""
    import os

    import gradpipe
    from gradpipe.registry import get_registry
    from gradpipe.runner import DEFAULT_STEPS

    os.environ.setdefault("COLUMNS", "200")
    help_text = " ".join(_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
                         .choices["run"].format_help().split())
    problems = get_registry().names("problem")
    assert len(problems) >= 5
    for name in problems:
        steps = getattr(gradpipe.create("problem", {"kind": name}), "default_steps",
                        DEFAULT_STEPS)
        assert f"{name} {steps}" in help_text, (name, steps)
    assert f"without default_steps {DEFAULT_STEPS}" in help_text


@pytest.mark.slow
def test_getting_started_comparison_is_what_the_command_prints():
    """The comparison table in getting-started.md is rerun here and must match in
    every column but steps/s; docs/gen_comparison.py rewrites it and the picture."""
    result = forked.run([sys.executable, str(ROOT / "docs" / "gen_comparison.py"),
                         "--check"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (ROOT / "docs" / "img" / "compare_digits.png").read_bytes()[:4] == b"\x89PNG"


def test_the_comparison_check_allows_the_seeds_spread_and_nothing_else():
    """Another CPU type gives other last bits, which 600 steps carry into the means:
    the check takes a mean within twice the spread, but no other change."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from gen_comparison import agrees
    finally:
        sys.path.remove(str(ROOT / "docs"))
    shown = ("   quickstart   600   0.02948 ± 0.011   0.9573 ± 0.021   0   252\n"
             "*  openseq2seq  600   0.00899 ± 0.0023  0.9721 ± 0.0084  0   126")
    other_cpu = shown.replace("0.02948 ± 0.011", "0.01613 ± 0.013").replace("252", "815")
    assert agrees(shown, other_cpu)
    for changed in ("0.00899 ± 0.0023", "0.01613 ± 0.0023"), ("  0   252", "  1   252"), \
                   ("600   0.00899", "500   0.00899"), ("*  openseq2seq", "   openseq2seq"):
        assert not agrees(shown, shown.replace(*changed)), changed


@pytest.mark.slow
def test_coming_from_keras_page_is_generated_from_the_registry_and_from_keras():
    """Every Keras optimizer, schedule and optimizer argument, mapped by running the
    registry and gradpipe.from_keras; docs/gen_keras_page.py rewrites the page."""
    result = forked.run([sys.executable, str(ROOT / "docs" / "gen_keras_page.py"),
                         "--check"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    page = (ROOT / "docs" / "coming-from-keras.md").read_text()
    for argument in ("clipnorm", "global_clipnorm", "use_ema", "gradient_accumulation_steps",
                     "loss_scale_factor"):
        assert f"### `{argument}" in page, argument


def test_coming_from_tf_addons_page_is_generated_from_the_registry():
    """Every optimizer, wrapper and schedule TF Addons exported is on the page, whose
    gradpipe keys and defaults docs/gen_tfa_page.py reads from the registry."""
    result = forked.run([sys.executable, str(ROOT / "docs" / "gen_tfa_page.py"),
                         "--check"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    page = (ROOT / "docs" / "coming-from-tf-addons.md").read_text()
    # tfa.optimizers.__all__ of TF Addons 0.23, its last release, less its base classes
    for name in ("AdaBelief", "AdamW", "COCOB", "ConditionalGradient",
                 "CyclicalLearningRate", "ExponentialCyclicalLearningRate", "LAMB",
                 "LazyAdam", "Lookahead", "MovingAverage", "MultiOptimizer", "NovoGrad",
                 "ProximalAdagrad", "RectifiedAdam", "SGDW", "SWA",
                 "Triangular2CyclicalLearningRate", "TriangularCyclicalLearningRate",
                 "Yogi", "extend_with_decoupled_weight_decay"):
        assert f"`{name}" in page, name


def test_coming_from_optax_page_is_generated_from_the_registry():
    """Every optimizer of optax's alias module is on the page, whose gradpipe keys and
    defaults docs/gen_optax_page.py reads from the registry (optax's, for the rules that
    follow it, from tests/references/optax_golden.json)."""
    result = forked.run([sys.executable, str(ROOT / "docs" / "gen_optax_page.py"),
                         "--check"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    page = (ROOT / "docs" / "coming-from-optax.md").read_text()
    # optax/_src/alias.py of optax 0.2.8, the release the golden values were recorded with
    for name in ("adabelief", "adadelta", "adafactor", "adagrad", "adam", "adamax", "adamaxw",
                 "adamw", "adan", "amsgrad", "fromage", "lamb", "lars", "lbfgs", "lion",
                 "nadam", "nadamw", "noisy_sgd", "novograd", "optimistic_adam",
                 "optimistic_adam_v2", "optimistic_gradient_descent", "polyak_sgd", "radam",
                 "rmsprop", "rprop", "sgd", "sign_sgd", "signum", "sm3", "yogi"):
        assert f"| [`{name}`](#{name}) |" in page or f"| `{name}` |" in page, name


def test_plugin_guide_hook_table_agrees_with_the_hookspecs():
    """Each name the guide's hook table gives for what a factory returns is in that
    hook's specification: one truth, in gradpipe.hookspecs."""
    text = (ROOT / "docs" / "plugin-guide.md").read_text()
    rows = re.findall(r"^\| `(gradpipe_register_\w+)` \| (.*) \|$", text, re.M)
    assert {hook for hook, _ in rows} == {n for n in dir(hookspecs)
                                          if n.startswith("gradpipe_register_")}
    for hook, cell in rows:
        spec = " ".join((getattr(hookspecs, hook).__doc__ or "").split())
        for code in re.findall(r"`([^`]+)`", cell):
            for name in re.findall(r"[A-Za-z_][\w.]*", code):
                assert re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", spec), \
                    f"{hook}: the guide names {name!r} ({code!r}); its hookspec does not"


def test_performance_page_is_the_current_results():
    """docs/performance.md is one page of current results; the run-by-run history
    lives in benchmarks/HISTORY.md."""
    page = (ROOT / "docs" / "performance.md").read_text()
    assert len(page.splitlines()) <= 150
    assert not re.search(r"\b[Rr]uns? \d+\b", page)
    assert "## Current results" in page
    assert (ROOT / "benchmarks" / "HISTORY.md").exists()


@pytest.mark.slow
def test_every_module_the_docs_name_is_reachable_after_import_gradpipe():
    """`import gradpipe` then `gradpipe.convergence.Criterion` (or any module the docs
    name) works, and still imports no TensorFlow."""
    import gradpipe

    text = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    text += (ROOT / "README.md").read_text()
    named = {m for m in re.findall(r"`gradpipe\.([a-z_]+)[.`(\[]", text)
             # an entry-point group; the built-in plugins' package (named as a path)
             if not m.startswith("_") and m not in {"components", "plugins"}}
    modules = {m for m in named if m not in dir(gradpipe) or m in gradpipe.PUBLIC_MODULES}
    assert {"plugin", "testing", "hookspecs", "keras"} <= modules
    modules.add("convergence")
    # gradpipe.keras is the Keras optimizer: it imports TensorFlow, so it comes last
    code = ("import sys, gradpipe\n"
            f"for name in {sorted(modules - {'keras'}) + ['keras']!r}:\n"
            "    if name == 'keras':\n"
            "        assert 'tensorflow' not in sys.modules\n"
            "    assert getattr(gradpipe, name).__name__ == 'gradpipe.' + name, name\n"
            "gradpipe.convergence.Criterion\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
