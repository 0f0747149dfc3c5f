"""Time to the first step: gradpipe against Keras, every rule, each case a fresh process.

    python benchmarks/first_step.py [--rules adam,nadam] [--rounds 3] [--quick]
                                    [--models dense,transformer,mlp,classifier]

What a user who restarts a script waits for before training runs:

* ``dense``: 50 float32 variables of 400,000 elements; the optimizer's build,
  then the first step in ``tf.function`` (trace, compile, run), synchronised.
* ``transformer``: ``model.fit`` of a 67-variable, 18.8M-parameter transformer
  encoder, the first epoch's seconds minus the second's (what tracing and
  compiling the train step adds).
* ``mlp``, ``classifier``: the same for small models, whose first epoch is
  mostly that overhead: the MNIST-shaped 784-256-256-10 MLP (269k
  parameters) and a text classifier (an embedding of 5,000 x 32 averaged over
  64 tokens, a 16-wide hidden layer, 10 logits: 161k parameters).
* ``check --plan``: ``gradpipe check FILE --plan --shapes 400000*50``, the whole
  process.

Each rule runs as the Keras class and as the pipeline ``gradpipe.from_keras``
makes of it, so both apply the same maths (``Adam+clip``: ``global_clipnorm=1.0``,
which makes a ``clip_by_global_norm`` transform); ``adabelief`` is a third-party
plugin (``_plugin.py``, installed for the run, its maths written plainly)
against Keras ``Adam``. Each case runs in a fresh process: nothing either
side traced or compiled before is reused, except what gradpipe keeps in its
cache folder (``GRADPIPE_CACHE_DIR``): the pipeline runs first with an empty
one, then again as a restarted script does (``--quick``, a smoke run of the
code at tiny sizes, runs them in this one). ``--rounds N`` runs every case N
times, interleaved, and gives each case's median: a transformer's first epoch
varies by a third from one process to the next on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import table
from _plugin import installed_plugin

RULES = ["SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adadelta", "Adamax", "Nadam",
         "Lion", "Ftrl", "Lamb", "Adafactor", "adabelief", "Adam+clip", "AdamW+clip"]
DENSE = (50, 400_000)
QUICK_DENSE = (4, 20_000)


def keras_optimizer(rule: str):  # type: ignore[no-untyped-def]
    import keras

    name, _, clip = rule.partition("+")  # "+clip": global_clipnorm=1.0, the usual recipe
    cls = getattr(keras.optimizers, "Adam" if name == "adabelief" else name)
    return cls(learning_rate=1e-3, **({"momentum": 0.9} if name == "SGD" else {}),
               **({"global_clipnorm": 1.0} if clip else {}))


def pipeline_table(rule: str) -> dict:
    import gradpipe

    if rule == "adabelief":
        return {"transforms": [{"kind": "bench_adabelief", "learning_rate": 1e-3}]}
    return gradpipe.from_keras(keras_optimizer(rule))


def first_dense_step(rule: str, side: str, quick: bool) -> float:
    import tensorflow as tf

    import gradpipe

    count, size = QUICK_DENSE if quick else DENSE
    variables = [tf.Variable(tf.random.normal([size], seed=i)) for i in range(count)]
    grads = [tf.random.normal([size], seed=100 + i) for i in range(count)]
    optimizer = (keras_optimizer(rule) if side == "keras"
                 else gradpipe.build(pipeline_table(rule)))
    start = time.perf_counter()
    optimizer.build(variables)  # Keras's build, or the pipeline's
    step = tf.function(lambda: optimizer.apply_gradients(zip(grads, variables)))
    step()
    variables[-1].numpy()
    return time.perf_counter() - start


def _tokens(vocab: int, length: int, rows: int):  # type: ignore[no-untyped-def]
    import numpy as np

    return np.random.default_rng(0).integers(0, vocab, size=(rows, length)).astype("int32")


def transformer(quick: bool, rows: int):  # type: ignore[no-untyped-def]
    """An encoder: an embedding of 12,000 x 512, four blocks of attention (8 heads)
    and a 2,048-wide feed-forward layer, each with two layer norms, and a 10-way
    classifier: 67 variables, 18.8M parameters (quick: 64 wide, vocabulary 1,000)."""
    import keras

    width, vocab, length = (64, 1_000, 8) if quick else (512, 12_000, 32)
    tokens = keras.Input((length,), dtype="int32")
    x = keras.layers.Embedding(vocab, width)(tokens)
    for _ in range(4):
        attended = keras.layers.MultiHeadAttention(8, width // 8)(x, x)
        x = keras.layers.LayerNormalization()(x + attended)
        hidden = keras.layers.Dense(4 * width, activation="relu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(width)(hidden))
    logits = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(tokens, logits), _tokens(vocab, length, rows)


def mlp(quick: bool, rows: int):  # type: ignore[no-untyped-def]
    import keras
    import numpy as np

    widths = (32, 16, 16, 10) if quick else (784, 256, 256, 10)
    model = keras.Sequential([keras.Input((widths[0],)), *(
        keras.layers.Dense(w, activation="relu") for w in widths[1:-1]),
        keras.layers.Dense(widths[-1])])
    return model, np.random.default_rng(0).normal(size=(rows, widths[0])).astype("f4")


def classifier(quick: bool, rows: int):  # type: ignore[no-untyped-def]
    import keras

    vocab = 500 if quick else 5_000
    model = keras.Sequential([keras.Input((64,), dtype="int32"),
                              keras.layers.Embedding(vocab, 32),
                              keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
    return model, _tokens(vocab, 64, rows)


def fit_overhead(rule: str, side: str, quick: bool, model_name: str) -> float:
    import keras
    import numpy as np

    import gradpipe

    keras.utils.set_random_seed(0)
    steps, batch = 5, 16
    model, x = {"transformer": transformer, "mlp": mlp,
                "classifier": classifier}[model_name](quick, steps * batch)
    optimizer = (keras_optimizer(rule) if side == "keras"
                 else gradpipe.build(pipeline_table(rule)).keras_optimizer())
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    y = np.random.default_rng(1).integers(0, 10, size=steps * batch)
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
        seconds.append(time.perf_counter() - start)
    return seconds[0] - seconds[1]


def check_plan(rule: str, quick: bool) -> float:
    count, size = QUICK_DENSE if quick else DENSE
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pipeline.json"
        path.write_text(json.dumps(pipeline_table(rule)))
        toml = Path(tmp) / "pipeline.toml"
        subprocess.run([sys.executable, "-c", (
            "import json, sys, tomli_w; sys.stdout.write(tomli_w.dumps("
            f"json.load(open({str(path)!r}))))")], check=True,
            stdout=toml.open("w"))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gradpipe.cli", "check", str(toml),
                        "--plan", "--shapes", f"{size}*{count}"], check=True,
                       capture_output=True)
        return time.perf_counter() - start


def run_case(args: list[str], cache: str = "") -> float:
    """One case in a fresh process, with ``cache`` as gradpipe's cache folder (empty:
    none); a smoke run (quick) keeps to this one."""
    if args[-1] == "1":
        return case(*args)
    out = subprocess.run([sys.executable, __file__, "--case", *args], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "GRADPIPE_CACHE_DIR": cache})
    return float(out.stdout.strip().splitlines()[-1])


def case(rule: str, model: str, side: str, quick: str) -> float:
    if side == "check":
        return check_plan(rule, quick == "1")
    if model == "dense":
        return first_dense_step(rule, side, quick == "1")
    return fit_overhead(rule, side, quick == "1", model)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--models", default="dense,transformer")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each case (median)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--case", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(case(*args.case))
        return 0
    rules, rounds = args.rules.split(","), 1 if args.quick else args.rounds
    if args.quick:  # a smoke run: one rule, the plugin, a clip, each through every path
        rules = rules[:1] + [r for r in ("adabelief", "AdamW+clip") if r in rules[1:]]
    quick = "1" if args.quick else "0"
    rows = []
    with installed_plugin(), tempfile.TemporaryDirectory() as caches:
        for model in args.models.split(","):
            # a smoke run of a fit model: its code, with one rule
            for rule in rules[:1] if args.quick and model != "dense" else rules:
                # the first start finds the maths' analyses; a restart reads them back
                runs: dict[str, list[float]] = {}
                for n in range(rounds):
                    cache = str(Path(caches) / f"{model}-{rule}-{n}")
                    for side, kept in (("first", cache), ("restart", cache), ("keras", "")):
                        runs.setdefault(side, []).append(run_case(
                            [rule, model, "keras" if side == "keras" else "gradpipe",
                             quick], kept))
                first, ours, theirs = (statistics.median(runs[side])
                                       for side in ("first", "restart", "keras"))
                check = (f"{run_case([rule, model, 'check', quick], cache):.2f}"
                         if model == "dense" and not (args.quick and rows) else "")
                rows.append((model, rule, f"{first:.2f}", f"{ours:.2f}", f"{theirs:.2f}",
                             f"{first / theirs:.2f}", f"{ours / theirs:.2f}", check))
                print(rows[-1], flush=True)
    count, size = QUICK_DENSE if args.quick else DENSE
    print(table(f"time to the first step, seconds, each case a fresh process (dense: "
                f"{count} x {size:,} float32; the models: fit's first epoch minus its "
                "second; restart: a new process, gradpipe's cache folder kept)", rows,
                ("model", "rule", "gradpipe first", "gradpipe restart", "Keras",
                 "ratio first", "ratio restart", "check --plan (restart)")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
