"""Schedules: OpenSeq2Seq closed forms, Keras parity, and schedules inside steps."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from gradpipe import ConfigError


def values(table, steps):
    schedule = gradpipe.create("schedule", table)
    return schedule(tf.constant(steps, tf.int64)).numpy()


def at(table, step):
    return float(gradpipe.create("schedule", table)(tf.constant(step, tf.int64)))


class TestOpenSeq2SeqParityCases:
    """seed-semantics.md §2d parity cases, rel 1e-6 unless noted."""

    def test_exp_decay(self):
        t = {"kind": "exp_decay", "learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5,
             "use_staircase_decay": True, "begin_decay_at": 5, "min_lr": 0.01}
        assert values(t, [4, 14, 15, 100]) == pytest.approx([0.1, 0.1, 0.05, 0.01], rel=1e-6)

    @pytest.mark.parametrize("fix, expected", [(False, 0.45125), (True, 0.5)])
    def test_poly_decay_warmup_quirk(self, fix, expected):
        """HEAD overlaps warm-up and decay (.45125); the fix decays after it (.5)."""
        t = {"kind": "poly_decay", "learning_rate": 1.0, "decay_steps": 100, "power": 2.0,
             "warmup_steps": 10, "decay_after_warmup": fix}
        assert at(t, 5) == pytest.approx(expected, rel=1e-6)

    def test_inv_poly_decay(self):
        t = {"kind": "inv_poly_decay", "learning_rate": 1.0, "decay_steps": 100,
             "min_lr": 0.01}
        assert values(t, [0, 100]) == pytest.approx([1.0, 0.01], rel=1e-5)
        assert at(t, 200) < 0.01  # keeps falling: no clamp, as in the reference

    def test_inv_poly_ignores_warmup_unless_fixed(self):
        base = {"kind": "inv_poly_decay", "learning_rate": 1.0, "decay_steps": 100,
                "min_lr": 0.01, "warmup_steps": 10}
        assert at(base, 5) == pytest.approx(1 / (1 + 0.99 * 5), rel=1e-6)
        assert at({**base, "apply_warmup": True}, 5) == pytest.approx(0.5, rel=1e-6)
        assert at({**base, "apply_warmup": True}, 110) == pytest.approx(0.01, rel=1e-5)

    def test_transformer_policy(self):
        t = {"kind": "transformer_policy", "learning_rate": 2.0, "d_model": 512,
             "warmup_steps": 4000}
        assert values(t, [0, 3999, 10000]) == pytest.approx([3.4939e-7, 1.39754e-3,
                                                             8.8384e-4], rel=1e-4)
        assert at({**t, "max_lr": 1e-3}, 3999) == pytest.approx(1e-3, rel=1e-6)

    @pytest.mark.parametrize("fix, expected", [(False, 0.05), (True, 0.1)])
    def test_cosine_decay_min_lr_quirk(self, fix, expected):
        """The reference treats min_lr as a fraction (.5 * .1); the fix as a floor."""
        t = {"kind": "cosine_decay", "learning_rate": 0.5, "decay_steps": 100, "min_lr": 0.1,
             "absolute_min_lr": fix}
        assert values(t, [100, 150]) == pytest.approx([expected] * 2, rel=1e-6)

    def test_piecewise_constant_with_epochs(self):
        t = {"kind": "piecewise_constant", "learning_rate": 1.0, "boundaries": [2, 4],
             "decay_rates": [0.1, 0.01], "steps_per_epoch": 10}
        got = values(t, [0, 20, 21, 40, 41, 1000])
        assert got == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01], rel=1e-6)

    def test_boundary_steps_of_poly_decay(self):
        """Before warm-up end, at begin_decay_at, at the end and past it."""
        t = {"kind": "poly_decay", "learning_rate": 1.0, "decay_steps": 100,
             "begin_decay_at": 20, "warmup_steps": 10, "min_lr": 0.1}
        got = values(t, [0, 5, 10, 20, 70, 120, 500])
        expected = [0, 0.5, 1, 1, 0.9 * 0.5 + 0.1, 0.1, 0.1]
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)


STEPS = np.arange(0, 300, 7)


@pytest.mark.parametrize("ours, theirs", [
    ({"kind": "exp_decay", "learning_rate": 0.3, "decay_steps": 50, "decay_rate": 0.7},
     keras.optimizers.schedules.ExponentialDecay(0.3, 50, 0.7)),
    ({"kind": "exp_decay", "learning_rate": 0.3, "decay_steps": 50, "decay_rate": 0.7,
      "use_staircase_decay": True},
     keras.optimizers.schedules.ExponentialDecay(0.3, 50, 0.7, staircase=True)),
    ({"kind": "poly_decay", "learning_rate": 0.3, "decay_steps": 200, "power": 1.5,
      "min_lr": 0.01},
     keras.optimizers.schedules.PolynomialDecay(0.3, 200, 0.01, power=1.5)),
    ({"kind": "piecewise_constant", "learning_rate": 1.0, "boundaries": [50, 120],
      "decay_rates": [0.5, 0.1]},
     keras.optimizers.schedules.PiecewiseConstantDecay([50, 120], [1.0, 0.5, 0.1])),
    ({"kind": "cosine_decay", "learning_rate": 0.2, "decay_steps": 250, "min_lr": 0.1},
     keras.optimizers.schedules.CosineDecay(0.2, 250, alpha=0.1)),
], ids=["exp", "exp_staircase", "poly", "piecewise", "cosine"])
def test_keras_schedule_parity(ours, theirs):
    """Equal to the Keras schedule over 0..300 (rtol 1e-5, atol 1e-7)."""
    expected = np.array([float(theirs(int(s))) for s in STEPS])
    np.testing.assert_allclose(values(ours, STEPS), expected, rtol=1e-5, atol=1e-7)


class TestComposition:
    def test_warmup_into_exp_decay(self):
        t = {"kind": "warmup", "warmup_steps": 10,
             "after": {"kind": "exp_decay", "learning_rate": 1.0, "decay_steps": 10,
                       "decay_rate": 0.5}}
        assert values(t, [0, 5, 10, 20]) == pytest.approx([0, 0.5, 1.0, 0.5], rel=1e-6)

    def test_sequence_with_references(self):
        spec = {"schedules": {"a": {"kind": "constant", "value": 3.0},
                              "b": {"kind": "linear", "start": 1.0, "end": 0.0, "steps": 10},
                              "s": {"kind": "sequence", "schedules": ["@a", "@b"],
                                    "boundaries": [5]}},
                "transforms": [{"kind": "sgd", "learning_rate": "@s"}]}
        pipe = gradpipe.build(spec)
        got = pipe.schedules["s"](tf.constant([0, 4, 5, 10, 15, 30]))
        assert got.numpy() == pytest.approx([3, 3, 1, 0.5, 0, 0], rel=1e-6)

    def test_cosine_warmup_and_floor(self):
        t = {"kind": "cosine", "learning_rate": 1.0, "warmup_steps": 10, "decay_steps": 100,
             "min_lr": 0.1}
        got = values(t, [0, 5, 10, 60, 110, 1000])
        assert got == pytest.approx([0, 0.5, 1.0, 0.55, 0.1, 0.1], rel=1e-6, abs=1e-7)

    def test_cycle_and_self_reference(self):
        with pytest.raises(ConfigError, match=r"cycle: @a -> @b -> @a"):
            gradpipe.parse({"schedules": {
                "a": {"kind": "warmup", "warmup_steps": 1, "after": "@b"},
                "b": {"kind": "warmup", "warmup_steps": 1, "after": "@a"}},
                "transforms": [{"kind": "sgd"}]})
        with pytest.raises(ConfigError, match=r"cycle: @a -> @a"):
            gradpipe.parse({"schedules": {
                "a": {"kind": "warmup", "warmup_steps": 1, "after": "@a"}},
                "transforms": [{"kind": "sgd"}]})


@pytest.mark.parametrize("table, key, message", [
    ({"kind": "exp_decay", "learning_rate": 1.0, "decay_steps": 0, "decay_rate": 0.5},
     "decay_steps", "must be > 0"),
    ({"kind": "inv_poly_decay", "learning_rate": 1.0, "decay_steps": 10, "min_lr": 0.1,
      "power": 0.0}, "power", "Inv poly decay requires power > 0"),
    ({"kind": "piecewise_constant", "learning_rate": 1.0, "boundaries": [5, 3],
      "decay_rates": [0.1, 0.1]}, "boundaries", "strictly increasing"),
    ({"kind": "piecewise_constant", "learning_rate": 1.0, "boundaries": [5],
      "decay_rates": [0.1, 0.1]}, "decay_rates", "one rate per boundary"),
    ({"kind": "sequence", "schedules": [1.0, 2.0], "boundaries": []}, "boundaries",
     "one boundary fewer"),
    ({"kind": "sequence", "schedules": [], "boundaries": []}, "schedules",
     "needs at least one schedule"),
    ({"kind": "warmup", "warmup_steps": 1, "after": []}, "after",  # found by the fuzzer
     "not an array"),
])
def test_invalid_schedules_name_the_key(table, key, message):
    with pytest.raises(ConfigError, match=message) as info:
        gradpipe.parse({"schedules": {"s": table}, "transforms": [{"kind": "sgd"}]})
    assert info.value.path == f"schedules.s.{key}"


def test_scheduled_clip_norm_and_lr_under_xla_one_trace():
    """A scheduled clip_norm and learning rate change at the right steps, one trace."""
    var = tf.Variable([0.0, 0.0])
    pipe = gradpipe.build({"transforms": [
        {"kind": "clip_by_global_norm",
         "clip_norm": {"kind": "piecewise_constant", "learning_rate": 1.0,
                       "boundaries": [1], "decay_rates": [0.5]}},
        {"kind": "sgd", "learning_rate": {"kind": "linear", "start": 1.0, "end": 2.0,
                                          "steps": 2}}]})
    pipe.build([var])
    step = tf.function(lambda g: pipe.apply_gradients([(g, var)]), jit_compile=True)
    moves = []
    for _ in range(4):
        before = var.numpy().copy()
        step(tf.constant([3.0, 4.0]))
        moves.append(float(np.linalg.norm(before - var.numpy())))
    # norms: clip 1,1,.5,.5 (iterations 0,1 -> 1; 2,3 -> .5); lr 1, 1.5, 2, 2
    assert moves == pytest.approx([1.0, 1.5, 1.0, 1.0], rel=1e-6)
    assert step.experimental_get_tracing_count() == 1


def test_skipped_steps_do_not_advance_schedules():
    var = tf.Variable([0.0])
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": {
        "kind": "piecewise_constant", "learning_rate": 1.0, "boundaries": [0],
        "decay_rates": [0.1]}}]})
    pipe.apply_gradients([(tf.constant([math.nan]), var)])
    pipe.apply_gradients([(tf.constant([1.0]), var)])
    assert var.numpy() == pytest.approx([-1.0])  # still at step 0 -> lr 1


@pytest.mark.slow
def test_docs_show_every_builtin_schedule(tmp_path):
    """The schedules page embeds a generated plot for every built-in schedule."""
    import sys

    from conftest import ROOT
    from gradpipe.registry import get_registry

    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import gen_schedule_plots
    finally:
        sys.path.pop(0)
    page = (ROOT / "docs" / "schedules.md").read_text()
    names = [n for n in get_registry().names("schedule")
             if get_registry().load_all().components[("schedule", n)].provider.dist
             == "gradpipe"]
    assert sorted(gen_schedule_plots.EXAMPLES) == names
    for name in names:
        assert f"### `{name}`" in page and f"img/schedule_{name}.png" in page
        assert (ROOT / "docs" / "img" / f"schedule_{name}.png").exists()
    gen_schedule_plots.main(tmp_path)
    assert len(list(tmp_path.glob("*.png"))) == len(names)
