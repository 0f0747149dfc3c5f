"""``gradpipe run DIR``: whether a rerun gives the numbers the folder saved.

A run folder (:mod:`gradpipe.run_folder`) holds every seed's summary and every
step's loss, learning rate and loss scale. A rerun is compared with both, value
by value and exactly: on the same machine, with the same versions, the numbers
are the same to the bit, so any difference is news (another TensorFlow, another
CPU, a plugin that changed). Timings measure the machine, never the maths, and
are not compared. ``--check`` turns a difference into exit status 1.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .experiment import Outcome

#: Summary values that measure the machine (and its load), not the maths.
TIMINGS = frozenset({"wall_seconds", "steps_per_second", "overhead_seconds"})
#: The per-step values of history.csv, each compared at every step.
CURVES = ("loss", "learning_rate", "loss_scale")

Key = tuple[str, int]  # (pipeline, seed)


def changed_by(record: dict[str, Any], *, steps: int | None, seeds: Sequence[int],
               options: dict[str, Any]) -> str | None:
    """The options that make the rerun another run than the saved one (then its
    numbers cannot be expected to match), in words; ``None`` if none does."""
    found = [f"{name} {value}" for name, value in options.items() if value]
    if steps is not None and steps != record["steps"]:
        found.append(f"--steps {steps} (the saved run has "
                     f"{record['steps'] or 'the problem default'})")
    if list(seeds) != list(record["seeds"]):
        found.append(f"seeds {_span(seeds)} (the saved run has {_span(record['seeds'])})")
    return ", ".join(found) or None


def _span(seeds: Sequence[int]) -> str:
    return str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}..{seeds[-1]}"


def read_saved(directory: str) -> tuple[dict[Key, dict[str, Any]],
                                        dict[Key, dict[str, list[float]]]]:
    """Every saved run's summary and per-step values, keyed by (pipeline, seed)."""
    path = Path(directory)
    try:
        runs = json.loads((path / "summary.json").read_text())["runs"]
        summaries = {(r["pipeline"], int(r["seed"])): r for r in runs}
        histories: dict[Key, dict[str, list[float]]] = {}
        with (path / "history.csv").open(newline="") as handle:
            for row in csv.DictReader(handle):
                curves = histories.setdefault((row["pipeline"], int(row["seed"])),
                                              {c: [] for c in CURVES})
                for c in CURVES:
                    curves[c].append(float(row[c]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{directory}: its saved results cannot be read "
                          f"({type(exc).__name__}: {exc})") from None
    return summaries, histories


def compare(saved: tuple[dict[Key, dict[str, Any]], dict[Key, dict[str, list[float]]]],
            outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """One entry per run of the rerun: its pipeline, seed and every difference from
    the saved run (none: it matches)."""
    summaries, histories = saved
    report = []
    for outcome in outcomes:
        for seed, summary, history in zip(outcome.seeds, outcome.summaries,
                                          outcome.histories):
            key = (outcome.run.label, seed)
            if key not in summaries:
                differences = [{"value": "run", "saved": None, "now": "ran"}]
            else:  # through JSON, as the saved values went: the same types, exactly
                now = json.loads(json.dumps(summary))
                differences = _summary_differences(summaries[key], now)
                differences += _curve_differences(histories.get(key, {}), history)
            report.append({"pipeline": key[0], "seed": seed, "match": not differences,
                           "differences": differences})
    return report


def _summary_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for key in [k for k in saved if k not in TIMINGS | {"pipeline", "seed"}]:
        old, new = saved[key], now.get(key)
        if _same(old, new):
            continue
        entry = {"value": key, "saved": old, "now": new}
        if _number(old) and _number(new):
            entry["difference"] = new - old
        found.append(entry)
    return found


def _curve_differences(saved: dict[str, list[float]], now: dict[str, list[float]]
                       ) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for curve in CURVES:
        old, new = saved.get(curve, []), now[curve]
        if len(old) != len(new):
            found.append({"value": curve, "saved": f"{len(old)} steps",
                          "now": f"{len(new)} steps"})
            continue
        steps = [i for i, (a, b) in enumerate(zip(old, new)) if not _same(a, b)]
        if steps:
            first = steps[0]
            found.append({"value": curve, "step": first + 1, "saved": old[first],
                          "now": new[first], "difference": new[first] - old[first],
                          "steps_differing": len(steps),
                          "largest_difference": max(abs(new[i] - old[i]) for i in steps)})
    return found


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(a: Any, b: Any) -> bool:
    nan = _number(a) and _number(b) and math.isnan(a) and math.isnan(b)
    return bool(a == b or nan)


def matches(report: Sequence[dict[str, Any]]) -> bool:
    return all(run["match"] for run in report)


def format_report(directory: str, report: Sequence[dict[str, Any]]) -> str:
    """What ``gradpipe run DIR`` prints under its table."""
    names = [_name(run, report) for run in report]
    differ = [(name, run) for name, run in zip(names, report) if not run["match"]]
    if not differ:
        return (f"rerun of {directory}: {_runs(len(report))} the saved numbers "
                "(each summary value but the timings, and the loss, learning rate and "
                "loss scale at every step)")
    lines = [f"rerun of {directory}: {len(differ)} of {len(report)} runs differ from the "
             "saved numbers:"]
    lines += [f"  {name}: " + "; ".join(map(_describe, run["differences"]))
              for name, run in differ]
    same = [name for name, run in zip(names, report) if run["match"]]
    lines.append(f"  the same: {', '.join(same)}" if same else "  none is the same")
    return "\n".join(lines)


def _runs(count: int) -> str:
    return "its run matches" if count == 1 else f"all {count} runs match"


def _name(run: dict[str, Any], report: Sequence[dict[str, Any]]) -> str:
    seeds = {r["seed"] for r in report}
    return run["pipeline"] + (f" seed {run['seed']}" if len(seeds) > 1 else "")


def _describe(d: dict[str, Any]) -> str:
    """``final_loss: 0.1489 now, 0.149 saved (-0.00011, relative -0.00074)``."""
    if d["value"] == "run":
        return "not in the saved run"
    where = ""
    if "step" in d:
        count = d["steps_differing"]
        where = f" at {count} step{'s' if count > 1 else ''} from step {d['step']}"
    text = f"{d['value']}{where}: {_show(d['now'])} now, {_show(d['saved'])} saved"
    if "difference" not in d:
        return text
    change = f"{d['difference']:+.2g}"
    if d["saved"]:
        change += f", relative {d['difference'] / abs(d['saved']):+.2g}"
    if "largest_difference" in d:
        change += f", largest {d['largest_difference']:.2g}"
    return f"{text} ({change})"


def _show(value: Any) -> str:
    if value is None:
        return "none"
    return f"{value:.7g}" if isinstance(value, float) else str(value)
