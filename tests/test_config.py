"""Validation of pipeline files: every problem, with file, key path and line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tomllib

import gradpipe
from gradpipe import ConfigError


def problems(exc: ConfigError) -> dict[str, tuple[int | None, str]]:
    return {p.path: (p.line, p.message) for p in exc.problems}


class TestErrors:
    def test_all_errors_reported_with_lines_and_suggestions(self, write_toml):
        """Every mistake in a file is reported at once, each with its line."""
        path = write_toml("""
            [gradpipe]
            version = 1

            [pipline]
            x = 1

            [[transforms]]
            kind = "clip_by_global_norm"
            clip_norm = -1.0

            [[transforms]]
            kind = "adma"

            [[transforms]]
            kind = "adam"
            learning_rat = 0.1
            beta_1 = "high"

            [[convergance]]
            kind = "max_steps"
        """)
        with pytest.raises(ConfigError) as info:
            gradpipe.parse(path)
        found = problems(info.value)
        assert found["pipline"][0] == 4
        assert "did you mean 'pipeline'" in found["pipline"][1]
        assert found["transforms[0].clip_norm"] == (9, "must be > 0, got -1.0")
        assert found["transforms[1].kind"][0] == 12
        assert "did you mean 'adam'" in found["transforms[1].kind"][1]
        assert found["transforms[2].learning_rat"][0] == 16
        assert "did you mean 'learning_rate'" in found["transforms[2].learning_rat"][1]
        assert found["transforms[2].beta_1"][0] == 17
        assert found["convergance"][0] == 19  # an array of tables: its first [[...]]
        assert "did you mean 'convergence'" in found["convergance"][1]
        text = str(info.value)
        assert f"{path}:9: transforms[0].clip_norm: must be > 0, got -1.0" in text

    def test_invalid_variable_patterns_are_found_with_the_file(self, write_toml):
        """Regular expressions are compiled when the file is read, not at the first step."""
        path = write_toml("""
            [pipeline]
            freeze = ["emb[edding"]

            [[transforms]]
            kind = "adamw"
            exclude_from_weight_decay = ["(bias"]
            variables = ["*kernel"]
        """)
        with pytest.raises(ConfigError) as info:
            gradpipe.parse(path)
        found = problems(info.value)
        assert found["pipeline.freeze"] == (
            2, "item 0: invalid regular expression 'emb[edding': unterminated character "
               "set at position 3")
        assert found["transforms[0].exclude_from_weight_decay"][0] == 6
        assert "invalid regular expression '(bias'" in \
            found["transforms[0].exclude_from_weight_decay"][1]
        assert found["transforms[0].variables"][0] == 7
        assert "invalid regular expression '*kernel'" in found["transforms[0].variables"][1]

    def test_syntax_error_has_line(self, write_toml):
        """A TOML syntax error is a ConfigError with the line of the mistake."""
        path = write_toml('[[transforms]]\nkind = "sgd"\nlearning_rate = = 1\n')
        with pytest.raises(ConfigError) as info:
            gradpipe.parse(path)
        assert info.value.line == 3
        assert "invalid TOML" in str(info.value)

    @pytest.mark.parametrize("value, message", [
        (True, "must be a number, got a boolean"),
        ("fast", "must be a number, '@name' or a schedule table"),
        ([1.0], "must be a number"),
        (float("nan"), "must be finite"),
        (float("inf"), "must be finite"),
    ])
    def test_wrong_types(self, value, message):
        """Wrong types and non-finite numbers name the key."""
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"transforms": [{"kind": "sgd", "learning_rate": value}]})
        assert info.value.path == "transforms[0].learning_rate"
        assert message in str(info.value)

    def test_missing_required_and_kind(self):
        """A missing required key and a missing kind are both reported."""
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"transforms": [{"kind": "clip_by_norm"}, {"lr": 1}]})
        found = problems(info.value)
        assert found["transforms[0].clip_norm"][1] == "is required"
        assert "needs 'kind'" in found["transforms[1]"][1]

    def test_no_transforms(self):
        with pytest.raises(ConfigError, match="at least one"):
            gradpipe.parse({})

    def test_a_chain_without_an_update_rule_is_an_error(self, write_toml):
        """Clipping alone would move every variable by its clipped gradient at a rate
        of 1: an error at the chain, naming the fix, before anything is built."""
        path = write_toml("""
            [schedules.lr]
            kind = "fixed_lr"
            learning_rate = 0.1

            [[transforms]]
            kind = "clip_by_global_norm"
            clip_norm = 1.0
        """)
        with pytest.raises(ConfigError) as info:
            gradpipe.parse(path)
        [problem] = info.value.problems
        assert (problem.file, problem.line, problem.path) == (str(path), 5, "transforms")
        assert "no update rule in the chain: 'clip_by_global_norm' at transforms[0]" \
            in problem.message
        assert "Add an update rule such as 'adam' or 'sgd' as the last transform" \
            in problem.message

    def test_a_chain_missing_a_table_is_not_blamed_for_its_rule(self):
        """An update rule that fails validation is reported, not called missing."""
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"transforms": [{"kind": "clip_by_norm", "clip_norm": 1.0},
                                           {"kind": "adma"}]})
        assert [p.path for p in info.value.problems] == ["transforms[1].kind"]

    @pytest.mark.parametrize("table, key, hint", [
        ({"kind": "adam", "exclde": ["bias"]}, "exclde", "did you mean 'exclude'?"),
        ({"kind": "adam", "variable": ["dense"]}, "variable", "did you mean 'variables'? "
         "regular expressions matched against variable paths"),
        ({"kind": "sgd", "layers": ["dense_1"]}, "layers", "did you mean 'variables'?"),
        ({"kind": "lion", "weight_decay": 1e-3}, "weight_decay", "weight_decay is a "
         'transform of its own here: a [[transforms]] table with kind = "weight_decay" '
         'after this one; its learning_rate scales the decay: this rule\'s ("@lr" for a '
         "schedule) decays by learning_rate * weight_decay * w, as optax, Keras and TF "
         "Addons' RectifiedAdam do; its default 1.0 by weight_decay * w, as TF Addons' "
         "AdamW and SGDW do"),
        ({"kind": "weight_decay", "weight_decay": 0.1, "exclude_from_weight_decay": ["bias"]},
         "exclude_from_weight_decay", "did you mean 'exclude'?"),
        ({"kind": "radam", "total_steps": 1000}, "total_steps", "TF Addons' total_steps is "
         "part of a learning_rate schedule here: see docs/coming-from-tf-addons.md"),
        ({"kind": "adam", "global_clipnorm": 1.0}, "global_clipnorm", 'kind = '
         '"clip_by_global_norm" before this one'),
        # optax's mask marks what is decayed: the opposite of exclude_from_weight_decay
        ({"kind": "nadamw", "mask": ["kernel"]}, "mask", "optax's mask lists the parameters "
         "to decay; exclude_from_weight_decay lists, as regular expressions, those NOT to "
         "decay: the opposite"),
        ({"kind": "lion", "mask": ["kernel"]}, "mask", "optax's mask belongs on the "
         "weight_decay table after the rule"),
        ({"kind": "weight_decay", "weight_decay": 0.1, "mask": ["kernel"]}, "mask",
         "optax's mask is variables = [\"regex\", ...] here"),
        ({"kind": "clip_by_global_norm", "max_norm": 1.0}, "max_norm",
         "did you mean 'clip_norm'? optax's max_norm"),
    ])
    def test_unknown_keys_point_to_what_selects_variables_or_is_a_transform(
            self, table, key, hint):
        """A transform's valid keys include ``variables`` and ``exclude``, and the keys
        other libraries use for them, or for what is a transform here, say so."""
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"transforms": [table]})
        message = problems(info.value)[f"transforms[0].{key}"][1]
        assert hint in message
        assert message.endswith("kind, variables, exclude")  # the valid keys listed

    def test_openseq2seq_names_and_every_unknown_summary_are_pointed_out(self):
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({
                "pipeline": {"iter_size": 2,
                             "summaries": ["larc_summaries", "learning_rates", "loss_scale"]},
                "transforms": [{"kind": "larc", "larc_eta": 0.002, "learning_rate": 0.1},
                               {"kind": "sgd"}]})
        found = problems(info.value)
        assert found["pipeline.iter_size"][1].startswith(
            "unknown key (did you mean 'accumulation_steps'? OpenSeq2Seq's iter_size); "
            "valid keys: accumulation_steps, ")
        assert not found["pipeline.iter_size"][1].endswith("kind")  # no kind in [pipeline]
        assert "did you mean 'eta'?" in found["transforms[0].larc_eta"][1]
        assert found["pipeline.summaries"][1].endswith(
            "unknown: 'larc_summaries' (OpenSeq2Seq's, per variable: no scalar here; "
            "global_gradient_norm is all gradients together, update_ratios each variable's "
            "step over its weights), 'learning_rates' (did you mean 'learning_rate'?)")

    @pytest.mark.parametrize("kind, hint", [
        ("RectifiedAdam", "RectifiedAdam is 'radam' here"),
        ("LazyAdam", "LazyAdam is 'adam' with lazy = true here"),
        ("SGDW", "SGDW is 'sgd', then a 'weight_decay' transform here"),
        ("MultiOptimizer", "one update rule per variable group, each with variables = "),
        ("ProximalAdagrad", "did you mean 'proximal_adagrad'?"),
        ("ExponentialDecay", "'ExponentialDecay' is a schedule, not a transform"),
    ])
    def test_other_libraries_class_names_point_to_the_gradpipe_kind(self, kind, hint):
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"transforms": [{"kind": kind}]})
        assert hint in problems(info.value)["transforms[0].kind"][1]

    @pytest.mark.parametrize("schedule, key, hint", [
        ({"kind": "warmup_cosine_decay_schedule"}, "kind", 'optax\'s '
         'warmup_cosine_decay_schedule is kind = "cosine", whose decay_steps excludes the '
         "warm-up"),
        ({"kind": "exponential_decay"}, "kind", 'optax\'s exponential_decay is kind = '
         '"exp_decay"'),
        ({"kind": "cosine", "learning_rate": 0.1, "decay_steps": 9, "end_value": 0.0},
         "end_value", "did you mean 'min_lr'? optax's end_value"),
        ({"kind": "cosine", "peak_value": 0.1, "decay_steps": 9}, "peak_value",
         "did you mean 'learning_rate'? optax's peak_value"),
    ])
    def test_optax_schedule_names_point_to_gradpipe_s(self, schedule, key, hint):
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"transforms": [{"kind": "sgd", "learning_rate": schedule}]})
        assert hint in problems(info.value)[f"transforms[0].learning_rate.{key}"][1]

    @pytest.mark.parametrize("table, key, hint", [
        ({"kind": "MultiSteps"}, "kind", "optax's MultiSteps: [pipeline] accumulation_steps"),
        ({"kind": "chain"}, "kind", "the [[transforms]] tables, in order, are the chain"),
        ({"kind": "inject_hyperparams"}, "kind", "pipe.learning_rate = x sets the rate"),
        ({"kind": "clip"}, "kind", 'optax\'s clip: kind = "clip_by_value"'),
        ({"kind": "scale_by_adam"}, "kind", "did you mean 'adam'? a rule here scales by its "
                                            "own learning_rate"),
        ({"kind": "scale_by_belief"}, "kind", "did you mean 'adabelief'?"),
        ({"kind": "adam", "nesterov": True}, "nesterov", 'is kind = "nadamw" here'),
        ({"kind": "adamw", "weight_decay_mask": ["kernel"]}, "weight_decay_mask",
         "exclude_from_weight_decay lists, as regular expressions, those NOT to decay"),
        ({"kind": "adamw", "mu_dtype": "float32"}, "mu_dtype", "optax's mu_dtype: not "
                                                              "expressible"),
        ({"kind": "adam", "eps_root": 0.0}, "eps_root", "this rule has none"),
        ({"kind": "adafactor", "decay_rate": 0.8}, "decay_rate", "beta_2_decay = -decay_rate"),
        ({"kind": "rmsprop", "decay": 0.9}, "decay", "did you mean 'rho'? optax's decay"),
        ({"kind": "moving_average", "debias": True}, "debias", "moving_average does not"),
        ({"kind": "noisy_sgd", "key": 1}, "key", "did you mean 'seed'? optax's key"),
        ({"kind": "lamb", "weight_decay": 0.1}, "weight_decay",
         "optax's and TF Addons' LAMB decay inside the trust ratio"),
    ])
    def test_optax_names_point_to_what_does_their_work(self, table, key, hint):
        rules = [{"kind": "sgd"}] if table["kind"] == "moving_average" else []
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"transforms": [*rules, table]})
        assert hint in problems(info.value)[f"transforms[{len(rules)}].{key}"][1]

    def test_openseq2seq_and_tf1_names_point_to_what_does_their_work(self):
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({
                "lr_policy": "poly_decay", "max_grad_norm": 1.0, "dtype": "mixed",
                "loss_scale": "Backoff",
                "schedules": {"lr": {"kind": "fixed_lr", "learning_rate": 0.1}},
                "transforms": [{"kind": "MomentumOptimizer"},
                               {"kind": "l2", "scale": 1e-4},
                               {"kind": "sgd", "learning_rate": "lr"},
                               {"kind": "clip_by_global_norm", "max_grad_norm": 1.0}]})
        found = {path: message for path, (_, message) in problems(info.value).items()}
        assert "a [schedules.NAME] table (kind = \"poly_decay\"" in found["lr_policy"]
        assert 'kind = "clip_by_global_norm" and clip_norm' in found["max_grad_norm"]
        assert "Keras's mixed_float16 policy in your code" in found["dtype"]
        assert found["loss_scale"].endswith('write loss_scale = { kind = "Backoff" }')
        assert "'sgd' with momentum" in found["transforms[0].kind"]
        assert "did you mean 'l2'? tf.contrib's" in found["transforms[1].scale"]
        assert "(did you mean '@lr'?)" in found["transforms[2].learning_rate"]
        assert "did you mean 'clip_norm'?" in found["transforms[3].max_grad_norm"]
        with pytest.raises(ConfigError, match="'backoff' \\(OpenSeq2Seq's Backoff\\)"):
            gradpipe.parse({"loss_scale": {"kind": "automatic"},
                            "transforms": [{"kind": "sgd"}]})

    def test_optax_pipeline_options_point_to_gradpipe_s(self):
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"pipeline": {"every_k_schedule": 4, "max_consecutive_errors": 5},
                            "transforms": [{"kind": "sgd"}]})
        found = problems(info.value)
        assert "did you mean 'accumulation_steps'?" in found["pipeline.every_k_schedule"][1]
        assert "skips every non-finite step" in found["pipeline.max_consecutive_errors"][1]

    def test_enum_suggestion(self):
        with pytest.raises(ConfigError, match="did you mean 'mean'"):
            gradpipe.parse({"placement": {"kind": "default", "reduction": "maen"},
                            "transforms": [{"kind": "sgd"}]})

    def test_version_must_match(self):
        with pytest.raises(ConfigError, match="schema version 1, got 2"):
            gradpipe.parse({"gradpipe": {"version": 2}, "transforms": [{"kind": "sgd"}]})


class TestSchedules:
    def test_reference_and_inline(self):
        """A hyperparameter takes a number, "@name" or an inline schedule table."""
        spec = gradpipe.parse({
            "schedules": {"lr": {"kind": "fixed_lr", "learning_rate": 0.5}},
            "transforms": [
                {"kind": "clip_by_norm", "clip_norm": {"kind": "constant", "value": 2.0}},
                {"kind": "sgd", "learning_rate": "@lr"},
            ],
        })
        assert str(spec.transforms[1].config.learning_rate) == "@lr"
        assert spec.transforms[0].config.clip_norm.name == "constant"

    @pytest.mark.parametrize("schedules, ref, message", [
        ({}, "@nope", "not defined"),
        ({"lr": {"kind": "fixed_lr", "learning_rate": 1.0}}, "@lrr", "did you mean 'lr'"),
    ])
    def test_bad_reference(self, schedules, ref, message):
        with pytest.raises(ConfigError, match=message) as info:
            gradpipe.parse({"schedules": schedules,
                            "transforms": [{"kind": "sgd", "learning_rate": ref}]})
        assert info.value.path == "transforms[0].learning_rate"

    def test_unknown_schedule_kind_inline(self):
        with pytest.raises(ConfigError, match="unknown schedule 'fixed'"):
            gradpipe.parse({"transforms": [
                {"kind": "sgd", "learning_rate": {"kind": "fixed", "learning_rate": 1}}]})


class TestPythonTables:
    def test_numpy_scalars_and_tuples_read_as_toml_values(self):
        """A table built in Python may hold NumPy scalars and tuples: they are the TOML
        numbers and arrays they stand for (a float32 as its shortest decimal)."""
        import numpy as np

        spec = gradpipe.parse({"transforms": [
            {"kind": "sgd", "learning_rate": np.float32(0.01), "variables": ("dense",)},
            {"kind": "lookahead", "sync_period": np.int64(5), "slow_step_size": np.float64(0.5)}]})
        sgd, lookahead = spec.transforms
        assert sgd.config.learning_rate == 0.01 and sgd.extra["variables"] == ("dense",)
        assert lookahead.config.sync_period == 5 and type(lookahead.config.sync_period) is int
        assert "learning_rate = 0.01\n" in spec.to_toml()
        schedule = gradpipe.create("schedule", {"kind": "fixed_lr",
                                                "learning_rate": np.float32(0.25)})
        assert float(schedule(0)) == 0.25

    def test_a_keras_schedule_object_gets_the_table_to_write(self):
        """The hint is the schedule as a table of the same kind: written as given, it
        is a gradpipe schedule with Keras's values."""
        import keras
        import tomllib

        decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9, staircase=True)
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"transforms": [{"kind": "adam", "learning_rate": decay}]})
        message = problems(info.value)["transforms[0].learning_rate"][1]
        assert message.startswith("is a schedule object (ExponentialDecay); a pipeline "
                                  "table holds TOML values")
        table = tomllib.loads("t = {" + message.split("{", 1)[1].split("}", 1)[0] + "}")["t"]
        schedule = gradpipe.create("schedule", table)
        for step in (0, 9, 10, 35):
            assert float(schedule(step)) == pytest.approx(float(decay(step)), rel=1e-6)


