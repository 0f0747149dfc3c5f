"""Memory: peak resident memory of a gradpipe Adam step against what it must hold.

    python benchmarks/memory.py [--params N] [--quick]

Cases: gradpipe (default options: one XLA function here), gradpipe-plain
(jit_compile = false), and Keras LossScaleOptimizer(Adam) without and with XLA.
Runs each case in a fresh process and reports the growth of peak RSS over the
process after TensorFlow start-up and variable creation, against the bytes of
the optimizer state (two Adam moments): anything above is a hidden copy.
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
n, variables, case = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
vs = [tf.Variable(tf.zeros([n // variables])) for _ in range(variables)]
grads = [tf.ones([n // variables]) for _ in range(variables)]
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = rss()
if case.startswith("gradpipe"):
    pipe = gradpipe.build({"loss_scale": {"kind": "dynamic"}, "transforms": [
        {"kind": "clip_by_global_norm", "clip_norm": 1.0}, {"kind": "adam"}],
        "pipeline": {"jit_compile": "auto" if case == "gradpipe" else False}})
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
print(json.dumps({"growth": rss() - base}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=20_000_000)
    parser.add_argument("--variables", type=int, default=50)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.params, args.variables = 1_000_000, 10
    state = 2 * 4 * args.params  # two float32 moments
    rows = []
    for case in ("gradpipe", "gradpipe-plain", "keras", "keras-xla"):
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.params),
                              str(args.variables), case], capture_output=True, text=True,
                             check=True)
        growth = json.loads(out.stdout.strip().splitlines()[-1])["growth"]
        rows.append((case, f"{growth / 2**20:.0f}", f"{state / 2**20:.0f}",
                     f"{growth / state:.2f}"))
    print(table(f"peak RSS growth over 5 steps, {args.params:,} parameters",
                rows, ("optimizer", "MiB grown", "MiB of state", "grown / state")))


if __name__ == "__main__":
    main()
