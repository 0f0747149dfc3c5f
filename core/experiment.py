"""``gradpipe run`` with several pipelines, sweeps and seeds: one table.

Everything is checked before the first step: the files, every ``--set``
combination, the problem they share, the output folder. Then each pipeline
runs once per seed in this process (TensorFlow is imported once), each run
with fresh variables and state, and every pipeline of one seed sees the same
problem: the same data in the same order.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from .components import component_spec
from .errors import ConfigError, Problem
from .overrides import Override, grid, label, parse_with
from .spec import ComponentSpec, PipelineSpec


@attrs.frozen(kw_only=True)
class PlannedRun:
    """One row of the table: a pipeline file with one combination of ``--set`` values."""

    label: str
    file: str
    settings: str  # the swept values, "" without a sweep
    spec: PipelineSpec  # with the problem it runs on
    problem: ComponentSpec


def plan_runs(files: Sequence[str], overrides: Sequence[Override], problem: str | None,
              labels: Sequence[str] | None = None) -> list[PlannedRun]:
    """Every row, validated; a ConfigError lists every problem before anything runs."""
    names = list(labels) if labels else _labels(files)
    runs: list[tuple[int, int, PlannedRun]] = []
    problems: list[Problem] = []
    for number, combo in enumerate(grid(overrides)):
        specs = []
        for file in files:
            try:
                specs.append(parse_with(file, combo))
            except ConfigError as exc:
                problems += [p for p in exc.problems if p not in problems]
        if problems:
            continue
        settings = label(combo)
        shared = _shared_problem(files, specs, problem, settings)
        runs += [(i, number, PlannedRun(label=f"{name} {settings}".strip(), file=str(file),
                                        settings=settings, problem=shared,
                                        spec=attrs.evolve(spec, problem=shared)))
                 for i, (name, file, spec) in enumerate(zip(names, files, specs))]
    if problems:
        raise ConfigError(problems)
    return [run for _, _, run in sorted(runs, key=lambda r: r[:2])]  # file by file


def _labels(files: Sequence[str]) -> list[str]:
    """Each file's stem; the path where two stems are the same."""
    stems = [Path(f).stem for f in files]
    return [stem if stems.count(stem) == 1 else str(Path(f).with_suffix(""))
            for stem, f in zip(stems, files)]


def _shared_problem(files: Sequence[str], specs: Sequence[PipelineSpec],
                    problem: str | None, settings: str) -> ComponentSpec:
    if problem is not None:
        return component_spec("problem", {"kind": problem})
    named = {file: spec.problem for file, spec in zip(files, specs) if spec.problem}
    if not named:
        raise ConfigError("no problem to run: add a [problem] table with kind = "
                          "'quadratic' (or another problem) to the files, or pass --problem")
    distinct = {_key(p): p for p in named.values()}
    if len(distinct) > 1:
        listed = "; ".join(f"{file}: {_describe(p)}" for file, p in named.items())
        where = f" (with {settings})" if settings else ""
        raise ConfigError(f"the files name different problems{where}: {listed}. Pass "
                          "--problem NAME to run them all on one, or make the [problem] "
                          "tables the same")
    return next(iter(distinct.values()))


def _key(problem: ComponentSpec) -> str:
    return repr(sorted(problem.to_mapping().items()))


def _describe(problem: ComponentSpec) -> str:
    table = problem.to_mapping()
    extra = ", ".join(f"{k}={v}" for k, v in table.items() if k != "kind")
    return f"{table['kind']}" + (f" ({extra})" if extra else "")


@attrs.frozen(kw_only=True)
class Outcome:
    """A row's runs, one per seed."""

    run: PlannedRun
    seeds: tuple[int, ...]
    summaries: tuple[dict[str, Any], ...]
    histories: tuple[dict[str, list[float]], ...]
    metric: str | None  # the problem's headline metric (the runner's choice)


