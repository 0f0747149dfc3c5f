"""What a build remembers across processes: how each transform's maths is guarded.

Finding out whether a transform's outputs are bounded from its state's norm, its
range, or checked traces its maths (0.3 to 1 s for an adaptive rule); the answer
is kept in the cache folder (``GRADPIPE_CACHE_DIR``), keyed by the maths and
its source, and read back by the next process. The tests show the answer read
back through the plan it decides, and asked again once the source changes.
"""

from __future__ import annotations

import inspect
import json
import textwrap

import pytest

import gradpipe
from conftest import register_transform

PLUGIN = """
    import attrs
    from gradpipe.plugin import Transform, hookimpl, zeros_like_vars

    def ema_demo(config, config_name="ema"):
        def update(grads, state, variables):
            # a set literal: its order in the code changes with each process's hashing
            decay = 0.9 if config_name in {"ema", "momentum", "average", "trace"} else 0.5
            new = [decay * m + g for g, m in zip(grads, state)]
            return new, new

        return Transform(zeros_like_vars, update)

    @hookimpl
    def gradpipe_register_transforms(register):
        register("ema_demo", ema_demo, attrs.frozen(kw_only=True)(type("C", (), {})))
"""

PLAN_LINE = """
    import tensorflow as tf
    import gradpipe

    pipe = gradpipe.build({"pipeline": {"jit_compile": True},  # else small steps are checked
                           "transforms": [{"kind": "ema_demo"},
                                          {"kind": "sgd", "learning_rate": 0.1}]})
    pipe.build([tf.Variable(tf.zeros([3]))])
    print(next(line for line in str(pipe.plan).splitlines() if "ema_demo at" in line
               and "bounded" in line))
"""


def _answers(folder):
    (path,) = folder.glob("*.json")
    return path, json.loads(path.read_text())


@pytest.mark.slow
def test_the_next_process_reads_the_answer_back_until_the_source_changes(fake_dists, tmp_path):
    fake_dists.add("gradpipe-ema-demo", "0.1", {"ema_demo": "ema_demo_plugin"},
                   {"ema_demo_plugin": PLUGIN})
    cache = tmp_path / "cache"
    env = {"GRADPIPE_CACHE_DIR": str(cache)}

    def plan_line() -> str:
        result = fake_dists.run(PLAN_LINE, env=env, tensorflow=True)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    assert "from its input's norm and its state's norm" in plan_line()
    path, answers = _answers(cache)
    assert list(answers.values()) == ["norm"]
    # an answer the analysis would not give, to see that the next process uses it
    path.write_text(json.dumps(dict.fromkeys(answers, "range")))
    assert "from its input's norm and its state's range" in plan_line()
    # an answer edited out of shape: no leaf's range is read, nothing fails
    path.write_text(json.dumps(dict.fromkeys(answers, "range:x,=")))
    assert "from its input's norm and its state's norm" in plan_line()
    module = fake_dists.root / "ema_demo_plugin.py"
    module.write_text(module.read_text() + "# edited\n")
    assert "from its input's norm and its state's norm" in plan_line()
    assert sorted(_answers(cache)[1].values()) == ["norm", "range:x,="]


def _range_plan(learning_rate: float) -> str:
    import tensorflow as tf

    # a learning rate no other test uses: this process has no answer for it yet
    pipe = gradpipe.build({"pipeline": {"jit_compile": True},
                           "transforms": [{"kind": "adadelta",
                                           "learning_rate": learning_rate}]})
    pipe.build([tf.Variable(tf.zeros([3]))])
    return str(pipe.plan)


def test_an_unreadable_cache_is_replaced(tmp_path, monkeypatch):
    (tmp_path / "analyses-v1.json").write_text("{not json")
    monkeypatch.setenv("GRADPIPE_CACHE_DIR", str(tmp_path))
    assert "its state's range" in _range_plan(0.0123)
    assert list(_answers(tmp_path)[1].values()) == ["range"]


def test_an_empty_cache_folder_keeps_nothing_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADPIPE_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert "its state's range" in _range_plan(0.0124)
    assert not list(tmp_path.rglob("*"))


def _halved(config):
    """A transform that lowers to XLA, though one of its ops is not among those whose
    lowering a build reads off the trace (``EnsureShape``): a build lowers it."""
    import tensorflow as tf

    from gradpipe.plugin import Transform, no_state

    def update(grads, state, variables):
        return [None if g is None else tf.ensure_shape(g, g.shape) * 0.5 for g in grads], state

    return Transform(no_state, update)


HALVED = f"""
    import attrs
    from gradpipe.plugin import hookimpl

{textwrap.indent(textwrap.dedent(inspect.getsource(_halved)), "    ")}
    @hookimpl
    def gradpipe_register_transforms(register):
        register("halved", _halved, attrs.frozen(kw_only=True)(type("C", (), {{}})))
"""

