"""The overhead of `gradpipe run` comparing pipelines: time per run beyond its steps.

    python benchmarks/compare.py [--steps N] [--seeds K] [--quick]

Runs the five examples on one problem, K seeds each, in one `gradpipe run`, and
prints each run's overhead as the command measures it (its whole time minus
its steps at their median step time: building the problem and the pipeline,
tracing and compiling the first step, the final evaluation), then the whole
process's time beyond the steps (TensorFlow's import included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["quickstart", "openseq2seq", "mixed_precision", "clippy_adagrad",
            "tfp_minimize"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--problem", default="logistic_regression")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.seeds = 20, 1
    files = [str(ROOT / "examples" / f"{name}.toml") for name in EXAMPLES]
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "gradpipe.cli", "run", *files,
                             "--problem", args.problem, "--steps", str(args.steps),
                             "--seeds", str(args.seeds), "--json", "--quiet"],
                            capture_output=True, text=True, check=True)
    whole = time.perf_counter() - start
    runs = json.loads(result.stdout)["runs"]
    rows = [(str(i + 1), r["pipeline"], str(r["seed"]), str(r["steps"]),
             f"{r['wall_seconds']:.3f}", f"{r['overhead_seconds']:.3f}")
            for i, r in enumerate(runs)]
    print(table(f"gradpipe run: {len(EXAMPLES)} pipelines x {args.seeds} seeds on "
                f"{args.problem}, {args.steps} steps", rows,
                ("run", "pipeline", "seed", "steps", "steps (s)", "overhead (s)")))
    later = [r["overhead_seconds"] for r in runs[1:]] or [runs[0]["overhead_seconds"]]
    steps = sum(r["wall_seconds"] for r in runs)
    print(table("overhead", [
        ("first run", f"{runs[0]['overhead_seconds']:.3f}"),
        ("later runs, median", f"{statistics.median(later):.3f}"),
        ("later runs, max", f"{max(later):.3f}"),
        ("whole process beyond all steps", f"{whole - steps:.3f}"),
        ("  of it per run", f"{(whole - steps) / len(runs):.3f}"),
    ], ("what", "seconds")))


if __name__ == "__main__":
    main()
