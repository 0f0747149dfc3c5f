"""``gradpipe run``: its options, and one run or a comparison of several.

One file with one seed prints that run's full summary, as before. Several
files, a ``--set`` sweep, ``--seeds N`` or ``--output`` make a comparison: one
table, one picture, one folder (see :mod:`gradpipe.experiment`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ._lean_import import without_keras_extras
from .cli_args import SetOnce, pipeline_file_or_folder
from .errors import GradpipeError

#: The built-in problems' own step counts (a test holds this to the problems).
DEFAULT_STEPS_HELP = ("quadratic 500, digits 600, noisy_quadratic 1000, rosenbrock 3000, "
                      "logistic_regression 1000, mlp_classifier 2000; a plugin's problem "
                      "without default_steps 500")


def add_run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run pipelines on a built-in problem and compare them")
    p.add_argument("files", nargs="+", metavar="FILE", type=pipeline_file_or_folder,
                   help="pipeline files, or the folder of an earlier --output to rerun it")
    p.add_argument("--problem", help="problem name (default: the one the files name)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"number of steps (default: the problem's own: {DEFAULT_STEPS_HELP})")
    p.add_argument("--set", action=SetOnce, default=[], metavar="KEY=VALUE",
                   type=_override,
                   help="override a value by its key path, e.g. "
                        "transforms[1].learning_rate=3e-3; KEY=V1,V2 sweeps the values, and "
                        "several sweeps form a grid (repeatable, each key once)")
    p.add_argument("--seed", type=int, default=None,
                   help="the first seed: TensorFlow's, and added to the problem's own seed "
                        "(default 0)")
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="run every pipeline with N seeds and report mean and spread "
                        "(default 1)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--plot", metavar="PNG",
                   help="one run: loss, learning rate and loss scale; several: their loss "
                        "curves overlaid")
    p.add_argument("--output", metavar="DIR",
                   help="write the resolved pipelines, the table (JSON, CSV), every step's "
                        "values (CSV) and the plot here; gradpipe run DIR reruns it")
    p.add_argument("--check", action="store_true",
                   help="with gradpipe run DIR: exit 1 when the rerun's numbers differ "
                        "from the ones the folder saved")
    p.add_argument("--overwrite", action="store_true",
                   help="with --output: replace a folder that holds an earlier run "
                        "and nothing else")
    p.add_argument("--logdir", metavar="DIR",
                   help="write TensorBoard summaries, one run per pipeline (and seed)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="one run: save checkpoints here and resume from the latest one")
    p.add_argument("--checkpoint-every", type=int, default=100, metavar="N",
                   help="steps between checkpoints (default 100)")
    p.add_argument("--placement", metavar="KIND",
                   help="override [placement] with this placement and its defaults")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=cmd_run)


def import_tensorflow_quietly(spec: Any = None) -> None:
    """Import TensorFlow and initialise its devices with stderr muted, without
    the scikit-learn and pyplot imports Keras makes with it (``_lean_import``).

    TF's C++ start-up lines (oneDNN, CUDA probing) ignore TF_CPP_MIN_LOG_LEVEL
    and drown the CLI's own output. Set GRADPIPE_TF_LOGS=1 to see them.
    """
    if "tensorflow" in sys.modules:
        return
    if os.environ.get("GRADPIPE_TF_LOGS") == "1":
        _import_tensorflow(spec)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    fd = sys.stderr.fileno()
    saved, devnull = os.dup(fd), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    try:
        _import_tensorflow(spec)
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def _import_tensorflow(spec: Any) -> None:
    with without_keras_extras():
        import tensorflow as tf

    placement = getattr(getattr(spec, "placement", None), "config", None)
    count = getattr(placement, "logical_cpus", 0)
    if count:  # splitting the CPU must precede the runtime start
        from .distribute import split_cpu

        split_cpu(count)
    tf.config.list_logical_devices()


def _override(text: str) -> Any:
    """A --set argument, parsed as argparse reads it: a malformed one is a usage error."""
    from .errors import ConfigError
    from .overrides import parse_override

    try:
        return parse_override(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.problems[0].message) from None


def cmd_run(args: argparse.Namespace) -> int:
    from .experiment import format_table, plan_runs, run_all, table_rows
    from .rerun import compare, format_report, matches
    from .run_folder import check_outputs, draw, summary_document, write_output

    files, labels, steps, seeds, saved = _rerun_or_files(args)
    runs = plan_runs(files, args.set, args.problem, labels)
    if args.placement:
        runs = [_with_placement(run, args.placement) for run in runs]
    # A folder reruns as it ran, a comparison, even of one run: its table is compared.
    single = len(runs) == 1 and len(seeds) == 1 and not (args.output or saved)
    if args.checkpoint_dir and not single:
        raise GradpipeError("--checkpoint-dir resumes one run: give one pipeline, one seed, "
                            "no sweep, no --output and no folder to rerun")
    check_outputs(args.output, args.overwrite, args.plot, args.logdir)
    import_tensorflow_quietly(runs[0].spec)
    progress = not (args.quiet or args.json)
    if single:
        return _run_one(args, runs[0], steps, seeds[0], progress)
    outcomes = run_all(runs, steps=steps, seeds=seeds, progress=progress, logdir=args.logdir)
    rows = table_rows(outcomes)
    document = summary_document(outcomes, rows)
    report = compare(saved, outcomes) if saved else None
    if args.json:
        extra = {"rerun": {"folder": args.files[0], "match": matches(report),
                           "runs": report}} if report is not None else {}
        print(json.dumps({**document, **extra}, indent=2))
    else:
        print(format_table(rows))
        if report is not None:
            print(format_report(args.files[0], report))
    if args.plot:
        draw(outcomes, args.plot)
    if args.output:
        write_output(args.output, outcomes, rows, steps=steps, seeds=seeds)
    return 1 if args.check and report is not None and not matches(report) else 0


def _rerun_or_files(args: argparse.Namespace) -> tuple[Any, ...]:
    """``(files, labels, steps, seeds, saved)``: the files given, or those of the
    folder to rerun with its steps, seeds and saved results (``saved`` is ``None``
    where the options make the rerun another run, which is then said on stderr)."""
    from .rerun import changed_by, read_saved
    from .run_folder import read_rerun

    files, labels, steps = list(args.files), None, args.steps
    first, count = args.seed, args.seeds
    folders = [f for f in files if Path(f).is_dir()]
    if folders and len(files) > 1:
        raise GradpipeError(f"{folders[0]} is a folder: rerun a folder of an earlier "
                            "--output alone (gradpipe run DIR), not with other files")
    if args.check and not folders:
        raise GradpipeError("--check compares a rerun with the numbers its folder saved: "
                            "give the folder of an earlier --output (gradpipe run DIR)")
    record = read_rerun(files[0]) if folders else None
    if record is not None:
        files, labels = record["files"], record["labels"]
        steps = record["steps"] if steps is None else steps
        if first is None and count is None:
            first, count = record["seeds"][0], len(record["seeds"])
    if count is not None and count < 1:
        raise GradpipeError(f"--seeds {count}: give at least 1")
    seeds = list(range(first or 0, (first or 0) + (count or 1)))
    if record is None:
        return files, labels, steps, seeds, None
    changed = changed_by(record, steps=steps, seeds=seeds, options={
        "--set": " ".join(o.argument for o in args.set), "--problem": args.problem,
        "--placement": args.placement})
    if changed and args.check:
        raise GradpipeError(f"--check compares the rerun with the saved run, and {changed} "
                            "makes it another run: leave it out")
    if changed:
        print(f"not compared with the saved numbers: {changed} makes it another run",
              file=sys.stderr)
        return files, labels, steps, seeds, None
    return files, labels, steps, seeds, read_saved(args.files[0])


def _run_one(args: argparse.Namespace, run: Any, steps: int | None, seed: int,
             progress: bool) -> int:
    from .experiment import file_name
    from .runner import train

    result = train(run.spec, run.problem, steps=steps, seed=seed,
                   progress=run.label if progress else None,
                   checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                   logdir=str(Path(args.logdir) / file_name(run.label)) if args.logdir
                   else None)
    print(json.dumps(result.summary, indent=2) if args.json
          else format_summary(result.summary))
    if args.plot:
        from .plots import plot_history

        plot_history(result.history, args.plot, title=f"{run.problem.name}: {run.file}")
    return 0


def _with_placement(run: Any, kind: str) -> Any:
    import attrs

    from .components import component_spec

    placement = component_spec("placement", {"kind": kind})
    return attrs.evolve(run, spec=attrs.evolve(run.spec, placement=placement))


#: What the text summary prints for a value that is missing (``None`` in JSON). A key
#: not listed is left out then: "converged  no" already says no criterion fired.
_MISSING = {"first_step_at_target": "never reached"}


def format_summary(summary: dict[str, Any]) -> str:
    rows = [(key.replace("_", " "), _MISSING[key] if value is None else _fmt(value))
            for key, value in summary.items() if value is not None or key in _MISSING]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 2 + max(len(v) for _, v in rows))
    return "\n".join([line, *(f"{k:<{width}}  {v}" for k, v in rows), line])


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
