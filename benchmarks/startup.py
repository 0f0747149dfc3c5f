"""Start-up: `gradpipe plugins` and `gradpipe check` wall time, build and first-trace time.

    python benchmarks/startup.py [--repeats R] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import table

ROOT = Path(__file__).resolve().parents[1]


def wall(cmd: list[str], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 2
    example = str(ROOT / "examples" / "mixed_precision.toml")
    cli = [sys.executable, "-m", "gradpipe.cli"]
    rows = [
        ("python -c pass (interpreter alone)", wall([sys.executable, "-c", "pass"],
                                                    args.repeats)),
        ("gradpipe plugins --all", wall([*cli, "plugins", "--all"], args.repeats)),
        ("gradpipe check examples/mixed_precision.toml", wall([*cli, "check", example],
                                                              args.repeats)),
    ]
    import tensorflow as tf

    import gradpipe

    variables = [tf.Variable(tf.zeros([256, 256])) for _ in range(20)]
    start = time.perf_counter()
    pipe = gradpipe.load(example)
    pipe.build(variables)
    rows.append(("build from TOML (TensorFlow imported)", time.perf_counter() - start))
    grads = [tf.ones([256, 256]) for _ in variables]
    step = tf.function(lambda: pipe.apply_gradients(zip(grads, variables)))
    start = time.perf_counter()
    step.get_concrete_function()
    rows.append(("trace the first step", time.perf_counter() - start))
    start = time.perf_counter()
    step()
    rows.append(("run the first step", time.perf_counter() - start))
    print(table(f"start-up, medians of {args.repeats} (CLI rows are whole processes)",
                [(name, f"{t:.3f}") for name, t in rows], ("what", "seconds")))


if __name__ == "__main__":
    main()
