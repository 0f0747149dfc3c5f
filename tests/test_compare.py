"""`gradpipe run` with several pipelines, sweeps and seeds: one table, one folder."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys

import pytest

import forked
from conftest import ROOT, gradpipe_command

EXAMPLES = ROOT / "examples"


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return gradpipe_command("run", *args, cwd=cwd)


@pytest.mark.slow
def test_three_pipelines_two_seeds_one_table_a_folder_and_a_rerun(tmp_path):
    """Same problem, same seeds for every pipeline; the folder reruns to the same
    numbers; TensorBoard gets one run per pipeline and seed."""
    files = [EXAMPLES / "quickstart.toml", EXAMPLES / "openseq2seq.toml",
             EXAMPLES / "mixed_precision.toml"]
    out, logs = tmp_path / "out", tmp_path / "logs"
    first = run(*files, "--problem", "quadratic", "--steps", "40", "--seeds", "2",
                "--output", out, "--logdir", logs)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].split() == ["pipeline", "steps", "converged", "by", "loss,", "last",
                                "10%", "±", "std", "distance_to_optimum", "±", "std",
                                "skipped", "steps/s"]
    assert [line.lstrip("* ").split()[0]
            for line in lines[2:5]] == ["quickstart", "openseq2seq", "mixed_precision"]
    assert sum(line.startswith("*") for line in lines[2:5]) == 1
    assert lines[-1] == "problem quadratic; mean over 2 seeds; * lowest loss"
    for tag in ("[1/6] quickstart seed 0", "[6/6] mixed_precision seed 1", "step/s"):
        assert tag in first.stderr  # the progress lines say what runs, and how fast
    assert {p.name for p in out.iterdir()} == {"run.json", "pipelines", "summary.json",
                                               "summary.csv", "history.csv", "loss.png"}
    resolved = (out / "pipelines" / "openseq2seq.toml").read_text()
    assert 'kind = "quadratic"' in resolved and "[lock]" in resolved
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["runs"]
    assert [(r["pipeline"], r["seed"]) for r in runs] == [
        (name, seed) for name in ("quickstart", "openseq2seq", "mixed_precision")
        for seed in (0, 1)]
    # Seeds draw different problems; every pipeline of one seed gets the same one.
    assert runs[0]["distance_to_optimum"] != runs[1]["distance_to_optimum"]
    with (out / "history.csv").open() as handle:
        history = list(csv.DictReader(handle))
    assert len(history) == 6 * 40
    assert set(history[0]) == {"pipeline", "seed", "step", "loss", "learning_rate",
                               "loss_scale"}
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.relative_to(logs).as_posix() for p in logs.glob("*/*")) == [
        f"{name}/seed_{seed}" for name in ("mixed_precision", "openseq2seq", "quickstart")
        for seed in (0, 1)]
    assert all(any(p.iterdir()) for p in logs.glob("*/*"))

    refused = run(out, "--output", out)
    assert refused.returncode == 1 and "holds an earlier run" in refused.stderr
    again = run(out, "--output", tmp_path / "again", "--json", "--quiet")
    assert again.returncode == 0, again.stderr
    rerun = json.loads(again.stdout)["runs"]
    keys = ("final_loss", "distance_to_optimum", "skipped_steps", "steps")
    assert [[r[k] for k in keys] for r in rerun] == [[r[k] for k in keys] for r in runs]
    assert (tmp_path / "again" / "history.csv").read_text() == (
        out / "history.csv").read_text()
    replaced = run(out, "--output", out, "--overwrite", "--quiet")
    assert replaced.returncode == 0, replaced.stderr


@pytest.mark.slow
def test_a_grid_of_sweeps_is_one_row_per_combination(tmp_path):
    result = run(EXAMPLES / "quickstart.toml", "--steps", "30", "--quiet", "--json",
                 "--set", "schedules.lr.learning_rate=0.01,0.1",
                 "--set", "transforms[0].clip_norm=1.0,5.0", "--plot", tmp_path / "p.png")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert [r["pipeline"] for r in rows] == [
        f"quickstart learning_rate={lr} clip_norm={c}"
        for lr in (0.01, 0.1) for c in (1, 5)]
    assert sum(r["best"] for r in rows) == 1
    best = min(rows, key=lambda r: r["loss_mean"])
    assert best["best"] and all(r["seeds"] == 1 for r in rows)
    assert all(r["overhead_seconds"] >= 0 for r in rows)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_set_on_one_file_changes_what_trains():
    plain = run(EXAMPLES / "quickstart.toml", "--steps", "20", "--json", "--quiet")
    changed = run(EXAMPLES / "quickstart.toml", "--steps", "20", "--json", "--quiet",
                  "--set", "schedules.lr.learning_rate=0.0")
    assert plain.returncode == changed.returncode == 0, plain.stderr + changed.stderr
    assert json.loads(changed.stdout)["distance_to_optimum"] != json.loads(
        plain.stdout)["distance_to_optimum"]
    assert json.loads(changed.stdout)["learning_rate"] == 0.0


@pytest.mark.parametrize("args, expected", [
    ([EXAMPLES / "quickstart.toml", EXAMPLES / "tfp_minimize.toml"],
     "the files name different problems: "),
    ([EXAMPLES / "quickstart.toml", "--set", "transforms[7].clip_norm=1"],
     "--set transforms[7].clip_norm=1: transforms[7].clip_norm: "),
    ([EXAMPLES / "quickstart.toml", "--set", "schedule.lr.learning_rate=1"],
     "has no schedule (did you mean 'schedules'?)"),
    ([EXAMPLES / "quickstart.toml", "--set", "transforms[0].clip_nrom=1"],
     "--set transforms[0].clip_nrom=1 (" + str(EXAMPLES / "quickstart.toml") + "): "
     "transforms[0].clip_nrom: unknown key (did you mean 'clip_norm'?)"),
    ([EXAMPLES / "quickstart.toml", "--set", "transforms[0].clip_norm=2.0,big"],
     "--set transforms[0].clip_norm=big (" + str(EXAMPLES / "quickstart.toml") + "): "
     "transforms[0].clip_norm: must be a number"),
    ([EXAMPLES / "quickstart.toml", "--set", "learning_rate"],
     "argument --set: expected KEY=VALUE"),  # a usage error: exit code 2
])
def test_bad_input_is_refused_before_any_step(tmp_path, args, expected):
    result = run(*args, "--output", tmp_path / "out")
    assert result.returncode == (2 if "argument --set" in expected else 1)
    assert expected in result.stderr, result.stderr
    assert "step/s" not in result.stderr  # nothing trained
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.parametrize("sets, expected", [
    (["transforms[0].clip_norm=1", "transforms[0].clip_norm=2"],
     "--set transforms[0].clip_norm is given twice (transforms[0].clip_norm=1 and "
     "transforms[0].clip_norm=2): give it once, or sweep the values with "
     "--set transforms[0].clip_norm=1,2"),
    (["transforms[0].clip_norm=1", 'transforms[0]={kind="clip_by_norm", clip_norm=2.0}'],
     "--set transforms[0] and --set transforms[0].clip_norm both set "
     "transforms[0].clip_norm: give one of them"),
])
def test_the_same_key_set_twice_is_a_usage_error(sets, expected):
    """The last value used to win silently; now neither does, and the key is named."""
    result = run(EXAMPLES / "quickstart.toml", *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr


@pytest.mark.slow
def test_digits_reports_test_accuracy():
    result = run(EXAMPLES / "quickstart.toml", "--problem", "digits", "--steps", "150",
                 "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["problem"] == "digits"
    assert 0.8 <= summary["test_accuracy"] <= 1.0  # 150 steps of Adam on real digits


@pytest.mark.slow
def test_digits_without_scikit_learn_is_a_clear_error(tmp_path):
    """The data set is an optional extra: without it, a one-line install hint."""
    blocker = tmp_path / "sklearn"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    result = subprocess.run(
            [sys.executable, "-m", "gradpipe.cli", "run", str(EXAMPLES / "quickstart.toml"),
             "--problem", "digits", "--steps", "5"], capture_output=True, text=True,
            timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 1
    assert ("problem 'digits' needs scikit-learn, which is not installed: "
            "pip install 'gradpipe[digits]'") in result.stderr
    assert "Traceback" not in result.stderr


def test_an_output_folder_without_matplotlib_names_the_option_that_needs_it(tmp_path):
    """--output DIR writes a plot: without matplotlib the error says so, not "--plot"
    (which was not given), before any step, and leaves no folder."""
    blocker = tmp_path / "matplotlib"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    result = subprocess.run(
        [sys.executable, "-m", "gradpipe.cli", "run", str(EXAMPLES / "quickstart.toml"),
         "--seeds", "2", "--steps", "5", "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 1, result.stderr
    assert ("the plots (--plot, and the one --output DIR writes) need matplotlib: "
            "pip install 'gradpipe[plot]'") in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_outputs_are_checked_before_the_first_step_and_never_replace_other_files(tmp_path):
    quickstart = EXAMPLES / "quickstart.toml"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("important")
    (tmp_path / "a_file").write_text("x")
    cases = [
        (["--output", mine, "--overwrite"], "holds files that are not a gradpipe run"),
        (["--plot", tmp_path / "nowhere" / "p.png"], "--plot " + str(tmp_path / "nowhere")),
        (["--plot", tmp_path / "p.txt"], "not an image file name"),
        (["--logdir", tmp_path / "a_file"], "exists and is not a folder"),
    ]
    for extra, expected in cases:
        result = run(quickstart, "--steps", "5", *extra)
        assert result.returncode == 1, (extra, result.stderr)
        assert expected in result.stderr, (extra, result.stderr)
        assert "step/s" not in result.stderr and "Traceback" not in result.stderr
    assert (mine / "thesis.tex").read_text() == "important"
    out = tmp_path / "out"
    assert run(quickstart, "--steps", "5", "--output", out, "--quiet").returncode == 0
    (out / "notes.txt").write_text("mine")
    result = run(quickstart, "--steps", "5", "--output", out, "--overwrite")
    assert result.returncode == 1 and "besides an earlier run" in result.stderr
    assert (out / "notes.txt").exists()
    mixed = run(out, quickstart)
    assert mixed.returncode == 1 and "rerun a folder of an earlier --output alone" in \
        mixed.stderr


@pytest.mark.slow
def test_a_rerun_says_whether_it_matches_the_saved_numbers_and_check_fails_if_not(
        tmp_path):
    """`gradpipe run DIR` compares the rerun with what the folder saved, run by run
    and value by value; --check exits 1 on a difference."""
    out = tmp_path / "out"
    first = run(EXAMPLES / "quickstart.toml", "--steps", "20", "--seeds", "2",
                "--output", out, "--quiet")
    assert first.returncode == 0, first.stderr
    same = run(out, "--check", "--quiet")
    assert same.returncode == 0, same.stderr
    assert f"rerun of {out}: all 2 runs match the saved numbers" in same.stdout

    summary = json.loads((out / "summary.json").read_text())
    saved_loss = summary["runs"][1]["final_loss"]
    summary["runs"][1]["final_loss"] = saved_loss * 2
    (out / "summary.json").write_text(json.dumps(summary))
    lines = (out / "history.csv").read_text().splitlines()
    row = lines[3].split(",")  # quickstart, seed 0, step 3
    row[3] = str(float(row[3]) + 0.5)
    lines[3] = ",".join(row)
    (out / "history.csv").write_text("\n".join(lines) + "\n")

    checked = run(out, "--check", "--quiet", "--json")
    assert checked.returncode == 1, checked.stderr
    report = json.loads(checked.stdout)["rerun"]
    assert not report["match"]
    assert [(r["pipeline"], r["seed"], [d["value"] for d in r["differences"]])
            for r in report["runs"]] == [("quickstart", 0, ["loss"]),
                                         ("quickstart", 1, ["final_loss"])]
    told = run(out, "--quiet")
    assert told.returncode == 0, told.stderr  # without --check it says so, and goes on
    assert f"rerun of {out}: 2 of 2 runs differ from the saved numbers:" in told.stdout
    assert f"final_loss: {saved_loss:.7g} now, {saved_loss * 2:.7g} saved (" in told.stdout
    assert "loss at 1 step from step 3: " in told.stdout and "(-0.5, relative" in told.stdout

    other = run(out, "--check", "--steps", "10")
    assert other.returncode == 1 and "--steps 10 (the saved run has 20) makes it another" \
        " run" in other.stderr
    assert "step/s" not in other.stderr  # refused before it trained
    files = run(EXAMPLES / "quickstart.toml", "--check")
    assert files.returncode == 1 and "give the folder of an earlier --output" in files.stderr


@pytest.mark.slow
def test_a_comparison_off_a_terminal_prints_a_line_per_run_with_the_time_left():
    """A log gets one line per run of an 18-run sweep, with its result and the whole
    comparison's progress and time left; not a line every 10% of every run (180)."""
    result = run(EXAMPLES / "quickstart.toml", "--steps", "20", "--seeds", "3",
                 "--set", "schedules.lr.learning_rate=0.01,0.05,0.1",
                 "--set", "transforms[0].clip_norm=1.0,5.0")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 18, result.stderr
    for k, line in enumerate(lines, 1):
        assert line.startswith(f"[{k}/18] quickstart learning_rate="), line
        assert ": 20 steps, final loss " in line and "distance_to_optimum" in line
        assert re.search(rf"\| all 18 runs: +{round(100 * k / 18)}% {20 * k}/360 "
                         r"\[\d\d:\d\d<\d\d:\d\d, ", line), line


@pytest.mark.slow
def test_a_comparison_on_a_terminal_shows_the_progress_of_all_runs(tmp_path):
    """On a terminal a bar for all runs (steps done of all, time left) stays under
    the running run's bar, and each finished run's result is printed above."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
    process = forked.Popen(
        [sys.executable, "-m", "gradpipe.cli", "run", str(EXAMPLES / "quickstart.toml"),
         "--steps", "300", "--seeds", "2"], stdout=subprocess.DEVNULL, stderr=child)
    os.close(child)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert process.wait(timeout=600) == 0
    os.close(main)
    text = seen.decode()
    assert re.search(r"all 2 runs: +\d+%\|.*\| \d+/600 \[\d\d:\d\d<\d\d:\d\d", text), text
    assert "[2/2] quickstart seed 1: " in text  # the running run's own bar
    assert re.search(r"\[1/2\] quickstart seed 0: 300 steps, final loss [^|\r\n]+\r\n",
                     text), text
    assert "all 2 runs: 100%" in text
