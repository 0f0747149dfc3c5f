"""Steady step of every rule: gradpipe against Keras and against the maths' floor.

    python benchmarks/rules.py [--rules Adam,Nadam] [--repeats R] [--quick]

For each Keras optimizer class, three steps over the same 20M float32
parameters in 50 variables, timed side by side in interleaved rounds:

* gradpipe: the pipeline ``gradpipe.from_keras`` makes of the class (same
  maths), default options, in ``tf.function``;
* Keras: the class in ``tf.function``;
* floor: the class in ``tf.function(jit_compile=True)``, the maths fused by
  XLA with no guard: the bytes the rule's maths needs, moved once.

``adabelief`` is the benchmarks' third-party plugin (``_plugin.py``, written
plainly), against Keras ``Adam`` and gradpipe's built-in ``adam``.
"""

from __future__ import annotations

import argparse
import sys

from _common import interleaved_samples, paired_ratio, table
from _plugin import installed_plugin
from first_step import RULES, keras_optimizer, pipeline_table


def measure(rules: list[str], count: int, size: int, repeats: int) -> None:
    import tensorflow as tf

    import gradpipe

    grads = [tf.random.normal([size], seed=100 + i) for i in range(count)]

    def variables() -> list[tf.Variable]:
        return [tf.Variable(tf.random.normal([size], seed=i)) for i in range(count)]

    rows = []
    for rule in rules:
        cases = {}
        pipe = gradpipe.build(pipeline_table(rule))
        ours = variables()
        pipe.build(ours)
        cases["gradpipe"] = tf.function(lambda p=pipe, v=ours: p.apply_gradients(zip(grads, v)))
        for name, jit in (("keras", False), ("floor", True)):
            optimizer, theirs = keras_optimizer(rule), variables()
            optimizer.build(theirs)
            cases[name] = tf.function(
                lambda o=optimizer, v=theirs: o.apply_gradients(zip(grads, v)),
                jit_compile=jit)
        if rule == "adabelief":
            adam, mine = gradpipe.build(pipeline_table("Adam")), variables()
            adam.build(mine)
            cases["adam"] = tf.function(lambda p=adam, v=mine: p.apply_gradients(zip(grads, v)))
        samples = interleaved_samples(cases, repeats, sync=lambda r: tf.constant(0).numpy())
        ms = {name: sorted(values)[len(values) // 2] * 1e3 for name, values in samples.items()}
        versus_adam = (f"{paired_ratio(samples['gradpipe'], samples['adam']):.3f}"
                       if "adam" in samples else "")
        rows.append((rule, f"{ms['gradpipe']:.1f}", f"{ms['keras']:.1f}", f"{ms['floor']:.1f}",
                     f"{paired_ratio(samples['gradpipe'], samples['keras']):.3f}",
                     f"{paired_ratio(samples['gradpipe'], samples['floor']):.3f}",
                     versus_adam, str(pipe.plan.per_variable).split(":")[0]))
        print(rows[-1], flush=True)
        del cases, samples
    print(table(f"steady step, {count} x {size:,} float32, ms (medians of {repeats} "
                "interleaved rounds; ratios: medians of the rounds' ratios)", rows,
                ("rule", "gradpipe", "Keras", "floor", "/ Keras", "/ floor",
                 "/ built-in adam", "per variable")))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    args = parser.parse_args()
    rules = args.rules.split(",")
    if args.quick:
        rules, args.repeats = ["Adam", "adabelief"], 3
    count, size = (4, 20_000) if args.quick else (50, 400_000)
    with installed_plugin():
        measure(rules, count, size, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
