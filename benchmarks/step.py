"""Step benchmark: clip_by_global_norm(1) + dynamic loss scaling + Adam.

    python benchmarks/step.py [--params N] [--variables V] [--repeats R] [--quick]
    python benchmarks/step.py --small      # 2,000 variables of 1-10k parameters

Measures, interleaved in one run, medians of:
  (a) the gradpipe step in tf.function, default options (jit_compile = "auto": the
      update is one XLA function where that is safe, as it is here; with --small
      there are more variables than "auto" compiles, so this is the plain path);
  (a') the same pipeline with [pipeline] jit_compile = false (the plain path, as
      under a multi-replica strategy or with sparse gradients);
  (b) Keras 3 LossScaleOptimizer(Adam(global_clipnorm=1)) in tf.function;
  (c) the same Keras optimizer under jit_compile=True;
  (d) the floor: one XLA kernel reading 4 arrays and writing 3 of the same size.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _common import interleaved, table

import gradpipe


def shapes(args: argparse.Namespace) -> list[int]:
    if args.small:
        rng = np.random.default_rng(0)
        return [int(n) for n in rng.integers(1_000, 10_001, size=args.variables or 2000)]
    count = args.variables or 50
    return [args.params // count] * count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=20_000_000)
    parser.add_argument("--variables", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--small", action="store_true", help="many small variables")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for CI")
    args = parser.parse_args()
    if args.quick:
        args.params, args.repeats = 200_000, 3
        args.variables = args.variables or (40 if args.small else 10)
    import keras
    import tensorflow as tf

    sizes = shapes(args)
    total = sum(sizes)
    rng = np.random.default_rng(1)
    grads = [tf.constant(rng.normal(size=n).astype("f4")) for n in sizes]

    def variables() -> list[tf.Variable]:
        return [tf.Variable(tf.zeros([n])) for n in sizes]

    table_ = {"loss_scale": {"kind": "dynamic"},
              "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                             {"kind": "adam", "learning_rate": 1e-3}]}
    cases = {}
    for label, jit in (("a  gradpipe", "auto"), ("a' gradpipe, jit_compile = false", False)):
        vs = variables()
        pipe = gradpipe.build({**table_, "pipeline": {"jit_compile": jit}})
        pipe.build(vs)
        step = tf.function(lambda p=pipe, v=vs: p.apply_gradients(zip(grads, v)))
        cases[label] = step
    for label, jit in (("b  Keras LSO(Adam)", False), ("c  Keras LSO(Adam), XLA", True)):
        vs = variables()
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3,
                                                                        global_clipnorm=1.0))
        opt.build(vs)
        cases[label] = tf.function(lambda o=opt, v=vs: o.apply_gradients(zip(grads, v)),
                                   jit_compile=jit)
    p, m, v = variables(), variables(), variables()

    @tf.function(jit_compile=True)
    def floor() -> None:  # read param, grad, m, v; write param, m, v
        for i, g in enumerate(grads):
            m_new = 0.9 * m[i] + 0.1 * g
            v_new = 0.999 * v[i] + 0.001 * g * g
            m[i].assign(m_new)
            v[i].assign(v_new)
            p[i].assign(p[i] - 1e-3 * m_new / (tf.sqrt(v_new) + 1e-7))

    cases["d  floor: 4 reads, 3 writes (XLA)"] = floor
    times = interleaved(cases, args.repeats, sync=lambda r: tf.constant(0).numpy())
    a, a_jit = times["a  gradpipe"], times["a' gradpipe, jit_compile = false"]
    b, c, d = (times["b  Keras LSO(Adam)"], times["c  Keras LSO(Adam), XLA"],
               times["d  floor: 4 reads, 3 writes (XLA)"])
    rows = [(name, f"{t * 1e3:.2f}", f"{28 * total / t / 1e9:.2f}") for name, t in times.items()]
    title = (f"step benchmark: {total:,} float32 parameters in {len(sizes)} variables, "
             f"median of {args.repeats} interleaved runs")
    print(table(title, rows, ("case", "ms/step", "GB/s at 28 B/param")))
    ratios = [("a/b", a / b), ("a/c", a / c), ("a/d", a / d),
              ("a'/b", a_jit / b), ("a'/c", a_jit / c), ("a'/d", a_jit / d)]
    print(table("ratios (lower is faster)", [(k, f"{r:.3f}") for k, r in ratios],
                ("ratio", "value")))


if __name__ == "__main__":
    sys.exit(main())
