"""`gradpipe describe`: a component's keys, read from its config class, in a real process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from test_cli import gradpipe_cli

from conftest import ROOT

#: A third-party plugin whose config uses gradpipe's validators, an attrs one, one of
#: its own with a ``describe`` and one without.
RANGED = """
    from typing import Any, ClassVar

    import attrs
    import gradpipe
    from gradpipe.plugin import at_least, in_range, one_of, positive

    def even(inst, attribute, value):
        if value % 2:
            raise ValueError("must be even")

    def multiple_of_8(inst, attribute, value):
        if value % 8:
            raise ValueError("must be a multiple of 8")

    multiple_of_8.describe = "a multiple of 8"

    @attrs.frozen(kw_only=True)
    class Config:
        \"\"\"Config of ``jitter``: noise on the gradients.

        More detail that is not the first paragraph.

        Attributes:
            scale: how much noise, relative to the gradient.
            period: steps between draws.
            mode: how the noise is added.
            width: block width.
            seed: the seed.
            parity: an even number.
        \"\"\"

        example: ClassVar[dict] = {"scale": 0.5}

        scale: Any = gradpipe.hyperparameter(validator=in_range(0.0, 1.0, low_open=True))
        period: int = attrs.field(default=1, validator=at_least(1))
        mode: str = attrs.field(default="add", validator=one_of("add", "multiply"))
        width: int = attrs.field(default=8, validator=multiple_of_8)
        seed: int = attrs.field(default=0, validator=attrs.validators.ge(0))
        parity: int = attrs.field(default=2, validator=even)
        decay: float = attrs.field(default=1.0, validator=positive())

    def jitter(cfg):
        \"\"\"Gaussian noise scaled by the gradient.\"\"\"
        return gradpipe.Transform(gradpipe.no_state, lambda g, s, v: (g, s))

    @gradpipe.hookimpl
    def gradpipe_register_transforms(register):
        register("jitter", jitter, Config)
"""


def add_ranged(fake_dists) -> None:
    fake_dists.add("gradpipe-jitter", "3.1.4", {"jitter": "gp_jitter"},
                   {"gp_jitter": RANGED})


def describe_with(fake_dists, *args: str):
    """Run `gradpipe describe ARGS` as a process with the fake distributions installed."""
    return fake_dists.run(f"""
        import sys
        from gradpipe.cli import main
        sys.exit(main(["describe", *{list(args)!r}]))
    """)


def row(stdout: str, key: str) -> str:
    """The table row of ``key`` (required keys start with "* "), with the lines its
    meaning wraps onto, joined."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line[2:].split(" ", 1)[0] == key)
    end = start + 1
    while end < len(lines) and lines[end].startswith("    "):
        end += 1
    return " ".join(line.strip() if i else line for i, line in enumerate(lines[start:end]))


def test_adam_shows_each_key_with_type_default_range_and_meaning():
    result = gradpipe_cli("describe", "adam")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("transform 'adam': gradpipe ")
    lr = " ".join(row(out, "learning_rate").split())  # columns: key type default valid
    assert lr.startswith("learning_rate float or schedule 0.001 >= 0 step size")
    beta_1 = row(out, "beta_1")
    assert "float or schedule" in beta_1 and "0.9" in beta_1 and "[0, 1)" in beta_1
    assert "capabilities: update_rule" in out
    assert "[[transforms]]" in out and 'kind = "adam"' in out
    assert 'float or schedule: a number, "@name"' in out
    assert 'every transform also takes variables = ["regex", ...]' in " ".join(out.split())


def test_a_required_key_is_marked():
    result = gradpipe_cli("describe", "larc")
    assert result.returncode == 0, result.stderr
    eta = row(result.stdout, "eta")
    assert eta.startswith("* eta") and "required" in eta
    assert row(result.stdout, "epsilon").startswith("  epsilon")
    assert "one of 'clip', 'scale'" in row(result.stdout, "mode")  # a Literal type


@pytest.mark.slow
def test_kind_may_be_given_as_a_word_or_an_option():
    by_word = gradpipe_cli("describe", "transform", "adam")
    by_option = gradpipe_cli("describe", "--kind", "transform", "adam")
    assert by_word.returncode == by_option.returncode == 0, by_word.stderr
    assert by_word.stdout == by_option.stdout == gradpipe_cli("describe", "adam").stdout
    wrong = gradpipe_cli("describe", "schedule", "adam")
    assert wrong.returncode == 1 and "unknown schedule 'adam'" in wrong.stderr
    typo = gradpipe_cli("describe", "--kind", "transfrom", "adam")
    assert typo.returncode == 1 and "did you mean 'transform'" in typo.stderr
    qualified = gradpipe_cli("describe", "gradpipe>sgd")
    assert qualified.returncode == 0 and qualified.stdout.startswith("transform 'sgd'")


