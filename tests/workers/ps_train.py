"""A parameter-server run: real servers on localhost, this process the coordinator.

Usage: python ps_train.py SCENARIO [OPTIONS] -- prints one JSON line of results.
Each scenario first trains the same model in one process (no cluster yet) where it
compares against one, then starts the cluster (``gradpipe.distribute.local_cluster``,
or the addresses in ``--workers``/``--ps`` of servers started by ``gradpipe serve``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np

from gradpipe._lean_import import without_keras_extras  # 3 s less to start, as the CLI

with without_keras_extras():
    import keras
    import tensorflow as tf

import gradpipe

ROWS, DIM, STEPS = 1000, 8, 20
rng = np.random.default_rng(0)
X = rng.integers(0, ROWS, size=(STEPS, 16, 4)).astype("int32")
Y = rng.normal(size=(STEPS, 16, 1)).astype("f4")


def make_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((4,), dtype="int32"),
                             keras.layers.Embedding(ROWS, DIM, name="embedding"),
                             keras.layers.Flatten(), keras.layers.Dense(1, name="dense")],
                            name="model")


def loss_of(model: keras.Model, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean((model(x) - y) ** 2)


def pipeline(args: argparse.Namespace, placement: dict | None = None) -> gradpipe.Pipeline:
    table = {"transforms": [{"kind": "clip_by_global_norm", "clip_norm": 0.5},
                            {"kind": args.rule, "learning_rate": args.lr, "lazy": args.lazy}]}
    if args.rule != "adam":
        del table["transforms"][1]["lazy"]
    if args.loss_scale:
        table["loss_scale"] = {"kind": "dynamic", "initial_loss_scale": 1024.0}
    if placement:
        table["placement"] = placement
    return gradpipe.build(table)


def values(variables: list) -> list[np.ndarray]:
    """Each variable's whole value, its shards joined."""
    out = []
    for var in variables:
        parts = gradpipe.distribute.shards_of(var)
        out.append(np.concatenate([s.numpy() for s in parts]) if parts else
                   np.asarray(var.numpy() if hasattr(var, "numpy") else var))
    return out


def single_process(args: argparse.Namespace) -> list[np.ndarray]:
    model, pipe = make_model(), pipeline(args)
    step = make_step(model, pipe, on_workers=False)
    for i in range(args.steps):
        step(X[i % STEPS], Y[i % STEPS])
    return values(model.trainable_variables)


