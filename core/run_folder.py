"""``gradpipe run --output DIR``: a folder that holds a comparison and reruns it.

::

    DIR/run.json                 what ran: problem, steps, seeds, the rows
    DIR/pipelines/<row>.toml     each row's resolved pipeline, its [problem] and [lock]
    DIR/summary.json, .csv       the table (the JSON also holds every seed's summary)
    DIR/history.csv              loss, learning rate and loss scale at every step
    DIR/loss.png                 the loss curves, overlaid

``gradpipe run DIR`` reruns it. The folder is written whole at the end (into a
temporary sibling, then renamed), so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError, GradpipeError
from .experiment import Outcome, file_name

RUN_FILE = "run.json"
#: What write_output puts in the folder (and all --overwrite may replace).
WRITTEN = frozenset({RUN_FILE, "pipelines", "summary.json", "summary.csv", "history.csv",
                     "loss.png"})


def check_outputs(output: str | None, overwrite: bool, plot: str | None,
                  logdir: str | None) -> None:
    """Everything the run will write, checked before its first step: a mistake here
    must not surface after minutes of training, with the results lost."""
    if output:
        _check_folder(output, overwrite)
    if plot or output:
        _check_plot(plot)
    if logdir and Path(logdir).exists() and not Path(logdir).is_dir():
        raise GradpipeError(f"--logdir {logdir}: exists and is not a folder")


def _check_folder(directory: str, overwrite: bool) -> None:
    """An empty or new folder; with ``overwrite``, one holding an earlier run and
    nothing else: a folder of other files is never replaced."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise GradpipeError(f"--output {directory}: exists and is not a folder")
    if not path.is_dir() or not any(path.iterdir()):
        return
    if not (path / RUN_FILE).exists():
        raise GradpipeError(f"--output {directory}: the folder holds files that are not "
                            "a gradpipe run; choose a new or empty folder")
    foreign = sorted(p.name for p in path.iterdir() if p.name not in WRITTEN)
    if foreign:
        raise GradpipeError(f"--output {directory}: besides an earlier run the folder "
                            f"holds {', '.join(foreign[:5])}; --overwrite replaces only "
                            "a folder that holds a run alone")
    if not overwrite:
        raise GradpipeError(f"--output {directory}: the folder holds an earlier run; "
                            "choose another folder, or pass --overwrite to replace it")


def _check_plot(plot: str | None) -> None:
    from .plots import supported_formats

    formats = supported_formats()  # also: matplotlib is installed
    if plot is None:
        return
    path = Path(plot)
    if not path.parent.is_dir():
        raise GradpipeError(f"--plot {plot}: no folder {path.parent}")
    if path.suffix.lstrip(".").lower() not in formats:
        raise GradpipeError(f"--plot {plot}: not an image file name; use one of "
                            f".{', .'.join(sorted(formats))}")


def read_rerun(directory: str) -> dict[str, Any]:
    """``run.json`` of an earlier ``--output`` folder, with its pipelines' paths."""
    path = Path(directory)
    try:
        record = json.loads((path / RUN_FILE).read_text())
        record["files"] = [str(path / row["pipeline"]) for row in record["rows"]]
        record["labels"] = [row["label"] for row in record["rows"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{directory}: not a folder written by gradpipe run --output "
                          f"({type(exc).__name__}: {exc})") from None
    return record


def write_output(directory: str, outcomes: Sequence[Outcome], rows: Sequence[dict[str, Any]],
                 *, steps: int | None, seeds: Sequence[int]) -> None:
    """Write the folder whole: into a temporary sibling, then renamed into place."""
    from importlib.metadata import version

    target = Path(directory).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would outlive the rename
    try:
        (staging / "pipelines").mkdir()
        names = [file_name(o.run.label) for o in outcomes]
        for name, outcome in zip(names, outcomes):
            (staging / "pipelines" / f"{name}.toml").write_text(outcome.run.spec.to_toml())
        record = {"gradpipe": version("gradpipe"), "problem": outcomes[0].run.problem.name,
                  "steps": steps, "seeds": list(seeds),
                  "rows": [{"label": o.run.label, "pipeline": f"pipelines/{n}.toml"}
                           for n, o in zip(names, outcomes)]}
        (staging / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n")
        (staging / "summary.json").write_text(
            json.dumps(summary_document(outcomes, rows), indent=2) + "\n")
        _write_csv(staging / "summary.csv", rows)
        _write_csv(staging / "history.csv", [
            {"pipeline": o.run.label, "seed": seed, "step": step + 1, "loss": loss,
             "learning_rate": lr, "loss_scale": scale}
            for o in outcomes for seed, h in zip(o.seeds, o.histories)
            for step, (loss, lr, scale) in enumerate(
                zip(h["loss"], h["learning_rate"], h["loss_scale"]))])
        draw(outcomes, str(staging / "loss.png"))
        if target.exists():  # empty, or a run alone with --overwrite: checked before
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def summary_document(outcomes: Sequence[Outcome], rows: Sequence[dict[str, Any]]
                     ) -> dict[str, Any]:
    """The table's rows and every seed's own summary (``--json``, ``summary.json``)."""
    return {"rows": list(rows),
            "runs": [{"pipeline": o.run.label, "seed": seed, **summary}
                     for o in outcomes for seed, summary in zip(o.seeds, o.summaries)]}


def draw(outcomes: Sequence[Outcome], path: str) -> None:
    """The loss curves of every row, overlaid (``--plot``, and ``loss.png``)."""
    from .plots import plot_comparison

    curves = {o.run.label: [h["loss"] for h in o.histories] for o in outcomes}
    plot_comparison(curves, path, title=f"loss on {outcomes[0].run.problem.name}")


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
