"""The progress line of ``gradpipe run``, on stderr so that ``--json`` stays clean.

tqdm draws it: the rate (steps/s) and the time left come from it. On a
terminal the bar redraws in place; elsewhere (CI logs, files) one line is
printed every 10% of the steps, in the same format, so a log shows progress
without thousands of carriage returns.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm


class Progress:
    """One run's progress: ``label`` says which pipeline (and seed) is running."""

    def __init__(self, total: int, label: str, enabled: bool, initial: int = 0) -> None:
        self.total = max(total, 1)
        self.label = label
        self.enabled = enabled
        self.start = time.perf_counter()
        self.initial = initial  # steps done before (a checkpoint): not in the rate
        self.next_line = 10 * initial // self.total + 1  # the next tenth, off a terminal
        self.bar: Any = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=self.total, initial=initial, desc=label, file=sys.stderr,
                            dynamic_ncols=True, unit="step", mininterval=0.2)

    def update(self, done: int, loss: float, lr: float, scale: float) -> None:
        if not self.enabled:
            return
        postfix = f"loss {loss:.4g}  lr {lr:.3g}  scale {scale:.4g}"
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(done - self.bar.n)
            return
        if 10 * done >= self.next_line * self.total or done == self.total:
            self.next_line = 10 * done // self.total + 1
            elapsed = time.perf_counter() - self.start
            rate = (done - self.initial) / elapsed if elapsed > 0 else None
            line = tqdm.format_meter(done, self.total, elapsed, prefix=self.label,
                                     unit="step", rate=rate, postfix=postfix, ncols=0)
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
