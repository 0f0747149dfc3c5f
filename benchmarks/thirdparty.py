"""Third-party benchmark: a plugin's transform against a built-in moving the same bytes.

    python benchmarks/thirdparty.py            # 20M parameters in 50 variables
    python benchmarks/thirdparty.py --small    # 2,000 variables of 1-10k parameters
    python benchmarks/thirdparty.py --quick    # tiny sizes, for a smoke run

A real plugin (``_plugin.py``): a small distribution installed with pip into
this environment for the run, found by gradpipe through its entry point. Its
transforms are written as the plugin guide writes one (a config, a factory,
``init``/``update``, nothing declared):

* ``bench_scale``: ``g * factor``, stateless;
* ``bench_ema``: ``m = decay * m + g``, the update ``m``, stateful.

Measured side by side in one run (interleaved rounds, medians), with dynamic
loss scaling and the default options:

* stateless: ``clip_by_global_norm -> bench_scale -> adam`` against
  ``clip_by_global_norm -> clip_by_value -> adam`` (a built-in that reads and
  writes the gradients once, as a scale does);
* stateful: ``bench_ema -> sgd`` against ``sgd`` with momentum (both read the
  gradient, the momentum and the variable, and write the last two);
* what the finite guarantee costs: the plugin pipelines with ``check_updates =
  false`` against the default.

The plan of every pipeline is printed (compiled, packed, in place, checked).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from _common import interleaved_samples, medians, paired_ratio, paired_ratio_interval, table
from _plugin import DIST, installed_plugin


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=20_000_000)
    parser.add_argument("--variables", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds (default 31; 7 with --small)")
    parser.add_argument("--small", action="store_true", help="many small variables")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    args = parser.parse_args()
    with installed_plugin():
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    import tensorflow as tf

    import gradpipe
    from gradpipe.registry import get_registry

    provider = get_registry().get("transform", "bench_scale").provider
    assert provider.dist == DIST, provider  # the installed plugin, through its entry point
    if args.quick:
        args.params, args.repeats = 80_000, 3
        args.variables = args.variables or (16 if args.small else 4)
    if args.repeats is None:
        args.repeats = 7 if args.small else 31
    if args.small:
        rng = np.random.default_rng(0)
        sizes = [int(n) for n in rng.integers(1_000, 10_001, size=args.variables or 2000)]
    else:
        count = args.variables or 50
        sizes = [args.params // count] * count
    grads = [tf.constant(np.random.default_rng(1).normal(size=n).astype("f4"))
             for n in sizes]

    clip = {"kind": "clip_by_global_norm", "clip_norm": 1.0}
    adam = {"kind": "adam", "learning_rate": 1e-3}
    pipelines = {
        "scale":      [clip, {"kind": "bench_scale", "factor": 0.5}, adam],
        "scale, built-in": [clip, {"kind": "clip_by_value", "clip_value_min": -1e30,
                                   "clip_value_max": 1e30}, adam],
        "scale, unchecked": [clip, {"kind": "bench_scale", "factor": 0.5}, adam],
        "ema":        [{"kind": "bench_ema", "decay": 0.9},
                       {"kind": "sgd", "learning_rate": 1e-3}],
        "ema, built-in": [{"kind": "sgd", "learning_rate": 1e-3, "momentum": 0.9}],
        "ema, unchecked": [{"kind": "bench_ema", "decay": 0.9},
                           {"kind": "sgd", "learning_rate": 1e-3}],
    }
    cases, plans = {}, {}
    for name, transforms in pipelines.items():
        variables = [tf.Variable(tf.zeros([n])) for n in sizes]
        pipe = gradpipe.build({"loss_scale": {"kind": "dynamic"}, "transforms": transforms,
                               "pipeline": {"check_updates": "unchecked" not in name}})
        pipe.build(variables)
        plans[name] = pipe.plan
        cases[name] = tf.function(
            lambda p=pipe, v=variables: p.apply_gradients(zip(grads, v)))
    samples = interleaved_samples(cases, args.repeats, sync=lambda r: tf.constant(0).numpy())
    times = medians(samples)
    title = (f"third-party benchmark: {sum(sizes):,} float32 parameters in {len(sizes)} "
             f"variables, median of {args.repeats} interleaved rounds")
    print(table(title, [(name, f"{t * 1e3:.2f}", _path(plans[name]))
                        for name, t in times.items()], ("pipeline", "ms/step", "path")))
    pairs = [("scale", "scale, built-in", "<= 1.3"), ("ema", "ema, built-in", "<= 1.5"),
             ("scale", "scale, unchecked", "guard"), ("ema", "ema, unchecked", "guard")]
    print(table("ratios (plugin over built-in; checked over unchecked)", [
        (f"{x} / {y}", f"{times[x] / times[y]:.3f}",
         f"{paired_ratio(samples[x], samples[y]):.3f}",
         paired_ratio_interval(samples[x], samples[y]), goal)
        for x, y, goal in pairs],
        ("ratio", "of the medians", "median of the rounds' ratios", "its 95% interval",
         "goal")))
    for name, plan in plans.items():
        print(f"\n{name}:\n{plan}")
    return 0


def _path(plan: Any) -> str:
    path = ("compiled" if plan.compile.on else "in place" if plan.in_place.on
            else "plain")
    return path + ", packed" * plan.pack.on


if __name__ == "__main__":
    sys.exit(main())
