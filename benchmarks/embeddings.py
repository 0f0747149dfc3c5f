"""Embedding tables: one step of each update rule with a sparse gradient.

    python benchmarks/embeddings.py [--rows N] [--dim D] [--touched K] [--repeats R]
                                    [--rules adam,sgd,...] [--quick]

A table of N x D float32 (default 400,000 x 64) whose gradient touches K = 512
random rows per step (an `IndexedSlices`, as `tf.gather` gives). Per rule, in
one run, medians in milliseconds of the step in `tf.function`, each step
repeated on its own (interleaved, a dense step's sweep of the table through
the caches slows whichever small step follows it):

  dense   gradpipe, the gradient made dense first (what Keras 3 does inside);
  sparse  gradpipe, the IndexedSlices as they come: rules whose maths allows it
          (sgd without momentum, adagrad, clippy_adagrad) write only the touched
          rows; the others make the gradient dense, as Keras does;
  lazy    gradpipe with `lazy = true` (adam, adamw, nadam, adamax, lion): only the
          touched rows of the table and of its slots are read and written;
  keras   the Keras 3 optimizer, given the same IndexedSlices.

Then the ratios the docs record: lazy adam over sparse sgd, and every rule's
sparse (or lazy) step over Keras's.
"""

from __future__ import annotations

import argparse

import numpy as np
import tensorflow as tf
from _common import interleaved_samples, medians, table

import gradpipe

# rule -> (gradpipe table, Keras class and arguments, supports lazy)
RULES: dict[str, tuple[dict, tuple[str, dict] | None, bool]] = {
    "sgd": ({"kind": "sgd", "learning_rate": 0.1}, ("SGD", {"learning_rate": 0.1}), False),
    "sgd_momentum": ({"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9},
                     ("SGD", {"learning_rate": 0.1, "momentum": 0.9}), False),
    "adagrad": ({"kind": "adagrad"}, ("Adagrad", {}), False),
    "clippy_adagrad": ({"kind": "clippy_adagrad"}, None, False),
    "adam": ({"kind": "adam"}, ("Adam", {}), True),
    "adamw": ({"kind": "adamw"}, ("AdamW", {}), True),
    "nadam": ({"kind": "nadam"}, ("Nadam", {}), True),
    "adamax": ({"kind": "adamax"}, ("Adamax", {}), True),
    "lion": ({"kind": "lion"}, ("Lion", {}), True),
    "rmsprop": ({"kind": "rmsprop"}, ("RMSprop", {}), False),
    "ftrl": ({"kind": "ftrl"}, ("Ftrl", {}), False),
    "adadelta": ({"kind": "adadelta"}, ("Adadelta", {}), False),
}


def gradpipe_step(table_: dict, var: tf.Variable, grad: tf.IndexedSlices, densify: bool):
    pipe = gradpipe.build({"transforms": [table_]})
    pipe.build([var])
    given = tf.convert_to_tensor(grad) if densify else grad

    def step() -> None:  # nothing returned, as in a train step (Keras returns nothing)
        pipe.apply_gradients([(given, var)])

    return tf.function(step)


def keras_step(name: str, kwargs: dict, var: tf.Variable, grad: tf.IndexedSlices):
    import keras

    optimizer = getattr(keras.optimizers, name)(**kwargs)
    optimizer.build([var])
    def step() -> None:
        optimizer.apply_gradients([(grad, var)])

    return tf.function(step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--touched", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for CI")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats, args.rules = 2_000, 3, "sgd,adagrad,adam"
    rng = np.random.default_rng(0)
    indices = tf.constant(rng.choice(args.rows, args.touched, replace=False), tf.int64)
    values = tf.constant(rng.normal(size=(args.touched, args.dim)).astype("float32") * 1e-3)
    grad = tf.IndexedSlices(values, indices, tf.constant([args.rows, args.dim], tf.int64))
    start = rng.normal(size=(args.rows, args.dim)).astype("float32") * 0.01
    rows, times = [], {}
    for rule in args.rules.split(","):
        table_, keras_rule, lazy = RULES[rule]
        cases = {}

        def fresh() -> tf.Variable:
            return tf.Variable(start, name="embedding")

        cases["dense"] = gradpipe_step(table_, fresh(), grad, densify=True)
        cases["sparse"] = gradpipe_step(table_, fresh(), grad, densify=False)
        if lazy:
            cases["lazy"] = gradpipe_step({**table_, "lazy": True}, fresh(), grad, False)
        if keras_rule is not None:
            cases["keras"] = keras_step(*keras_rule, fresh(), grad)
        # Each step timed on its own, repeated: interleaved, a step that sweeps the
        # whole table through the caches (a dense one) would slow whichever small
        # step came next, and which one that is would decide the ratios.
        ms = {name: 1000 * medians(interleaved_samples({name: step}, args.repeats))[name]
              for name, step in cases.items()}
        times[rule] = ms
        best = ms.get("lazy", ms["sparse"])
        rows.append((rule, *(f"{ms[k]:.2f}" if k in ms else "-"
                             for k in ("dense", "sparse", "lazy", "keras")),
                     f"{best / ms['keras']:.2f}" if "keras" in ms else "-"))
    print(table(f"one step, {args.rows:,} x {args.dim} table, {args.touched} rows touched "
                f"(ms, medians of {args.repeats})", rows,
                ("rule", "dense", "sparse", "lazy", "keras", "best/keras")))
    if "adam" in times and "sgd" in times and "lazy" in times["adam"]:
        print(f"lazy adam / sparse sgd: {times['adam']['lazy'] / times['sgd']['sparse']:.2f}"
              " (goal <= 3)")


if __name__ == "__main__":
    main()