def make_step(model: keras.Model, pipe: gradpipe.Pipeline, on_workers: bool = True,
              whole: bool = False) -> Any:
    """One step of the scaled loss, its gradients taken for the shards and applied;
    returns whether it was applied. On the workers, inside ``strategy.run``. With
    ``whole``, each sharded variable's gradient is joined into one for the Keras
    variable before it is applied (the pipeline splits it again)."""
    sources = gradpipe.distribute.gradient_sources(model.trainable_variables)

    def replica(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = pipe.scale_loss(loss_of(model, x, y))
        grads = tape.gradient(loss, sources)
        pairs = joined(model, grads) if whole else list(zip(grads, sources))
        return pipe.apply_gradients(pairs)

    return tf.function(lambda x, y: pipe.strategy.run(replica, args=(x, y)) if on_workers
                       else replica(x, y))


def cluster(args: argparse.Namespace) -> dict:
    if args.workers:
        return {"workers": args.workers, "ps": args.ps}
    resolver = gradpipe.distribute.local_cluster(workers=args.n_workers, ps=2)
    spec = resolver.cluster_spec().as_dict()
    return {"workers": spec["worker"], "ps": spec["ps"]}


def joined(model: keras.Model, grads: list) -> list[tuple]:
    """(gradient, Keras variable) pairs, the shards' gradients of each sharded
    variable joined into one: rows concatenated, or their indices offset."""
    pairs, grads = [], iter(grads)
    for var in model.trainable_variables:
        parts = gradpipe.distribute.shards_of(var) or [var]
        mine = [next(grads) for _ in parts]
        if len(parts) == 1:
            pairs.append((mine[0], var))
            continue
        offsets = np.cumsum([0] + [int(p.shape[0]) for p in parts[:-1]])
        pairs.append((tf.IndexedSlices(
            tf.concat([g.values for g in mine], 0),
            tf.concat([g.indices + int(o) for g, o in zip(mine, offsets)], 0),
            tf.constant(list(var.shape), mine[0].indices.dtype)), var))
    return pairs


def distributed(args: argparse.Namespace, out: dict) -> list[np.ndarray]:
    if args.own_strategy:  # the user's strategy, the pipeline's default placement
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(1024, 2)
        strategy = tf.distribute.ParameterServerStrategy(
            gradpipe.distribute.local_cluster(workers=1, ps=2),
            variable_partitioner=partitioner)
        with strategy.scope():
            pipe = pipeline(args)
    else:
        pipe = pipeline(args, {"kind": "parameter_server", "min_shard_bytes": 1024,
                               **cluster(args)})
    strategy = pipe.strategy
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = make_model()
    # a model's variables as Keras holds them, or the shards the tape is given
    pipe.build(gradpipe.distribute.gradient_sources(model.trainable_variables)
               if args.build_with_shards else model.trainable_variables)
    out["plan"] = str(pipe.plan)
    out["placement"] = pipe.placement.description if pipe.placement else ""
    out["shards"] = {v.path: len(gradpipe.distribute.shards_of(v) or [v])
                     for v in model.trainable_variables}
    out["colocated"] = colocation(pipe, model)
    before = {n: values([v])[0] for n, v in pipe.named_variables().items()}
    step = make_step(model, pipe, whole=args.whole_gradients)

    if args.scenario == "nonfinite":
        weights = values(model.trainable_variables)
        coordinator.schedule(step, args=(tf.constant(X[0]), tf.constant(Y[0] * np.nan)))
        coordinator.join()
        after = {n: values([v])[0] for n, v in pipe.named_variables().items()}
        out["changed"] = sorted(n for n in after if not np.array_equal(
            after[n], before[n], equal_nan=True))
        out["weights_unchanged"] = all(np.array_equal(a, b) for a, b in
                                       zip(weights, values(model.trainable_variables)))
    for i in range(args.steps):
        coordinator.schedule(step, args=(tf.constant(X[i % STEPS]),
                                         tf.constant(Y[i % STEPS])))
    coordinator.join()
    out["iterations"] = int(pipe.iterations.numpy())
    out["skipped"] = int(pipe.skipped_steps.numpy())
    out["loss_scale"] = float(pipe.loss_scale.numpy())
    return values(model.trainable_variables)


def checkpoints(args: argparse.Namespace, out: dict) -> None:
    """One process saves, a cluster of 2 shards restores and trains, 3 shards and a
    process without shards restore that: each must equal what was saved."""
    folder = args.directory

    def saved_state(model: keras.Model, pipe: gradpipe.Pipeline) -> dict:
        state = {f"weights/{v.path}": values([v])[0] for v in model.weights}
        state.update({n: values([v])[0] for n, v in pipe.named_variables().items()})
        return state

    def restore(path: str, model: keras.Model, pipe: gradpipe.Pipeline, expected: dict
                ) -> float:
        pipe.build(model.trainable_variables)
        tf.train.Checkpoint(model=gradpipe.distribute.weights_by_path(model),
                            pipeline=pipe).restore(path).assert_consumed()
        state = saved_state(model, pipe)
        assert sorted(state) == sorted(expected), (sorted(state), sorted(expected))
        return max(float(np.abs(state[k] - expected[k]).max()) for k in expected)

    def manager(model: keras.Model, pipe: gradpipe.Pipeline, where: str) -> Any:
        checkpoint = tf.train.Checkpoint(model=gradpipe.distribute.weights_by_path(model),
                                         pipeline=pipe)
        return tf.train.CheckpointManager(checkpoint, f"{folder}/{where}", max_to_keep=2)

    model, pipe = make_model(), pipeline(args)
    train(model, pipe, None, 3)
    single = manager(model, pipe, "single").save()
    expected = saved_state(model, pipe)
    addresses, sharded = cluster(args), ""
    out["restored"] = {}
    for shards, source in ((2, single), (3, None)):
        pipe = pipeline(args, {"kind": "parameter_server", "shards": shards, **addresses})
        with pipe.strategy.scope():
            model = make_model()
        out["restored"][f"{shards} shards"] = restore(source or sharded, model, pipe, expected)
        out.setdefault("shards", []).append(len(gradpipe.distribute.shards_of(
            model.get_layer("embedding").embeddings)))
        if source:  # train on, save from the coordinator: what the next restores
            train(model, pipe, tf.distribute.coordinator.ClusterCoordinator(pipe.strategy), 3)
            sharded = manager(model, pipe, "sharded").save()
            expected = saved_state(model, pipe)
    model, pipe = make_model(), pipeline(args)
    out["restored"]["one process"] = restore(sharded, model, pipe, expected)


def train(model: keras.Model, pipe: gradpipe.Pipeline, coordinator: Any, steps: int) -> None:
    """``steps`` steps, scheduled on the cluster's workers where a coordinator is given."""
    step = make_step(model, pipe, on_workers=coordinator is not None)

    for i in range(steps):
        batch = (tf.constant(X[i % STEPS]), tf.constant(Y[i % STEPS]))
        if coordinator:
            coordinator.schedule(step, args=batch)
        else:
            step(*batch)
    if coordinator:
        coordinator.join()


def resume(args: argparse.Namespace, out: dict) -> None:
    """Train to ``--steps`` on the cluster at ``--workers``/``--ps``, from the latest
    checkpoint in ``--directory`` if there is one, saving every ``--every`` steps.
    Step i always takes batch i, so a run resumed from a checkpoint retraces an
    uninterrupted one."""
    reference = single_process(args)
    pipe = pipeline(args, {"kind": "parameter_server", "min_shard_bytes": 1024,
                           **cluster(args)})
    with pipe.strategy.scope():
        model = make_model()
    pipe.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=gradpipe.distribute.weights_by_path(model),
                                     pipeline=pipe)
    manager = tf.train.CheckpointManager(checkpoint, args.directory, max_to_keep=2)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_consumed()
    out["resumed_at"] = done = int(pipe.iterations.numpy())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(pipe.strategy)
    step = make_step(model, pipe)

    while done < args.steps:
        for i in range(done, min(done + args.every, args.steps)):
            coordinator.schedule(step, args=(tf.constant(X[i % STEPS]),
                                              tf.constant(Y[i % STEPS])))
        coordinator.join()
        done = int(pipe.iterations.numpy())
        manager.save(checkpoint_number=done)
        print(f"saved {done}", flush=True)
        if done == args.every:  # the test kills a task during this first pause
            time.sleep(args.pause)
    out["iterations"] = done
    out["scalars"] = {n: float(v.numpy()) for n, v in pipe.named_variables().items()
                      if v.shape.rank == 0}
    trained = values(model.trainable_variables)
    out["max_difference"] = max(float(np.abs(a - b).max()) for a, b in
                                zip(reference, trained))
    out["loss"] = mean_loss(trained)
    out["single_process_loss"] = mean_loss(reference)
    out["initial_loss"] = mean_loss(make_model().get_weights())


