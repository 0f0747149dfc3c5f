"""The command line as a user runs it (``run``, ``schedule`` and ``check --plan`` in
this process, where TensorFlow is imported already; the others in a new one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, gradpipe_command


def gradpipe_cli(*args: str, env: dict[str, str] | None = None):
    return gradpipe_command(*args, env=env, timeout=300)


def without_tensorflow(*args: str) -> subprocess.CompletedProcess:
    """``gradpipe ARGS`` in a new process that fails if the command imported TensorFlow."""
    code = ("import sys; from gradpipe.cli import main; rc = main(sys.argv[1:]); "
            "assert 'tensorflow' not in sys.modules; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=300)


def test_plugins_json_lists_builtins_with_provenance():
    result = gradpipe_cli("plugins", "--all", "--json")
    assert result.returncode == 0, result.stderr
    records = {r["entry_point"]: r for r in json.loads(result.stdout)}
    assert records["adam"]["distribution"] == "gradpipe"
    assert records["adam"]["components"]["transform"] == ["adam", "adamw"]
    assert records["adam"]["status"] == "loaded"
    assert records["adam"]["hooks"] == ["gradpipe_register_transforms"]


def test_plugins_hides_builtins_without_all():
    result = gradpipe_cli("plugins", "--json")
    assert all(not r["builtin"] for r in json.loads(result.stdout))


def test_check_ok_prints_resolved_pipeline(write_toml, tmp_path):
    result = gradpipe_cli("check", str(ROOT / "examples" / "quickstart.toml"))
    assert result.returncode == 0, result.stderr
    assert "beta_2 = 0.999" in result.stdout  # defaults filled in
    # one short transform is written as the user wrote it, not as an inline array, and
    # a schedule in place stays inline: the printed file checks as it is
    short = gradpipe_cli("check", str(write_toml("""
        [[transforms]]
        kind = "sgd"
        learning_rate = { kind = "linear", start = 0.1, end = 0.0, steps = 10 }
    """)), "--resolved")
    assert short.returncode == 0, short.stderr
    assert "transforms = [" not in short.stdout
    assert '\n[[transforms]]\nkind = "sgd"\nlearning_rate = { kind = "linear", start = 0.1, ' \
        in short.stdout
    (tmp_path / "resolved.toml").write_text(short.stdout)
    again = gradpipe_cli("check", str(tmp_path / "resolved.toml"), "--resolved")
    assert again.returncode == 0 and again.stdout == short.stdout


@pytest.mark.slow
def test_check_plan_shows_each_choice_with_its_reason():
    example = str(ROOT / "examples" / "mixed_precision.toml")
    planned = gradpipe_cli("check", example, "--plan", "--shapes", "4096x1024,1024,1024x10,10")
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.startswith("plan for 4 variables, 4,205,578 parameters:")
    assert 'XLA           yes: "auto": 4 variables of 1,051,394 elements' in planned.stdout
    assert "adam at transforms[1]: proved" in planned.stdout
    problem = gradpipe_cli("check", example, "--plan", "--json")  # the file's [problem]
    assert "packed state  no:" in json.loads(problem.stdout)["plan"]
    wrong = gradpipe_cli("check", example, "--plan", "--shapes", "7x")
    assert wrong.returncode == 1 and "--shapes '7x'" in wrong.stderr


@pytest.mark.slow
def test_a_command_that_only_answers_exits_without_tearing_tensorflow_down(write_toml):
    """`check --plan` ends its process once it has answered (TensorFlow's teardown
    takes 0.5-0.7 s): the whole plan reaches a pipe, errors keep their exit code, and
    exit handlers do not run. `check` without TensorFlow exits as usual."""
    good = write_toml("""
        [[transforms]]
        kind = "adam"
    """)
    bad = write_toml("""
        [pipeline]
        freeze = ["nope"]

        [[transforms]]
        kind = "sgd"
    """, name="frozen.toml")
    code = ("import atexit, sys; from gradpipe.cli import entry; "
            "atexit.register(print, 'exit handlers ran', flush=True); sys.argv[1:] = "
            "sys.argv[2:]; entry()")

    def console(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code, "--", *args],
                              capture_output=True, text=True, timeout=300)

    planned = console("check", str(good), "--json", "--shapes", "64x64*40,10")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)["plan"]  # all of it: the JSON parses
    assert plan.startswith("plan for 41 variables") and "finite" in plan
    assert "exit handlers ran" not in planned.stdout
    failed = console("check", str(bad), "--shapes", "8")
    assert failed.returncode == 1
    assert "pipeline.freeze[0]: pattern 'nope' matches no variable" in failed.stderr
    assert "exit handlers ran" not in failed.stdout
    checked = console("check", str(good))
    assert checked.returncode == 0 and "exit handlers ran" in checked.stdout


@pytest.mark.slow
def test_check_shapes_repeat_a_shape_and_imply_plan():
    """`--shapes 64x64*20,10` is 21 variables, and plans without --plan (it was
    ignored); `--problem` with `--shapes` is a usage error."""
    example = str(ROOT / "examples" / "quickstart.toml")
    planned = gradpipe_cli("check", example, "--shapes", "64x64*20,10")
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.startswith("plan for 21 variables, 81,930 parameters:\n")
    both = gradpipe_cli("check", example, "--shapes", "10", "--problem", "rosenbrock")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    wrong = gradpipe_cli("check", example, "--shapes", "64x64*0")
    assert wrong.returncode == 1 and "SHAPE*N for N variables of one shape" in wrong.stderr


def test_check_shapes_named_as_the_model_names_them_meet_the_patterns(write_toml):
    """`NAME=SHAPE` gives the planned variable that path, so a file whose rules select
    variables by pattern plans for them; unnamed, no rule selects `variable_0`, and the
    error says how to name them."""
    path = write_toml("""
        [[transforms]]
        kind = "adagrad"
        variables = ["embedding"]

        [[transforms]]
        kind = "adam"
        variables = ["dense"]
    """)
    named = gradpipe_cli("check", str(path), "--shapes",
                         "embedding/embeddings=500x8,dense/kernel=8x1,dense/bias=1")
    assert named.returncode == 0, named.stderr
    assert named.stdout.startswith("plan for 3 variables, 4,009 parameters:\n")
    unnamed = gradpipe_cli("check", str(path), "--shapes", "500x8,8x1,1")
    assert unnamed.returncode == 1 and "variable_0" in unnamed.stderr
    assert "name them as your model does with --shapes NAME=SHAPE" in unnamed.stderr
    twice = gradpipe_cli("check", str(path), "--shapes", "dense=8*2,dense_1=8")
    assert twice.returncode == 1 and "'dense_1' is named twice" in twice.stderr


def test_check_errors_exit_1_and_list_all(write_toml):
    path = write_toml("""
        [[transforms]]
        kind = "clip_by_global_norm"
        clip_norm = -1.0

        [[transforms]]
        kind = "adamm"
    """)
    result = gradpipe_cli("check", str(path))
    assert result.returncode == 1
    assert f"{path}:3: transforms[0].clip_norm: must be > 0, got -1.0" in result.stderr
    assert "did you mean 'adam'" in result.stderr
    as_json = json.loads(gradpipe_cli("check", str(path), "--json").stdout)
    assert as_json["ok"] is False and len(as_json["errors"]) == 2
    assert as_json["errors"][0]["line"] == 3


def test_check_and_run_refuse_a_chain_without_an_update_rule(write_toml):
    """`check` finds it without TensorFlow, and `run` never starts training."""
    path = write_toml("""
        [problem]
        kind = "quadratic"

        [[transforms]]
        kind = "clip_by_global_norm"
        clip_norm = 1.0
    """)
    for command in ("check", "run"):
        result = without_tensorflow(command, str(path))
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert f"{path}:4: transforms: no update rule in the chain" in result.stderr
        assert "such as 'adam' or 'sgd' as the last transform" in result.stderr


@pytest.mark.parametrize("command", ["run", "check", "schedule"])
def test_a_missing_file_is_a_usage_error_naming_the_nearest_one(command):
    """A typo in the file name exits 2 (usage), not 1 (an invalid pipeline), and
    suggests the file that is there."""
    typo = str(ROOT / "examples" / "quickstar.toml")
    result = gradpipe_cli(command, typo, *(["--steps", "3"] if command == "schedule" else []))
    assert result.returncode == 2, result.stderr
    assert (f"argument FILE: {typo}: no such file (did you mean "
            f"{str(ROOT / 'examples' / 'quickstart.toml')!r}?)") in result.stderr
    assert "problem(s) in the pipeline" not in result.stderr
    elsewhere = gradpipe_cli(command, str(ROOT / "nowhere" / "x.toml"),
                             *(["--steps", "3"] if command == "schedule" else []))
    assert elsewhere.returncode == 2
    assert "no such file: there is no folder" in elsewhere.stderr


@pytest.mark.parametrize("command", [["plugins", "--all"], ["check", "QUICKSTART"]])
def test_listing_and_checking_do_not_import_tensorflow(command):
    """`plugins` and `check` stay fast: TensorFlow is never imported."""
    args = [str(ROOT / "examples" / "quickstart.toml") if a == "QUICKSTART" else a
            for a in command]
    result = without_tensorflow(*args)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_run_quickstart_reaches_target():
    result = gradpipe_cli("run", str(ROOT / "examples" / "quickstart.toml"), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["target_reached"] is True
    assert summary["steps"] == 500 and summary["skipped_steps"] == 0
    assert summary["distance_to_optimum"] < 0.05


@pytest.mark.slow
def test_run_other_problem_and_text_summary():
    result = gradpipe_cli("run", str(ROOT / "examples" / "quickstart.toml"),
                          "--problem", "rosenbrock", "--steps", "50")
    assert result.returncode == 0, result.stderr
    assert "problem               rosenbrock" in result.stdout
    assert "steps                 50" in result.stdout


@pytest.mark.slow
def test_run_summary_says_what_did_not_happen_without_printing_none():
    """No criterion fired and the target was never reached: the text says so in
    words (JSON keeps null)."""
    result = gradpipe_cli("run", str(ROOT / "examples" / "quickstart.toml"), "--quiet",
                          "--problem", "rosenbrock", "--steps", "5")
    assert result.returncode == 0, result.stderr
    assert "None" not in result.stdout
    assert "converged             no" in result.stdout
    assert "converged by" not in result.stdout
    assert "first step at target  never reached" in result.stdout


def test_run_without_problem_is_clear(write_toml):
    path = write_toml('[[transforms]]\nkind = "sgd"\n')
    result = gradpipe_cli("run", str(path))
    assert result.returncode == 1
    assert "no problem to run" in result.stderr


def test_check_plan_without_variables_to_plan_for_is_a_usage_error(write_toml):
    """`check --plan` on a file without [problem] and without --shapes: a usage error
    (exit 2) naming both ways to give variables, before TensorFlow is imported."""
    path = write_toml('[[transforms]]\nkind = "sgd"\n')
    result = without_tensorflow("check", str(path), "--plan")
    assert result.returncode == 2, result.stderr
    assert ("--plan needs variables to plan for: the file has no [problem]; pass --shapes "
            "(784x256,256,256x10,10) or --problem (quadratic)") in result.stderr


@pytest.mark.slow
def test_schedule_csv_json_and_plot(tmp_path):
    example = str(ROOT / "examples" / "openseq2seq.toml")
    csv = gradpipe_cli("schedule", example, "--steps", "3", "--csv")
    assert csv.returncode == 0, csv.stderr
    assert csv.stdout.splitlines()[0] == "step,lr"
    # warm-up .5 * 1/100, decayed on top as OpenSeq2Seq does: .004 * (1 - 1/1500)^2 + .001
    assert csv.stdout.splitlines()[2].startswith("1,0.0049946")
    data = json.loads(gradpipe_cli("schedule", example, "--steps", "60", "--json").stdout)
    assert data["steps"][-1] == 59 and len(data["schedules"]["lr"]) == 60
    png = tmp_path / "s.png"
    plot = gradpipe_cli("schedule", example, "--steps", "100", "--plot", str(png))
    assert plot.returncode == 0, plot.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = gradpipe_cli("schedule", example, "--steps", "5", "--name", "lrr")
    assert missing.returncode == 1 and "did you mean 'lr'" in missing.stderr


@pytest.mark.slow
def test_the_cli_imports_tensorflow_without_kerass_optional_integrations():
    """``import tensorflow`` imports Keras, which imports scikit-learn and pyplot when
    they are installed (3 of the import's 8 s here): the command line skips those two
    imports, and the ``digits`` problem (scikit-learn's data) still works."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gradpipe.cli", "run",
         str(ROOT / "examples" / "quickstart.toml"), "--problem", "digits", "--steps", "20",
         "--json"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "GRADPIPE_TF_LOGS": "1"})  # stderr is not muted meanwhile
    assert result.returncode == 0, result.stderr[-2000:]
    assert 0.0 <= json.loads(result.stdout)["test_accuracy"] <= 1.0
    # -X importtime prints a module once its import ends (or fails), nested ones first;
    # sklearn.base and matplotlib.figure load only where their package's import succeeds
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")]
    before = imported[:imported.index("tensorflow")]
    assert "keras.src" in before
    assert "sklearn.base" not in before and "matplotlib.figure" not in before
    assert "sklearn.base" in imported  # by the digits problem