class TestRequire:
    def test_requirement_met(self):
        gradpipe.parse({"gradpipe": {"require": ["gradpipe>=0.1"]},
                        "transforms": [{"kind": "sgd"}]})

    def test_requirement_not_met_and_missing(self):
        """An unmet pin says installed and wanted; a missing plugin says so."""
        with pytest.raises(ConfigError) as info:
            gradpipe.parse({"gradpipe": {"require": ["gradpipe>=99", "gradpipe-nope>=1"]},
                            "transforms": [{"kind": "sgd"}]})
        found = problems(info.value)
        assert "0.1.0 is installed, but the pipeline wants gradpipe>=99" in \
            found["gradpipe.require[0]"][1]
        assert "not installed" in found["gradpipe.require[1]"][1]


class TestNoCodeFromFiles:
    @pytest.mark.parametrize("name", ["os:system", "os.path.join", "subprocess",
                                      "gradpipe.plugins.sgd:sgd", "json"])
    def test_names_are_never_imported(self, name):
        """A file can only name registered components; nothing is imported."""
        before = set(sys.modules)
        with pytest.raises(ConfigError, match="unknown transform"):
            gradpipe.parse({"transforms": [{"kind": name}]})
        assert set(sys.modules) - before == set()


class TestRoundTrip:
    def test_to_toml_loads_back_identically(self):
        """The resolved TOML has defaults filled in and parses to an equal spec."""
        spec = gradpipe.parse({
            "schedules": {"lr": {"kind": "fixed_lr", "learning_rate": 0.5}},
            "loss_scale": {"kind": "dynamic", "initial_loss_scale": 128.0},
            "pipeline": {"accumulation_steps": 2},
            "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                           {"kind": "adam", "learning_rate": "@lr"}],
        })
        text = spec.to_toml()
        data = tomllib.loads(text)
        assert data["transforms"][1]["beta_2"] == 0.999
        assert data["loss_scale"]["increment_period"] == 2000
        assert data["lock"] == {"gradpipe": gradpipe.__version__}
        assert gradpipe.parse(data) == spec


def test_parse_does_not_import_tensorflow(write_toml):
    """Validating a file never imports TensorFlow."""
    path = write_toml('[[transforms]]\nkind = "adam"\n')
    code = (f"import sys, gradpipe; gradpipe.parse({str(path)!r}); "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_lock_that_does_not_match_installed_versions():
    """A [lock] from another environment names each distribution that differs."""
    with pytest.raises(ConfigError) as info:
        gradpipe.parse({"lock": {"gradpipe": "0.0.1", "gradpipe-nothing": "1.0"},
                        "transforms": [{"kind": "sgd"}]})
    found = problems(info.value)
    assert "locked gradpipe 0.0.1, but 0.1.0 is installed" in found["lock.gradpipe"][1]
    assert "is not installed" in found["lock.gradpipe-nothing"][1]
