"""Memory: peak resident memory of an Adam step against what it must hold.

    python benchmarks/memory.py [--params N] [--quick]

Cases: gradpipe (jit_compile = true: what "auto" chooses at the full size, kept
for the small run), gradpipe-plain (jit_compile = false), Keras
LossScaleOptimizer(Adam) without and with XLA, and the floor (two moments
created, then the bare XLA update). Each case runs in a fresh process, once at
the full size and once with the same variables at 4,096 parameters each, and
reports the growth of peak RSS over the process after TensorFlow start-up and
variable creation. The small run measures what does not
grow with the parameters (tracing, XLA compilation, thread pools); the
difference between the two is the memory that does, and that is compared with
the optimizer state (two Adam moments): anything above it is a hidden copy.
``--quick`` is a smoke run: every case once, in one process, at the small size.
The small run has 4,096 parameters per variable, not fewer, so that it
compiles the same program: under XLA the sum of squares folds tensors of at
least 2,048 elements, and that costs compile memory per variable. gradpipe's
cases set pack_variables = false for the same reason: "auto" would pack the
small run's variables (too small for XLA to pay one by one) and not the full
run's, and the packed program's smaller compile memory would be counted as
memory that grows with the size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from _common import table

CHILD = r"""
import json, os, resource, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
import gradpipe
n, variables = int(sys.argv[1]), int(sys.argv[2])
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
for case in sys.argv[3].split(","):  # one case per process, but in a smoke run
    vs = [tf.Variable(tf.zeros([n // variables])) for _ in range(variables)]
    grads = [tf.ones([n // variables]) for _ in range(variables)]
    base = rss()
    if case == "floor":
        m = [tf.Variable(tf.zeros_like(v)) for v in vs]
        u = [tf.Variable(tf.zeros_like(v)) for v in vs]
        @tf.function(jit_compile=True)
        def step():
            for g, p, m_, u_ in zip(grads, vs, m, u):
                m_.assign(0.9 * m_ + 0.1 * g)
                u_.assign(0.999 * u_ + 0.001 * g * g)
                p.assign_sub(1e-3 * m_ / (tf.sqrt(u_) + 1e-7))
    elif case.startswith("gradpipe"):
        pipe = gradpipe.build({"loss_scale": {"kind": "dynamic"}, "transforms": [
            {"kind": "clip_by_global_norm", "clip_norm": 1.0}, {"kind": "adam"}],
            "pipeline": {"jit_compile": case == "gradpipe", "pack_variables": False}})
        pipe.build(vs)
        step = tf.function(lambda: pipe.apply_gradients(zip(grads, vs)))
    else:
        import keras
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(global_clipnorm=1.0))
        opt.build(vs)
        step = tf.function(lambda: opt.apply_gradients(zip(grads, vs)),
                           jit_compile=case == "keras-xla")
    for _ in range(5):
        step()
    print(json.dumps({"case": case, "growth": rss() - base}))
"""


SMALL_PER_VARIABLE = 4_096


CASES = ("floor", "gradpipe", "gradpipe-plain", "keras", "keras-xla")


def growth(params: int, variables: int, cases: tuple[str, ...]) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(params), str(variables),
                          ",".join(cases)], capture_output=True, text=True, check=True)
    found = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {row["case"]: int(row["growth"]) for row in found}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=20_000_000)
    parser.add_argument("--variables", type=int, default=50)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.variables = 10
        args.params = SMALL_PER_VARIABLE * args.variables
    small = SMALL_PER_VARIABLE * args.variables
    state = 2 * 4 * args.params  # two float32 moments
    mib = 2**20
    rows = []
    if args.quick:  # a smoke run: every case once, in one process, at one size
        sizes = {case: (value, value) for case, value in
                 growth(small, args.variables, CASES).items()}
    else:  # each case in a fresh process, at both sizes
        sizes = {case: (growth(args.params, args.variables, (case,))[case],
                        growth(small, args.variables, (case,))[case]) for case in CASES}
    for case, (full, fixed) in sizes.items():
        grown_state = 2 * 4 * (args.params - small)
        rows.append((case, f"{full / mib:.0f}", f"{fixed / mib:.0f}",
                     f"{(full - fixed) / mib:.0f}",
                     f"{(full - fixed) / grown_state:.2f}" if grown_state else "-"))
    print(table(f"peak RSS growth over 5 steps, {args.params:,} parameters in "
                f"{args.variables} variables; optimizer state {state / mib:.0f} MiB",
                rows, ("case", "MiB grown", f"at {SMALL_PER_VARIABLE:,}/variable", "with the size",
                       "with the size / state")))


if __name__ == "__main__":
    main()