def test_unknown_name_suggests_a_near_one_without_a_traceback():
    result = gradpipe_cli("describe", "adamm")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "unknown component 'adamm'" in result.stderr
    assert "did you mean 'adam', a transform?" in result.stderr
    assert "Traceback" not in result.stderr
    optax = gradpipe_cli("describe", "warmup_cosine_decay_schedule")  # a hint, no close name
    assert optax.returncode == 1 and "Traceback" not in optax.stderr
    assert "optax's warmup_cosine_decay_schedule is kind = \"cosine\"" in optax.stderr
    section = gradpipe_cli("describe", "pipeline")  # a table of the file, not a component
    assert section.returncode == 1
    assert "[pipeline] is a table of the pipeline file, not a component: `gradpipe check " \
           "FILE` prints it with every default filled in" in section.stderr


def test_json_is_machine_readable():
    result = gradpipe_cli("describe", "adam", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert (info["kind"], info["name"]) == ("transform", "adam")
    assert info["provider"]["distribution"] == "gradpipe" and info["provider"]["builtin"]
    assert "update_rule" in info["capabilities"]
    args = {a["name"]: a for a in info["arguments"]}
    assert args["learning_rate"] == {
        "name": "learning_rate", "type": "float or schedule", "required": False,
        "default": 0.001, "valid": ">= 0", "meaning": "step size (a number or a schedule).",
        "accepts_schedule": True}
    assert args["beta_1"]["valid"] == "[0, 1)"
    assert args["epsilon"]["accepts_schedule"] is False
    assert info["example"] == {"kind": "adam", "learning_rate": 0.05}
    assert info["example_toml"].startswith("[[transforms]]\nkind = \"adam\"\n")
    required = json.loads(gradpipe_cli("describe", "warmup", "--json").stdout)
    after = next(a for a in required["arguments"] if a["name"] == "after")
    assert after["required"] is True and after["type"] == "schedule"


def test_third_party_component_is_described_with_its_provider_and_ranges(fake_dists):
    add_ranged(fake_dists)
    result = describe_with(fake_dists, "jitter")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("transform 'jitter': gradpipe-jitter 3.1.4 (a plugin, "
                          "entry point 'jitter')")
    assert "Gaussian noise scaled by the gradient." in out
    assert "Config of `jitter`: noise on the gradients." in out
    assert "More detail" not in out  # the first paragraph only
    scale = row(out, "scale")
    assert scale.startswith("* scale") and "float or schedule" in scale and "(0, 1]" in scale
    assert "how much noise" in scale
    assert ">= 1" in row(out, "period")
    assert "one of 'add', 'multiply'" in row(out, "mode")
    assert "a multiple of 8" in row(out, "width")  # its own validator's describe
    assert ">= 0" in row(out, "seed")  # attrs.validators.ge
    assert "custom check (even)" in row(out, "parity")
    assert "> 0" in row(out, "decay")
    assert "kind = \"jitter\"\n  scale = 0.5" in out

    info = json.loads(describe_with(fake_dists, "transform", "jitter", "--json").stdout)
    assert info["provider"] == {"distribution": "gradpipe-jitter", "version": "3.1.4",
                                "entry_point": "jitter", "builtin": False}
    assert {a["name"]: a["valid"] for a in info["arguments"]} == {
        "scale": "(0, 1]", "period": ">= 1", "mode": "one of 'add', 'multiply'",
        "width": "a multiple of 8", "seed": ">= 0", "parity": "custom check (even)",
        "decay": "> 0"}


def test_a_name_of_two_kinds_asks_which(fake_dists):
    """A plugin's schedule named like a built-in transform: the bare name is ambiguous,
    the kind picks one."""
    fake_dists.add("gradpipe-sched", "1.0", {"sched": "gp_sched"}, {"gp_sched": """
        import attrs
        import gradpipe

        @attrs.frozen(kw_only=True)
        class Config:
            value: float = 1.0

        @gradpipe.hookimpl
        def gradpipe_register_schedules(register):
            register("sgd", lambda cfg: (lambda step: cfg.value), Config)
    """})
    both = describe_with(fake_dists, "sgd")
    assert both.returncode == 1, both.stdout
    assert "names a component of several kinds (transform, schedule)" in both.stderr
    assert "gradpipe describe schedule sgd" in both.stderr
    schedule = describe_with(fake_dists, "schedule", "sgd")
    assert schedule.returncode == 0, schedule.stderr
    assert schedule.stdout.startswith("schedule 'sgd': gradpipe-sched 1.0")
    assert "[schedules.lr]" in schedule.stdout


def test_describe_does_not_import_tensorflow(tmp_path):
    code = textwrap.dedent("""
        import sys
        from gradpipe.cli import main
        assert main(["describe", "adam"]) == 0
        assert main(["describe", "schedule", "CosineDecay", "--json"]) == 0
        assert main(["describe", "problem", "digits"]) == 0
        assert "tensorflow" not in sys.modules, "describe imported TensorFlow"
        assert "keras" not in sys.modules, "describe imported Keras"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("ok")
