"""Step benchmark: clip_by_global_norm(1) + dynamic loss scaling + Adam (or SGD).

    python benchmarks/step.py [--params N] [--variables V] [--repeats R] [--quick]
    python benchmarks/step.py --small      # 2,000 variables of 1-10k parameters
    python benchmarks/step.py --rule sgd   # SGD with momentum 0.9 instead of Adam

Measures, interleaved in one run, medians of:
  (a) the gradpipe step in tf.function, jit_compile = true: the update is one XLA
      function (with --small, as under "auto", the state of the many variables is
      packed into one vector and the packed chain is one XLA function);
  (a~) the default, jit_compile = "auto": with 50 large variables, one XLA
      function per shape, each handed the gradients' global norm for the clip
      (seconds less to the first step than (a), whose one function holds all 50);
  (a+) the same pipeline in a train step compiled whole, tf.function(jit_compile=
      True): the compiled step is inlined, not called from a graph;
  (a') the same pipeline with [pipeline] jit_compile = false and pack_variables =
      false (the per-variable plain path, as under a multi-replica strategy);
  (b) Keras 3 LossScaleOptimizer(<rule>(global_clipnorm=1)) in tf.function;
  (c) the same Keras optimizer under jit_compile=True;
  (d) the floor: one XLA function that reads and writes only what the rule must
      (Adam: 4 reads, 3 writes; SGD with momentum: 3 reads, 2 writes);
  (e) the floor with clipping: (d) plus the global norm, a second read of the
      gradients (summed by gradpipe's fold: XLA's own reduction takes about four
      times as long on a CPU), written by hand as one XLA function;
  (d*), (e*) the same floors with the variables in sequence: each variable's
      gradient depends on the previous variable's new value, as gradpipe orders
      large variables on a CPU (gradpipe.sequence), so XLA runs each variable's
      loops together instead of kind by kind. The tighter floor where it is faster.
--no-xla leaves out (a+), (c) and the floors, whose XLA compilation takes many
minutes at 2,000 variables. Each ratio is given as the ratio of the medians and
as the median over rounds of the ratio within a round, which the machine's
drift between rounds does not move.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _common import interleaved_samples, medians, paired_ratio, paired_ratio_interval, table

import gradpipe
from gradpipe.transform import sum_of_squares


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
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds (default 61: a round takes ~0.3 s; 5 with --small)")
    parser.add_argument("--small", action="store_true", help="many small variables")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for CI")
    parser.add_argument("--rule", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--no-xla", action="store_true",
                        help="leave out the XLA cases (c) and (d)")
    args = parser.parse_args()
    if args.quick:
        args.params, args.repeats = 80_000, 3
        args.variables = args.variables or (16 if args.small else 4)  # 16: packed
    if args.repeats is None:  # tracing 2,000 variables takes minutes, their rounds 0.7 s
        args.repeats = 5 if args.small else 61
    import keras
    import tensorflow as tf

    sizes = shapes(args)
    total = sum(sizes)
    rng = np.random.default_rng(1)
    grads = [tf.constant(rng.normal(size=n).astype("f4")) for n in sizes]

    def variables() -> list[tf.Variable]:
        return [tf.Variable(tf.zeros([n])) for n in sizes]

    if args.rule == "adam":
        rule = {"kind": "adam", "learning_rate": 1e-3}
        keras_rule = keras.optimizers.Adam
        keras_args: dict = {}
        bytes_per_param = 28
    else:
        rule = {"kind": "sgd", "learning_rate": 1e-3, "momentum": 0.9}
        keras_rule = keras.optimizers.SGD
        keras_args = {"momentum": 0.9}
        bytes_per_param = 20
    table_ = {"loss_scale": {"kind": "dynamic"},
              "transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0}, rule]}
    name = args.rule.capitalize() if args.rule == "adam" else "SGD"
    labels = {"a": "a  gradpipe", "a~": "a~ gradpipe, \"auto\"",
              "a+": "a+ gradpipe, train step under XLA",
              "a'": "a' gradpipe, per variable, no XLA",
              "b": f"b  Keras LSO({name})", "c": f"c  Keras LSO({name}), XLA",
              "d": "d  floor (XLA)", "e": "e  floor with clipping (XLA)",
              "d*": "d* floor, variables in sequence", "e*": "e* floor with clipping, in sequence"}
    cases = {}
    gradpipe_cases = (("a", True, False), ("a~", "auto", False), ("a+", True, True),
                      ("a'", False, False))
    for key, jit, whole in gradpipe_cases:
        if whole and args.no_xla:
            continue
        vs = variables()
        pipe = gradpipe.build({**table_, "pipeline": {"jit_compile": jit,
                                                      "pack_variables": jit and "auto"}})
        pipe.build(vs)
        cases[labels[key]] = tf.function(lambda p=pipe, v=vs: p.apply_gradients(zip(grads, v)),
                                         jit_compile=whole)
    for key, jit in (("b", False), ("c", True))[:1 if args.no_xla else 2]:
        vs = variables()
        opt = keras.optimizers.LossScaleOptimizer(keras_rule(1e-3, global_clipnorm=1.0,
                                                             **keras_args))
        opt.build(vs)
        cases[labels[key]] = tf.function(lambda o=opt, v=vs: o.apply_gradients(zip(grads, v)),
                                         jit_compile=jit)
    def floor(clip: bool, in_sequence: bool = False):
        p, m, v = variables(), variables(), variables()

        @tf.function(jit_compile=True)
        def step() -> None:
            factor = tf.minimum(1.0, tf.math.rsqrt(sum_of_squares(grads))) if clip else 1.0
            for i, g in enumerate(grads):
                g = g * factor if clip else g
                if in_sequence and i:  # exactly g, computed after variable i - 1's update
                    g = g * (1.0 - 0.0 * p[i - 1][0])
                if args.rule == "adam":  # read param, grad, m, v; write param, m, v
                    m_new = 0.9 * m[i] + 0.1 * g
                    v_new = 0.999 * v[i] + 0.001 * g * g
                    m[i].assign(m_new)
                    v[i].assign(v_new)
                    p[i].assign(p[i] - 1e-3 * m_new / (tf.sqrt(v_new) + 1e-7))
                else:  # read param, grad, m; write param, m
                    m_new = 0.9 * m[i] - 1e-3 * g
                    m[i].assign(m_new)
                    p[i].assign(p[i] + m_new)
        return step

    if not args.no_xla:
        cases[labels["d"]] = floor(clip=False)
        cases[labels["e"]] = floor(clip=True)
        cases[labels["d*"]] = floor(clip=False, in_sequence=True)
        cases[labels["e*"]] = floor(clip=True, in_sequence=True)
    samples = interleaved_samples(cases, args.repeats, sync=lambda r: tf.constant(0).numpy())
    times = medians(samples)
    rows = [(label, f"{t * 1e3:.2f}", f"{bytes_per_param * total / t / 1e9:.2f}")
            for label, t in times.items()]
    title = (f"step benchmark ({args.rule}): {total:,} float32 parameters in {len(sizes)} "
             f"variables, median of {args.repeats} interleaved runs")
    print(table(title, rows, ("case", "ms/step", f"GB/s at {bytes_per_param} B/param")))
    pairs = [("a", "b"), ("a", "c"), ("a", "d"), ("a", "e"), ("a+", "d"), ("a+", "e"),
             ("e", "d"), ("a", "d*"), ("a", "e*"), ("a+", "d*"), ("e*", "d*"), ("d*", "d"),
             ("a~", "b"), ("a~", "d"), ("a'", "b"), ("a'", "c"), ("a'", "d")]
    ratios = [(f"{x}/{y}", f"{times[labels[x]] / times[labels[y]]:.3f}",
               f"{paired_ratio(samples[labels[x]], samples[labels[y]]):.3f}",
               paired_ratio_interval(samples[labels[x]], samples[labels[y]]))
              for x, y in pairs if labels[x] in times and labels[y] in times]
    print(table("ratios (lower is faster)", ratios,
                ("ratio", "of the medians", "median of the rounds' ratios", "its 95% interval")))


if __name__ == "__main__":
    sys.exit(main())