def mean_loss(weights: list[np.ndarray]) -> float:
    """The loss over all batches of a model with these weights, in this process."""
    local = make_model()
    local.set_weights(weights)
    return float(np.mean([loss_of(local, X[i], Y[i]) for i in range(STEPS)]))


def refusals(args: argparse.Namespace, out: dict) -> None:
    """What a cluster refuses to build, and what it builds instead."""
    addresses = cluster(args)
    cases = {"clip_by_norm": [{"kind": "clip_by_norm", "clip_norm": 1.0},
                              {"kind": "adam"}],
             "clip_by_norm excluding the table": [
                 {"kind": "clip_by_norm", "clip_norm": 1.0, "exclude": ["embedding"]},
                 {"kind": "adam"}],
             "lamb": [{"kind": "lamb"}],
             "jit_compile": [{"kind": "adam"}]}
    out["errors"] = {}
    for name, transforms in cases.items():
        table = {"placement": {"kind": "parameter_server", "min_shard_bytes": 1024,
                               **addresses}, "transforms": transforms}
        if name == "jit_compile":
            table["pipeline"] = {"jit_compile": True}
        pipe = gradpipe.build(table)
        with pipe.strategy.scope():
            model = make_model()
        try:
            pipe.build(model.trainable_variables)
            out["errors"][name] = None
        except gradpipe.PlacementError as exc:
            out["errors"][name] = str(exc)


def colocation(pipe: gradpipe.Pipeline, model: keras.Model) -> bool:
    """Whether every per-variable state variable lives on its variable's server(s)."""
    devices = {}
    for var in model.trainable_variables:
        parts = gradpipe.distribute.shards_of(var) or [var.value]
        devices[var.path.replace("/", ".")] = [p.device for p in parts]
    for name, state in pipe.named_variables().items():
        owner = name.rsplit("/", 1)[-1]
        if owner in devices:
            parts = gradpipe.distribute.shards_of(state) or [state]
            if [p.device for p in parts] != devices[owner]:
                return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("train", "nonfinite", "checkpoints",
                                             "refusals", "resume"))
    parser.add_argument("--directory", default="")
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds to wait after the first checkpoint")
    parser.add_argument("--rule", default="adam")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lazy", action="store_true")
    parser.add_argument("--own-strategy", action="store_true")
    parser.add_argument("--build-with-shards", action="store_true")
    parser.add_argument("--whole-gradients", action="store_true")
    parser.add_argument("--loss-scale", action="store_true")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--n-workers", type=int, default=1)
    parser.add_argument("--workers", nargs="*", default=[])
    parser.add_argument("--ps", nargs="*", default=[])
    args = parser.parse_args()
    out: dict = {}
    if args.scenario in ("checkpoints", "refusals", "resume"):
        {"checkpoints": checkpoints, "refusals": refusals,
         "resume": resume}[args.scenario](args, out)
        print(json.dumps(out), flush=True)
        os._exit(0)
    reference = single_process(args) if args.n_workers == 1 else None
    result = distributed(args, out)
    out["loss"] = mean_loss(result)
    if reference is not None:
        out["max_difference"] = max(float(np.abs(a - b).max())
                                    for a, b in zip(reference, result))
    print(json.dumps(out), flush=True)
    os._exit(0)  # the servers in this process would otherwise wait for each other


if __name__ == "__main__":
    main()
