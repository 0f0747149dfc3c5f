"""End to end: model.fit of a small MLP, pipe.keras_optimizer() vs native Keras Adam.

    python benchmarks/fit.py [--steps N] [--repeats R] [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import interleaved_samples, medians, paired_ratio, paired_ratio_interval, table

import gradpipe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=101,
                        help="rounds, each two fit calls (about 1 s here); the 95%% interval "
                             "of the per-round ratio is about +-4%% at 101, +-2%% at 501")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 20, 2
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.steps * 64, 32)).astype("f4")
    y = rng.integers(0, 10, size=args.steps * 64)

    def model(optimizer):
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
        m.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
        m.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=0)  # trace outside timing
        return m

    pipe = gradpipe.build({"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                                          {"kind": "adam", "learning_rate": 1e-3}]})
    models = {"gradpipe keras_optimizer()": model(pipe.keras_optimizer()),
              "keras Adam(global_clipnorm=1)": model(keras.optimizers.Adam(
                  1e-3, global_clipnorm=1.0))}
    cases = {name: (lambda m=m: m.fit(x, y, batch_size=64, epochs=1, verbose=0))
             for name, m in models.items()}
    samples = interleaved_samples(cases, args.repeats, warmup=1)
    times = medians(samples)
    rows = [(name, f"{t:.3f}", f"{args.steps / t:.0f}") for name, t in times.items()]
    print(table(f"model.fit, {args.steps} steps of batch 64, median of {args.repeats}", rows,
                ("optimizer", "seconds", "steps/s")))
    ours, native = "gradpipe keras_optimizer()", "keras Adam(global_clipnorm=1)"
    print(table("ratio (lower is faster)", [(
        "gradpipe / keras", f"{times[ours] / times[native]:.3f}",
        f"{paired_ratio(samples[ours], samples[native]):.3f}",
        paired_ratio_interval(samples[ours], samples[native]))],
        ("ratio", "of the medians", "median of the rounds' ratios", "its 95% interval")))


if __name__ == "__main__":
    main()
