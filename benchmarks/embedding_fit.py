"""A recommender in ``model.fit``: time per epoch and peak memory, each case a fresh process.

    python benchmarks/embedding_fit.py [--users N] [--items N] [--steps N] [--quick]

The model a Keras user moves over: user and item embeddings (200,000 and 50,000
rows of 64), concatenated into a 64-wide ReLU layer and one output, trained on
synthetic ratings with mean squared error, batches of 256. Cases: Keras
``Adam``; the pipeline ``gradpipe.from_keras`` makes of it (the same maths:
the embeddings' sparse gradients update every row, as in Keras); and that
pipeline with ``lazy = true`` (only the rows a batch touches). Each runs in a
fresh process and reports the seconds of its second epoch (the first also
traces and compiles), the loss after both (gradpipe's differs from Keras's
where a batch names a row twice: gradpipe steps as the dense gradient does,
Keras 3 squares each repeat apart), and the growth of the process's peak
resident memory over what it held once the model and data were built: what
training adds, the optimizer state included.
``--quick`` is a smoke run at tiny sizes, every case in this process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from _common import table

CASES = ("keras", "gradpipe", "gradpipe-lazy")


def run_case(case: str, users: int, items: int, steps: int) -> dict:
    import resource
    import time

    import keras
    import numpy as np

    import gradpipe

    keras.utils.set_random_seed(0)
    user, item = keras.Input((1,), dtype="int32"), keras.Input((1,), dtype="int32")
    u = keras.layers.Flatten()(keras.layers.Embedding(users, 64)(user))
    i = keras.layers.Flatten()(keras.layers.Embedding(items, 64)(item))
    hidden = keras.layers.Dense(64, activation="relu")(keras.layers.Concatenate()([u, i]))
    model = keras.Model([user, item], keras.layers.Dense(1)(hidden))
    rng = np.random.default_rng(0)
    n = steps * 256
    data = [rng.integers(0, users, (n, 1)).astype("int32"),
            rng.integers(0, items, (n, 1)).astype("int32")]
    ratings = rng.normal(3.0, 1.0, (n, 1)).astype("float32")
    optimizer = keras.optimizers.Adam(1e-3)
    if case != "keras":  # the same maths as Keras's Adam, and lazy where asked
        pipeline = gradpipe.from_keras(optimizer)
        pipeline["transforms"][-1]["lazy"] = case.endswith("lazy")
        optimizer = gradpipe.build(pipeline).keras_optimizer()
    model.compile(optimizer=optimizer, loss="mse")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds, losses = [], []
    for _ in range(2):
        start = time.perf_counter()
        history = model.fit(data, ratings, batch_size=256, epochs=1, verbose=0,
                            shuffle=False)
        seconds.append(time.perf_counter() - start)
        losses.append(history.history["loss"][-1])
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    return {"second_epoch": seconds[1], "first_epoch": seconds[0], "loss": losses[-1],
            "peak_growth_mib": grown / 1024}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--steps", type=int, default=200, help="batches per epoch")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.users, args.items, args.steps = 1_000, 500, 4
    if args.case:
        print(json.dumps(run_case(args.case, args.users, args.items, args.steps)))
        return 0
    results = {}
    for case in CASES:
        if args.quick:  # one process: the peak memory is the first case's
            results[case] = run_case(case, args.users, args.items, args.steps)
            continue
        out = subprocess.run([sys.executable, __file__, "--case", case, "--users",
                              str(args.users), "--items", str(args.items), "--steps",
                              str(args.steps)], check=True, capture_output=True, text=True)
        results[case] = json.loads(out.stdout.strip().splitlines()[-1])
        print(case, results[case], flush=True)
    keras_epoch = results["keras"]["second_epoch"]
    rows = [(case, f"{r['second_epoch']:.2f}", f"{r['second_epoch'] / keras_epoch:.2f}",
             f"{r['first_epoch']:.2f}", f"{r['loss']:.4f}", f"{r['peak_growth_mib']:.0f}")
            for case, r in results.items()]
    where = "one process" if args.quick else "each case a fresh process"
    print(table(f"model.fit of a recommender ({args.users:,} and {args.items:,} embedding "
                f"rows of 64), {args.steps} batches of 256 an epoch, {where}", rows,
                ("case", "epoch 2, s", "/ Keras", "epoch 1, s", "loss", "peak growth, MiB")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
