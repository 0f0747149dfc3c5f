"""The progress lines of ``gradpipe run``, on stderr so that ``--json`` stays clean.

tqdm draws them: the rate (steps/s) and the time left come from it. On a
terminal the bars redraw in place; elsewhere (CI logs, files) lines are
printed in the same format, few of them, so a log shows progress without
thousands of carriage returns.

One run prints a line every 10% of its steps. A comparison (several runs, see
:class:`Overall`) prints one line per finished run, with its result and the
progress of the whole comparison (steps done of all, the time left), and a
line mid-run only where a run is long enough that 10% of the whole would pass
silently: 18 runs make 18 lines, not 180.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm


class Progress:
    """One run's progress: ``label`` says which pipeline (and seed) is running;
    ``overall``, the comparison it is part of."""

    def __init__(self, total: int, label: str, enabled: bool, initial: int = 0,
                 overall: Overall | None = None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.enabled = enabled
        self.overall = overall
        self.start = time.perf_counter()
        self.initial = initial  # steps done before (a checkpoint): not in the rate
        self.next_line = 10 * initial // self.total + 1  # the next tenth, off a terminal
        self.bar: Any = None
        if enabled and sys.stderr.isatty():
            # in a comparison, under the overall bar, and gone once the run is done:
            # its result is printed above the bars instead
            self.bar = tqdm(total=self.total, initial=initial, desc=label, file=sys.stderr,
                            dynamic_ncols=True, unit="step", mininterval=0.2,
                            position=1 if overall else None, leave=overall is None)

    def update(self, done: int, loss: float, lr: float, scale: float) -> None:
        if not self.enabled:
            return
        postfix = f"loss {loss:.4g}  lr {lr:.3g}  scale {scale:.4g}"
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(done - self.bar.n)
        if self.overall is not None:
            # the run's last step: its result line follows at once
            last = done >= self.total
            self.overall.advance(done - self.initial,
                                 None if last else lambda: self._line(done, postfix))
        elif self.bar is None and (10 * done >= self.next_line * self.total
                                   or done == self.total):
            self.next_line = 10 * done // self.total + 1
            print(self._line(done, postfix), file=sys.stderr, flush=True)

    def _line(self, done: int, postfix: str) -> str:
        elapsed = time.perf_counter() - self.start
        rate = (done - self.initial) / elapsed if elapsed > 0 else None
        return tqdm.format_meter(done, self.total, elapsed, prefix=self.label, unit="step",
                                 rate=rate, postfix=postfix, ncols=0)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Overall:
    """A comparison's progress over all its runs: the steps done of all of them and
    the time left, from the rate so far (tracing and building included)."""

    def __init__(self, budgets: list[int], enabled: bool) -> None:
        self.total = max(sum(budgets), 1)
        self.runs = len(budgets)
        self.enabled = enabled
        self.start = time.perf_counter()
        self.finished_steps = 0  # of the runs that are done
        self.running = 0  # steps of the run in progress
        self.last_line = 0  # steps done when the last line was printed, off a terminal
        self.bar: Any = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=self.total, desc=f"all {self.runs} runs", file=sys.stderr,
                            dynamic_ncols=True, unit="step", mininterval=0.2, position=0)

    @property
    def done(self) -> int:
        return self.finished_steps + self.running

    def advance(self, steps: int, line: Callable[[], str] | None) -> None:
        """The running run has done ``steps``; ``line()`` is its progress line
        (``None``: no line now)."""
        self.running = steps
        if self.bar is not None:
            self.bar.update(self.done - self.bar.n)
        elif line and self.enabled and 10 * (self.done - self.last_line) >= self.total:
            self._print(f"{line()} | {self._meter()}")

    def finished(self, label: str, budget: int, summary: dict[str, Any],
                 metric: str | None) -> None:
        """A run is done: print its result; steps it did not need (it converged)
        leave the total, so that the time left is that of the steps still to run."""
        ran = summary["steps"] - summary["resumed_from_step"]
        self.total = max(self.total - (budget - ran), 1)
        self.finished_steps += ran
        self.running = 0
        if not self.enabled:
            return
        text = f"{label}: {_result(summary, metric)}"
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.update(self.done - self.bar.n)
            self.bar.write(text, file=sys.stderr)
        else:
            self._print(f"{text} | {self._meter()}")

    def _meter(self) -> str:
        return tqdm.format_meter(self.done, self.total, time.perf_counter() - self.start,
                                 prefix=f"all {self.runs} runs", unit="step", ncols=0)

    def _print(self, text: str) -> None:
        self.last_line = self.done
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _result(summary: dict[str, Any], metric: str | None) -> str:
    """``500 steps, final loss 0.0123, test_accuracy 0.97, 1412 step/s``."""
    parts = [f"{summary['steps']} steps", f"final loss {summary['final_loss']:.4g}"]
    if metric and isinstance(summary.get(metric), (int, float)):
        parts.append(f"{metric} {summary[metric]:.4g}")
    if summary.get("converged_by"):
        parts.append(f"converged by {summary['converged_by']}")
    if summary.get("skipped_steps"):
        parts.append(f"{summary['skipped_steps']} skipped")
    if summary.get("steps_per_second"):
        parts.append(f"{summary['steps_per_second']:.0f} step/s")
    return ", ".join(parts)