def run_all(runs: Sequence[PlannedRun], *, steps: int | None, seeds: Sequence[int],
            progress: bool, logdir: str | None) -> list[Outcome]:
    """Train every row once per seed, in order; ``progress``: show each run's, and
    that of them all."""
    from .progress import Overall
    from .runner import check_builds, train

    # a pipeline that cannot build here fails before any step
    defaults = [check_builds(run.spec, run.problem) for run in runs]
    budgets = [steps if steps is not None else default for default in defaults]
    overall = Overall([b for b in budgets for _ in seeds], enabled=progress)
    outcomes = []
    total = len(runs) * len(seeds)
    for number, (run, budget) in enumerate(zip(runs, budgets)):
        summaries, histories, metric = [], [], None
        for s, seed in enumerate(seeds):
            tag = (f"[{number * len(seeds) + s + 1}/{total}] {run.label}"
                   + (f" seed {seed}" if len(seeds) > 1 else ""))
            where = None
            if logdir:
                where = str(Path(logdir) / file_name(run.label) /
                            (f"seed_{seed}" if len(seeds) > 1 else ""))
            result = train(run.spec, run.problem, steps=steps, seed=seed,
                           progress=tag if progress else None, logdir=where, overall=overall)
            overall.finished(tag, budget, result.summary, result.metric)
            summaries.append(result.summary)
            histories.append(result.history)
            metric = result.metric
        outcomes.append(Outcome(run=run, seeds=tuple(seeds), summaries=tuple(summaries),
                                histories=tuple(histories), metric=metric))
    overall.close()
    return outcomes


def file_name(text: str) -> str:
    """``text`` as one file name."""
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in text).strip("_")


def table_rows(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """One summary row per pipeline (and sweep combination), over its seeds; the row
    with the lowest mean loss over the last 10% of the steps is marked best."""
    rows = []
    for outcome in outcomes:
        runs = outcome.summaries
        metric = outcome.metric
        # A mini-batch loss is noisy: the mean of each run's last 10% of steps.
        tails = [_mean(h["loss"][-max(1, len(h["loss"]) // 10):]) for h in outcome.histories]
        converged = [r["converged_by"] for r in runs if r["converged_by"]]
        row: dict[str, Any] = {
            "pipeline": outcome.run.label,
            "file": outcome.run.file,
            "settings": outcome.run.settings,
            "problem": runs[0]["problem"],
            "seeds": len(runs),
            "steps": _count([r["steps"] for r in runs]),
            "converged_by": (f"{converged[0]} ({len(converged)}/{len(runs)})"
                             if converged else ""),
            "loss_mean": _mean(tails),
            "loss_std": _std(tails),
            "metric": metric or "",
            "metric_mean": _mean([r[metric] for r in runs]) if metric else math.nan,
            "metric_std": _std([r[metric] for r in runs]) if metric else math.nan,
            "runs_reaching_target": sum(bool(r["target_reached"]) for r in runs),
            "skipped_steps": _count([r["skipped_steps"] for r in runs]),
            "steps_per_second": _mean([r["steps_per_second"] or 0.0 for r in runs]),
            "overhead_seconds": _mean([r["overhead_seconds"] for r in runs]),
        }
        rows.append(row)
    finite = [r for r in rows if math.isfinite(r["loss_mean"])]
    best = min(finite, key=lambda r: r["loss_mean"]) if finite else None
    for row in rows:
        row["best"] = row is best and len(rows) > 1
    return rows


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _count(values: Sequence[int]) -> float | int:
    """The mean of counts: an integer when the seeds agree (steps, skips)."""
    mean = _mean(values)
    return int(mean) if mean == int(mean) else mean


def _std(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The table ``gradpipe run`` prints for several runs."""
    seeds = rows[0]["seeds"] if rows else 1
    metric = next((r["metric"] for r in rows if r["metric"]), "")
    spread = " ± std" if seeds > 1 else ""
    header = ["", "pipeline", "steps", "converged by", f"loss, last 10%{spread}",
              f"{metric}{spread}" if metric else "metric", "skipped", "steps/s"]
    body = [["*" if r["best"] else "", r["pipeline"], f"{r['steps']:g}", r["converged_by"],
             _plus_minus(r["loss_mean"], r["loss_std"], seeds),
             _plus_minus(r["metric_mean"], r["metric_std"], seeds) if r["metric"] else "",
             f"{r['skipped_steps']:g}", f"{r['steps_per_second']:.0f}"]
            for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip()
             for line in [header, *body]]
    lines.insert(1, "-" * len(max(lines, key=len)))
    problem = rows[0]["problem"] if rows else "?"
    lines.append(f"problem {problem}; " + (f"mean over {seeds} seeds" if seeds > 1 else
                 "1 seed (--seeds N for the spread)") + "; * lowest loss")
    return "\n".join(lines)


def _plus_minus(mean: float, std: float, seeds: int) -> str:
    return f"{mean:.4g} ± {std:.2g}" if seeds > 1 else f"{mean:.4g}"