LOWERED = """
    import sys
    import tensorflow as tf
    import gradpipe

    for size in map(int, sys.argv[1:]):
        pipe = gradpipe.build({"transforms": [{"kind": "halved"},  # "auto": XLA tried
                                              {"kind": "adagrad"}]})
        pipe.build([tf.Variable(tf.zeros([size]))])
        print(pipe.plan.compile)
"""


@pytest.mark.slow
def test_whether_xla_lowers_a_trace_is_read_back_for_that_very_trace(fake_dists, tmp_path):
    """A build lowers each function it would compile to XLA, where its ops alone do
    not tell; the answer is kept for that trace, and only for it: a variable of
    another shape is another trace."""
    fake_dists.add("gradpipe-halved", "0.1", {"halved": "halved_plugin"},
                   {"halved_plugin": HALVED})
    cache = tmp_path / "cache"
    env = {"GRADPIPE_CACHE_DIR": str(cache)}

    def plans(*sizes: int) -> list[str]:
        result = fake_dists.run(f"import sys; sys.argv[1:] = {list(map(str, sizes))}\n"
                                + textwrap.dedent(LOWERED), env=env, tensorflow=True)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.splitlines()

    assert all(line.startswith("yes: ") for line in plans(300_000, 400_000))
    path, answers = _answers(cache)
    lowered = [key for key, answer in answers.items() if answer == ""]
    assert len(lowered) == 2  # both traces lower (the rest: how its outputs are bounded)
    # an answer the lowering would not give, to see that the next process uses it
    path.write_text(json.dumps({**answers, **dict.fromkeys(
        lowered, "transform halved failed to compile: planted")}))
    first, again, other = plans(300_000, 400_000, 500_000)
    assert first == again == 'no: "auto": transform halved failed to compile: planted'
    assert other.startswith("yes: ")


@pytest.mark.parametrize("kind, shapes", [
    ("adagrad", [(262_147,)]),
    ("adafactor", [(512, 513), (262_147,), (8, 64, 520)]),  # factored; checked: conditionals
])
def test_a_maths_whose_ops_xla_lowers_whatever_their_values_is_not_lowered_at_build(
        kind, shapes, tmp_path, monkeypatch):
    """Elementwise maths, reductions over fixed axes, conditionals and variable reads
    lower to XLA whatever their values: a build reads that off each trace (nothing to
    lower, so nothing to remember), and the compiled step runs."""
    import tensorflow as tf

    monkeypatch.setenv("GRADPIPE_CACHE_DIR", str(tmp_path))
    pipe = gradpipe.build({"transforms": [{"kind": kind}]})  # "auto": XLA tried
    variables = [tf.Variable(tf.ones(shape)) for shape in shapes]
    pipe.build(variables)
    assert pipe.plan.compile.on, pipe.plan
    assert not list(tmp_path.glob("*.json"))
    pairs = [(tf.ones(shape), v) for shape, v in zip(shapes, variables)]
    assert pipe.path(pairs) == "compiled"
    assert bool(pipe.apply_gradients(pairs))
    assert all(v.numpy().max() < 1.0 for v in variables)


def _fit_two_dense_layers() -> str:
    import keras
    import numpy as np

    # 264k elements per shape: "auto" compiles them on a CPU
    model = keras.Sequential([keras.Input((1025,)), keras.layers.Dense(513),
                              keras.layers.Dense(1031)])
    register_transform("halved", _halved)
    pipe = gradpipe.build({"transforms": [{"kind": "halved"},  # "auto": XLA tried
                                          {"kind": "lion"}]})
    model.compile(optimizer=pipe.keras_optimizer(), loss="mse")
    model.fit(np.ones((4, 1025), "f4"), np.ones((4, 1031), "f4"), verbose=0)
    return str(pipe.plan.per_variable)


def test_in_fit_one_lowering_serves_every_shape_and_outlives_the_variables(
        tmp_path, monkeypatch):
    """In ``model.fit`` the optimizer's state arrives as Keras variables, whose specs
    print their address. One lowering serves the four functions, whose traces differ
    only in their shapes; the answer is kept under what other variables (the next
    process's) print alike, so a second model of those shapes adds none."""
    monkeypatch.setenv("GRADPIPE_CACHE_DIR", str(tmp_path))
    kept = []
    for _ in range(2):
        assert _fit_two_dense_layers().startswith("yes: 4 XLA functions for 4 variables")
        kept.append(_answers(tmp_path)[1])
    assert list(kept[0].values()).count("") == 1, kept[0]
    assert kept[1] == kept[0]
