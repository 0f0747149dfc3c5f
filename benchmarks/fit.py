"""End to end: model.fit of MLPs, pipe.keras_optimizer() vs native Keras Adam.

    python benchmarks/fit.py [--mlp 32-256-256-10 ...] [--steps N] [--repeats R] [--quick]

Each ``--mlp`` is one model shape, layer widths from the inputs to the logits.
By default two: 32-256-256-10 (77k parameters, whose optimizer is a small part of
the step) and the MNIST-shaped 784-256-256-10 (269k). Each shape's two models are
timed in their own interleaved rounds.
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import interleaved_samples, medians, paired_ratio, paired_ratio_interval, table

import gradpipe

OURS, NATIVE = "gradpipe keras_optimizer()", "keras Adam(global_clipnorm=1)"


def widths(text: str) -> list[int]:
    sizes = [int(w) for w in text.split("-")]
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: want widths such as 32-256-256-10")
    return sizes


def compare(sizes: list[int], steps: int, repeats: int) -> tuple[int, dict[str, list[float]]]:
    """Parameters, and each case's seconds per fit call of ``steps`` steps, by round."""
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 64, sizes[0])).astype("f4")
    y = rng.integers(0, sizes[-1], size=steps * 64)

    def model(optimizer):
        keras.utils.set_random_seed(0)
        layers = [keras.layers.Dense(w, activation="relu") for w in sizes[1:-1]]
        m = keras.Sequential([keras.Input((sizes[0],)), *layers, keras.layers.Dense(sizes[-1])])
        m.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
        m.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=0)  # trace outside timing
        return m

    pipe = gradpipe.build({"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 1.0},
                                          {"kind": "adam", "learning_rate": 1e-3}]})
    models = {OURS: model(pipe.keras_optimizer()),
              NATIVE: model(keras.optimizers.Adam(1e-3, global_clipnorm=1.0))}
    cases = {name: (lambda m=m: m.fit(x, y, batch_size=64, epochs=1, verbose=0))
             for name, m in models.items()}
    return models[OURS].count_params(), interleaved_samples(cases, repeats, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mlp", type=widths, action="append",
                        help="layer widths, inputs to logits (repeatable; default "
                             "32-256-256-10 and 784-256-256-10)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=101,
                        help="rounds per shape, each two fit calls (about 1 s for the "
                             "first shape here); the 95%% interval of the per-round ratio "
                             "is about +-4%% at 101, +-2%% at 501")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    shapes = args.mlp or [[32, 256, 256, 10], [784, 256, 256, 10]]
    if args.quick:
        args.steps, args.repeats = 20, 2
    times, ratios = [], []
    for sizes in shapes:
        shape = "-".join(map(str, sizes))
        params, samples = compare(sizes, args.steps, args.repeats)
        median = medians(samples)
        times += [(shape, f"{params:,}", name, f"{t:.3f}", f"{args.steps / t:.0f}")
                  for name, t in median.items()]
        ratios.append((shape, f"{median[OURS] / median[NATIVE]:.3f}",
                       f"{paired_ratio(samples[OURS], samples[NATIVE]):.3f}",
                       paired_ratio_interval(samples[OURS], samples[NATIVE])))
    print(table(f"model.fit, {args.steps} steps of batch 64, median of {args.repeats}", times,
                ("MLP", "parameters", "optimizer", "seconds", "steps/s")))
    print(table("gradpipe / keras (lower is faster)", ratios,
                ("MLP", "of the medians", "median of the rounds' ratios", "its 95% interval")))


if __name__ == "__main__":
    main()
