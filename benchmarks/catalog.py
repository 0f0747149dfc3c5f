"""Steady step of the rules from optax and TF Addons: gradpipe against their maths fused.

    python benchmarks/catalog.py [--kinds cocob,lookahead] [--repeats R] [--quick]

Neither reference runs here (optax is JAX; TF Addons does not import on
TensorFlow 2.21). For each kind, three steps over the same 20M float32
parameters in 50 variables, timed side by side in interleaved rounds:

* gradpipe: the pipeline in ``tf.function``, default options (guard included);
* fused: the floor, the same transforms' maths (``gradpipe.create``) on the
  variables in one ``tf.function(jit_compile=True)``, with no engine and no
  guard: XLA fuses it, so it moves the bytes the maths needs, once;
* kernel (``proximal_adagrad`` only): ``ResourceApplyProximalAdagrad``, the
  op TF Addons' class called, so TF Addons' own step.

The wrappers wrap ``adam``; "/ adam" is their cost over gradpipe's ``adam``.
"""

from __future__ import annotations

import argparse
import sys

from _common import interleaved_samples, paired_ratio, table

OPTAX = ["adabelief", "amsgrad", "yogi", "radam", "sign_sgd", "signum", "nadamw", "adamaxw",
         "adan", "rprop", "optimistic_gradient_descent", "fromage", "novograd", "sm3",
         "noisy_sgd"]
TABLES = {
    **{kind: [{"kind": kind}] for kind in OPTAX},
    "cocob": [{"kind": "cocob"}],
    "proximal_adagrad": [{"kind": "proximal_adagrad"}],
    "conditional_gradient": [{"kind": "conditional_gradient", "learning_rate": 0.9}],
    "lookahead": [{"kind": "adam"}, {"kind": "lookahead"}],
    "moving_average": [{"kind": "adam"}, {"kind": "moving_average"}],
    "swa": [{"kind": "adam"}, {"kind": "swa", "average_period": 2}],
}


def fused_step(tables: list[dict], variables: list, grads: list):  # type: ignore[no-untyped-def]
    """The transforms' own maths on ``variables``, in one XLA-compiled function."""
    import tensorflow as tf

    import gradpipe

    chain = [gradpipe.create("transform", t) for t in tables]
    states = [tf.nest.map_structure(tf.Variable, t.init(variables)) for t in chain]

    @tf.function(jit_compile=True)
    def step():  # type: ignore[no-untyped-def]
        values = list(grads)
        for transform, state in zip(chain, states):
            old = tf.nest.map_structure(lambda v: v.read_value(), state)
            values, new = transform.update(values, old, variables)
            tf.nest.map_structure(lambda v, value: v.assign(value), state, new)
        for var, update in zip(variables, values):
            var.assign_sub(update)

    return step


def kernel_step(variables: list, grads: list):  # type: ignore[no-untyped-def]
    """TF Addons' ProximalAdagrad step: the kernel its class called."""
    import tensorflow as tf

    accs = [tf.Variable(tf.fill(v.shape, 0.1)) for v in variables]

    @tf.function
    def step():  # type: ignore[no-untyped-def]
        for w, acc, g in zip(variables, accs, grads):
            tf.raw_ops.ResourceApplyProximalAdagrad(
                var=w.handle, accum=acc.handle, lr=tf.constant(1e-3), l1=tf.constant(0.0),
                l2=tf.constant(0.0), grad=g)

    return step


def measure(kinds: list[str], count: int, size: int, repeats: int) -> None:
    import tensorflow as tf

    import gradpipe

    grads = [tf.random.normal([size], seed=100 + i) * 1e-2 for i in range(count)]

    def variables() -> list[tf.Variable]:
        return [tf.Variable(tf.random.normal([size], seed=i)) for i in range(count)]

    def pipeline(transforms: list[dict]):  # type: ignore[no-untyped-def]
        pipe, mine = gradpipe.build({"transforms": transforms}), variables()
        pipe.build(mine)
        return tf.function(lambda: pipe.apply_gradients(zip(grads, mine)))

    rows = []
    for kind in kinds:
        cases = {"gradpipe": pipeline(TABLES[kind]),
                 "fused": fused_step(TABLES[kind], variables(), grads)}
        if kind == "proximal_adagrad":
            cases["kernel"] = kernel_step(variables(), grads)
        if TABLES[kind][0]["kind"] == "adam":
            cases["adam"] = pipeline([{"kind": "adam"}])
        samples = interleaved_samples(cases, repeats, sync=lambda r: tf.constant(0).numpy())
        ms = {name: sorted(values)[len(values) // 2] * 1e3 for name, values in samples.items()}

        ratios = {other: f"{paired_ratio(samples['gradpipe'], samples[other]):.3f}"
                  for other in ("fused", "kernel", "adam") if other in samples}
        rows.append((kind, f"{ms['gradpipe']:.1f}", f"{ms['fused']:.1f}", ratios["fused"],
                     ratios.get("kernel", ""), ratios.get("adam", "")))
        print(rows[-1], flush=True)
    print(table(f"steady step, {count} x {size:,} float32, ms (medians of {repeats} "
                "interleaved rounds; ratios: medians of the rounds' ratios)", rows,
                ("kind", "gradpipe", "fused", "/ fused", "/ kernel", "/ adam")))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kinds", default=",".join(TABLES))
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if args.quick:  # one rule of each family and a wrapper
        kinds, args.repeats = ["adan", "proximal_adagrad", "lookahead"], 3
    count, size = (3, 10_000) if args.quick else (50, 400_000)
    measure(kinds, count, size, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
